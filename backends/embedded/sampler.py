"""Turning one step's logits into a token: penalties, constraint mask, temperature,
top-k / top-p / min-p truncation, and seeded sampling.

Log-probabilities reported to users are those of the model's own distribution at that
step (``log_softmax`` of the raw logits, before penalties, mask and temperature), like
an engine's ``return_logprob``. Under a constraint, :func:`masked_logprob` also gives the
token's log-probability in the constrained distribution (the model's, renormalised over the
tokens the mask allowed): what per-field confidence reads, since a value the constraint
forces is certain whatever the model would have preferred.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from structgen.contract.backend import SamplingParams

__all__ = ["Sampler", "TokenMask", "masked_logprob", "token_mask"]



@dataclass(frozen=True)
class TokenMask:
    """One step's constraint mask as token indices: the allowed ones when they are fewer,
    else the disallowed ones, so applying it touches few entries."""

    allowed: np.ndarray | None = None
    disallowed: np.ndarray | None = None

    def apply(self, logits: np.ndarray) -> None:
        if self.allowed is not None:
            keep = logits[self.allowed]
            logits.fill(-np.inf)
            logits[self.allowed] = keep
        elif self.disallowed is not None and self.disallowed.size:
            logits[self.disallowed] = -np.inf


def token_mask(bitmask: Any, vocab: int) -> TokenMask:
    """The :class:`TokenMask` of one int32 bitmask row (bit ``t%32`` of word ``t//32``).

    numpy, single-threaded (~50 us; meant for the mask worker thread). torch elementwise
    kernels would pay an OpenMP barrier every step -- milliseconds on a busy CPU.
    """
    row = bitmask.numpy() if hasattr(bitmask, "numpy") else np.asarray(bitmask)
    bits = np.unpackbits(np.ascontiguousarray(row, dtype=np.int32).reshape(-1).view(np.uint8),
                         bitorder="little")[:vocab]
    allowed = np.flatnonzero(bits)
    if allowed.size <= vocab // 2:
        return TokenMask(allowed=allowed)
    return TokenMask(disallowed=np.flatnonzero(bits == 0) if bits.size == vocab else
                     np.concatenate([np.flatnonzero(bits == 0), np.arange(bits.size, vocab)]))


def masked_logprob(raw: torch.Tensor, mask: TokenMask, token: int) -> float:
    """``token``'s log-probability under ``raw`` (a step's log-softmax, ``[vocab]``, CPU)
    renormalised over the tokens ``mask`` allows (numpy: no torch kernel launches)."""
    arr = raw.numpy()
    if mask.allowed is not None:
        kept = arr[mask.allowed]
    else:
        keep = np.ones(arr.size, dtype=bool)
        if mask.disallowed is not None:
            keep[mask.disallowed] = False
        kept = arr[keep]
    if kept.size == 0:
        return float(arr[token])
    top = float(kept.max())
    return float(arr[token]) - (top + float(np.log(np.exp(kept - top).sum())))


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

    def choose(self, logits: torch.Tensor, mask: TokenMask | None = None,
               banned: list[int] | None = None) -> int:
        """Pick the next token from ``logits`` ``[vocab]`` (float32, CPU, modified in place).

        ``mask`` is the constraint's mask (:func:`token_mask`); ``banned`` lists
        token ids forbidden this step (EOS before ``min_new_tokens`` or with ``ignore_eos``).
        The per-step work is numpy on a view of ``logits`` (no torch kernel launches).
        """
        p = self.params
        arr = logits.numpy()
        if self._counts is not None:
            counts = self._counts.numpy()
            if p.frequency_penalty:
                arr -= p.frequency_penalty * counts
            if p.presence_penalty:
                arr -= p.presence_penalty * (counts > 0)
        if mask is not None:
            mask.apply(arr)
        if banned:  # unless that leaves nothing (then the constraint / EOS must win)
            saved = arr[banned].copy()
            arr[banned] = -np.inf
            if arr.max() == -np.inf:
                arr[banned] = saved
        if not p.temperature or p.temperature <= 0:
            return int(arr.argmax())
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
