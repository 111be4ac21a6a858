"""Turning one step's logits into a token: penalties, constraint mask, temperature,
top-k / top-p / min-p truncation, and seeded sampling.

Log-probabilities reported to users are those of the model's own distribution at that
step (``log_softmax`` of the raw logits, before penalties, mask and temperature), like
an engine's ``return_logprob``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from structgen.backend import SamplingParams

__all__ = ["Sampler", "unpack_bitmask"]

_BITS = torch.tensor([1 << i for i in range(31)] + [-(1 << 31)], dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """A bool ``[vocab]`` tensor from one int32 bitmask row (bit ``t%32`` of word ``t//32``)."""
    bits = (bitmask.reshape(-1, 1) & _BITS) != 0
    flat = bits.reshape(-1)
    if flat.numel() >= vocab:
        return flat[:vocab]
    return torch.cat([flat, torch.zeros(vocab - flat.numel(), dtype=torch.bool)])


@dataclass
class Sampler:
    """Per-sequence sampling state (token counts for penalties, the RNG)."""

    params: SamplingParams
    vocab: int
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        p = self.params
        self._penalize = bool(p.frequency_penalty or p.presence_penalty)
        self._counts = torch.zeros(self.vocab, dtype=torch.float32) if self._penalize else None
        if p.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(int(p.seed))

    def choose(self, logits: torch.Tensor, allowed: torch.Tensor | None = None,
               banned: list[int] | None = None) -> int:
        """Pick the next token from ``logits`` ``[vocab]`` (float32, CPU, modified in place).

        ``allowed`` is the constraint's bool mask; ``banned`` lists token ids forbidden
        this step (EOS before ``min_new_tokens``, EOS while a constraint is incomplete).
        """
        p = self.params
        if self._counts is not None:
            if p.frequency_penalty:
                logits -= p.frequency_penalty * self._counts
            if p.presence_penalty:
                logits -= p.presence_penalty * (self._counts > 0).float()
        if allowed is not None:
            logits.masked_fill_(~allowed, float("-inf"))
        if banned:  # unless that leaves nothing (then the constraint / EOS must win)
            saved = logits[banned].clone()
            logits[banned] = float("-inf")
            if not bool(torch.isfinite(logits).any()):
                logits[banned] = saved
        if not p.temperature or p.temperature <= 0:
            return int(torch.argmax(logits))
        logits /= p.temperature
        if p.top_k is not None and 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits.masked_fill_(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p is not None and p.min_p > 0:
            probs.masked_fill_(probs < p.min_p * probs.max(), 0.0)
        if p.top_p is not None and p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_probs, dim=-1)
            drop = (cum - sorted_probs) > p.top_p  # keep the smallest set reaching top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        if not float(probs.sum()) > 0:  # everything truncated away: fall back to greedy
            return int(torch.argmax(logits))
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def observe(self, token_id: int) -> None:
        """Record a generated token (for frequency / presence penalties)."""
        if self._counts is not None and 0 <= token_id < self.vocab:
            self._counts[token_id] += 1.0
