"""One request as the scheduler sees it: tokens, status, KV blocks and counters."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from structgen.errors import BackendError
from structgen.runtime.radix_cache import RadixNode

__all__ = ["SeqState", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    """WAITING: queued for prefill; RUNNING: has KV and decodes; FINISHED: done (or failed)."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class SeqState:
    """A sequence of token ids and the KV bookkeeping the scheduler keeps for it.

    ``blocks`` hold the KV of tokens ``0 .. kv_len-1``; the first ``num_tree_blocks`` of
    them belong to the radix tree (reused from the cache, protected by locking ``node``),
    the rest belong to this sequence until it finishes or is preempted. ``payload`` is
    opaque to the runtime (sampling parameters, stop strings, a constraint matcher).
    """

    seq_id: Hashable
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    payload: Any = None
    status: SequenceStatus = SequenceStatus.WAITING
    #: the locked radix node ending the reused prefix (None while not running)
    node: RadixNode | None = None
    blocks: list[int] = field(default_factory=list)
    num_tree_blocks: int = 0
    #: tokens whose KV is in ``blocks``
    kv_len: int = 0
    #: tokens reused from the cache at the latest admission
    cached_prefix_len: int = 0
    #: prompt/prefix tokens reused from the cache, summed over admissions
    cached_tokens: int = 0
    #: tokens whose KV the model computed, summed over forward passes
    computed_tokens: int = 0
    #: output tokens appended without sampling (e.g. a constraint's forced run)
    forced_tokens: int = 0
    num_preemptions: int = 0
    #: prefill batches formed without this sequence while it waited (anti-starvation)
    times_skipped: int = 0
    #: FCFS order, set by the scheduler on :meth:`Scheduler.add`
    arrival: int = -1
    finish_reason: str | None = None
    error: BackendError | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"sequence {self.seq_id!r} has an empty prompt")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt then output token ids."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output length."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Output length."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """Whether the sequence is FINISHED (successfully or with ``error``)."""
        return self.status is SequenceStatus.FINISHED

    def append(self, token_id: int, *, forced: bool = False) -> None:
        """Append one output token (its KV is computed in the next forward pass)."""
        self.output_token_ids.append(token_id)
        if forced:
            self.forced_tokens += 1
