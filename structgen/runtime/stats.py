"""Counters a scheduler keeps over its lifetime."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulerStats"]


@dataclass
class SchedulerStats:
    """Counters over the scheduler's lifetime."""

    prompt_tokens: int = 0
    #: prompt/prefix tokens reused from the radix cache at admission
    cached_tokens: int = 0
    #: tokens computed by prefill batches
    prefill_computed_tokens: int = 0
    #: tokens computed by decode batches (one per sequence per step, plus forced runs)
    decode_computed_tokens: int = 0
    forced_tokens: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    evicted_tokens: int = 0
    finished: int = 0
    failed: int = 0

    @property
    def computed_tokens(self) -> int:
        """Tokens whose KV the model computed."""
        return self.prefill_computed_tokens + self.decode_computed_tokens

    @property
    def steps(self) -> int:
        """Forward passes (prefill plus decode batches)."""
        return self.prefill_steps + self.decode_steps

    @property
    def cache_hit_rate(self) -> float:
        """Share of admitted prefill tokens reused from the cache (0.0 before any)."""
        seen = self.cached_tokens + self.prefill_computed_tokens
        return self.cached_tokens / seen if seen else 0.0
