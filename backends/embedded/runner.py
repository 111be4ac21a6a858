"""The model side of decoding: forward passes over a KV cache, with prefix reuse.

:class:`ModelRunner` owns the model and the :class:`PrefixCache`. It knows tokens and
logits only -- no sampling, constraints or text -- so the decode loop (and a future batch
scheduler) composes its small methods: :meth:`prefill`, :meth:`decode`, :meth:`save`,
:meth:`score`. It is not thread safe; the backend serializes calls with a lock.

KV layout: a transformers ``DynamicCache``. Its layers grow by ``torch.cat`` (new tensors
every step), so the per-layer ``(keys, values)`` tensors taken by :meth:`save` are never
mutated later, and a cached entry is reused by slicing them (a view, no copy) into a fresh
cache. Models whose cache is not plain full attention (sliding windows, recurrent state)
run without prefix reuse.

Reuse rule: for a prompt of ``n`` tokens sharing ``k`` leading tokens with a cached
entry, ``min(k, n - 1)`` positions are reused and the rest computed -- at least the last
prompt token is always recomputed, because its logits are needed to sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from structgen.backends.embedded.prefix_cache import PrefixCache

__all__ = ["Counters", "ModelRunner", "Prefill"]

#: choices scored per batched forward pass in :meth:`ModelRunner.score`
_SCORE_BATCH = 16


@dataclass
class Counters:
    prompt_tokens: int = 0      # prompt tokens seen (generate and select)
    cached_tokens: int = 0      # prompt positions whose KV was reused from the prefix cache
    computed_tokens: int = 0    # positions run through the model in prefill (prompt + choices)
    forward_passes: int = 0     # model calls
    generated_tokens: int = 0   # tokens sampled (including a final EOS / stop token)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Prefill:
    """A sequence's KV state after prefill: ``cache`` covers ``ids`` minus nothing."""

    cache: Any
    logits: torch.Tensor  # [vocab] float32 on the CPU: the next-token logits
    reused: int
    computed: int
    ids: list[int] = field(default_factory=list)


class ModelRunner:
    def __init__(self, model: Any, *, prefix_cache: PrefixCache | None = None):
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache()
        self.counters = Counters()
        self._reusable: bool | None = None  # decided on the first cache we see

    # -- cache plumbing -----------------------------------------------------------
    def _new_cache(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
                   length: int | None = None, batch: int = 1) -> Any:
        cache = DynamicCache(config=self.config)
        if kv is None:
            return cache
        for layer, (k, v) in zip(cache.layers, kv):
            k, v = k[:, :, :length], v[:, :, :length]
            if batch > 1:
                k = k.expand(batch, -1, -1, -1)
                v = v.expand(batch, -1, -1, -1)
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        return cache

    def _snapshot(self, cache: Any) -> tuple[tuple[torch.Tensor, torch.Tensor], ...] | None:
        layers = getattr(cache, "layers", None)
        if self._reusable is None:
            self._reusable = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
        if not self._reusable:
            return None
        return tuple((layer.keys, layer.values) for layer in layers)

    def _forward(self, ids: torch.Tensor, cache: Any, logits_to_keep: int) -> torch.Tensor:
        self.counters.forward_passes += 1
        out = self.model(input_ids=ids.to(self.device), cache=cache, use_cache=True,
                         logits_to_keep=logits_to_keep)
        return out.logits

    # -- the steps the decode loop composes -------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> Prefill:
        """Run ``ids`` (non-empty), reusing the longest cached prefix; next-token logits."""
        ids = list(ids)
        if not ids:
            raise ValueError("prefill needs at least one token")
        entry, shared = self.prefix_cache.match(ids) if self._reusable is not False else (None, 0)
        reuse = min(shared, len(ids) - 1)
        cache = self._new_cache(entry.kv if entry is not None and reuse > 0 else None, reuse)
        if entry is None or reuse == 0:
            reuse = 0
        logits = self._forward(torch.tensor([ids[reuse:]]), cache, 1)
        c = self.counters
        c.prompt_tokens += len(ids)
        c.cached_tokens += reuse
        c.computed_tokens += len(ids) - reuse
        return Prefill(cache, logits[0, -1].float().cpu(), reuse, len(ids) - reuse, ids)

    @torch.inference_mode()
    def decode(self, cache: Any, token_id: int) -> torch.Tensor:
        """Feed one token; the next-token logits ``[vocab]`` (float32, CPU)."""
        logits = self._forward(torch.tensor([[token_id]]), cache, 1)
        return logits[0, -1].float().cpu()

    def save(self, ids: Sequence[int], cache: Any) -> None:
        """Remember ``cache`` (which covers exactly ``ids``) for later prefix reuse."""
        kv = self._snapshot(cache)
        if kv is not None and kv and kv[0][0].shape[2] == len(ids):
            self.prefix_cache.insert(ids, kv)

    @torch.inference_mode()
    def score(self, prefix: Sequence[int], continuations: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probabilities of each continuation's tokens after ``prefix`` (non-empty).

        The prefix is computed once (or reused from the prefix cache); the continuations
        are then scored in batches from that shared KV, never recomputing the prefix.
        """
        pre = self.prefill(prefix)
        self.save(pre.ids, pre.cache)
        first = torch.log_softmax(pre.logits, dim=-1)
        kv = self._snapshot(pre.cache)
        out: list[list[float]] = [[] for _ in continuations]
        todo = [i for i, c in enumerate(continuations) if c]
        for i in todo:
            out[i].append(float(first[continuations[i][0]]))
        longer = [i for i in todo if len(continuations[i]) > 1]
        for start in range(0, len(longer), _SCORE_BATCH):
            chunk = longer[start:start + _SCORE_BATCH]
            width = max(len(continuations[i]) for i in chunk) - 1
            # Right padding needs no attention mask: real tokens never attend to later ones.
            pad = [list(continuations[i][:-1]) + [0] * (width - len(continuations[i]) + 1) for i in chunk]
            if kv is not None:
                cache = self._new_cache(kv, len(pre.ids), batch=len(chunk))
            else:  # no reusable KV: recompute the prefix inside the batch
                cache = self._new_cache()
                pad = [list(pre.ids) + row for row in pad]
            logits = self._forward(torch.tensor(pad), cache, 0)[:, -width:].float()
            self.counters.computed_tokens += width * len(chunk)
            logp = torch.log_softmax(logits, dim=-1).cpu()
            for row, i in enumerate(chunk):
                cont = continuations[i]
                for j in range(1, len(cont)):
                    out[i].append(float(logp[row, j - 1, cont[j]]))
        return out
