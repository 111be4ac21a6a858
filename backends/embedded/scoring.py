"""Scoring continuations (``select``) on the engine's model, KV pool and prefix cache.

One pass computes the prefix (through the radix cache) together with the first
continuation, giving every continuation's first-token logits and the first one's rest (a
single continuation -- a ``select`` scored unconditionally, a tool's relevance -- costs one
pass); a second pass runs the other continuations' remaining tokens together against the
shared prefix KV. The prefix stays cached for what follows; the
continuations' KV is released. Runs on the engine's loop thread, between steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from structgen.backends.embedded.kv_pool import KVPool
from structgen.backends.embedded.model import DecoderModel, SeqInput
from structgen.errors import BackendError
from structgen.runtime import BlockPool, RadixCache

__all__ = ["Scorer"]


class Scorer:
    """Scores continuations; keeps its own prompt / cached / computed token counts."""

    def __init__(self, model: DecoderModel, kv: KVPool, pool: BlockPool, cache: RadixCache) -> None:
        self.model, self.kv, self.pool, self.cache = model, kv, pool, cache
        self.scored_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.forward_passes = 0

    def score(self, prefix: list[int], conts: list[list[int]]) -> list[list[float]]:
        """Log-probabilities of each continuation's tokens after ``prefix`` (non-empty)."""
        if not prefix:
            raise BackendError("score needs a non-empty prefix", backend="embedded")
        match = self.cache.match_prefix(prefix[:-1])
        self.cache.lock(match.node)
        held: list[int] = []
        try:
            new = len(prefix) - match.length
            tails = [len(c) - 1 for c in conts if len(c) > 1]
            if not self._room(new + sum(tails)):
                raise BackendError(f"select needs {new + sum(tails)} KV slots, more than the cache "
                                   "can free", backend="embedded")
            own = self.pool.allocate(new) or []
            held += own
            blocks = match.blocks + own
            prefix_slots = list(self.pool.slot_mapping(blocks, 0, len(prefix)))
            with torch.inference_mode():
                def slots(c: list[int]) -> list[int]:
                    """The prefix's slots plus new ones for ``c``'s tokens but its last."""
                    n = max(len(c) - 1, 0)
                    extra = (self.pool.allocate(n) or []) if n else []
                    held.extend(extra)
                    return prefix_slots + list(self.pool.slot_mapping(extra, 0, n))

                # the first continuation rides on the prefix's forward (its rows: the last
                # prefix token's, then its own); the others follow in one more forward
                c0 = conts[0] if conts else []
                fb = self.model.prepare([SeqInput(list(prefix[match.length:]) + list(c0[:-1]), slots(c0),
                                                  logits=max(1, len(c0)))])
                rows0 = torch.log_softmax(self.model.forward(fb, self.kv).float(), dim=-1)
                self.forward_passes += 1
                first = rows0[0]
                inputs = [SeqInput(c[:-1], slots(c), logits="all") for c in conts[1:] if len(c) > 1]
                rest: Iterator[torch.Tensor] = iter([])
                if inputs:
                    fb = self.model.prepare(inputs)
                    rest = iter(fb.split(self.model.forward(fb, self.kv)))
                    self.forward_passes += 1
                result = []
                for i, c in enumerate(conts):
                    lps = [float(first[c[0]])] if c else []
                    if len(c) > 1:
                        rows = rows0[1:] if i == 0 else torch.log_softmax(next(rest).float(), dim=-1)
                        lps += [float(rows[j, t]) for j, t in enumerate(c[1:])]
                    result.append(lps)
            self.scored_tokens += new + sum(tails)
            self.prompt_tokens += len(prefix)
            self.cached_tokens += match.length
            if not self.cache.disabled and own:  # the prefix stays cached for what follows
                res = self.cache.insert(prefix, blocks)
                self.pool.free(res.redundant)
                owned = set(own)
                held = [b for b in held if b not in owned]
            return result
        finally:
            self.cache.unlock(match.node)
            self.pool.free(held)

    def _room(self, need: int) -> bool:
        short = need - self.pool.num_free
        if short > 0:
            self.pool.free(self.cache.evict(short))
        return self.pool.num_free >= need
