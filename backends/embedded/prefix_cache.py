"""A small LRU cache of recent token sequences and their KV, matched by longest common prefix.

Pure Python: the KV payload is opaque here (the backend stores per-layer key/value
tensors). The backend asks :meth:`PrefixCache.match` for the entry sharing the longest
token prefix with a new prompt and reuses that many positions of its KV.

Why matching is on token ids, not text: the second ``gen`` of a program re-tokenizes
``prompt + generated + new text``, and BPE may merge differently at a boundary. Reuse
stops at the first differing token, so a boundary merge costs a token or two, never
correctness. A later issue replaces this with a radix tree; the interface (``match`` /
``insert``) is what the decode loop depends on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheEntry", "PrefixCache", "common_prefix_len"]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class CacheEntry:
    #: the tokens whose KV is stored (``kv`` covers exactly these positions)
    ids: tuple[int, ...]
    kv: Any


class PrefixCache:
    """At most ``max_entries`` sequences and ``max_tokens`` cached positions in total."""

    def __init__(self, max_entries: int = 8, max_tokens: int = 16384):
        if max_entries < 0 or max_tokens < 0:
            raise ValueError("prefix cache limits must be >= 0")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()
        self._next = 0
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def match(self, ids: Sequence[int]) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that prefix's length."""
        best: tuple[CacheEntry | None, int] = (None, 0)
        best_key = None
        for key, entry in self._entries.items():
            n = common_prefix_len(entry.ids, ids)
            if n > best[1]:
                best, best_key = (entry, n), key
        if best_key is not None:
            self._entries.move_to_end(best_key)
        return best

    def insert(self, ids: Sequence[int], kv: Any) -> None:
        """Store ``kv`` for ``ids``; entries that are a prefix of ``ids`` are dropped."""
        ids = tuple(ids)
        if not ids or self.max_entries == 0 or len(ids) > self.max_tokens:
            return
        for key, entry in list(self._entries.items()):
            n = common_prefix_len(entry.ids, ids)
            if n == len(ids):  # already covered by a longer (or equal) entry
                self._entries.move_to_end(key)
                return
            if n == len(entry.ids):  # the new sequence extends this one
                self._drop(key)
        self._entries[self._next] = CacheEntry(ids, kv)
        self._next += 1
        self._tokens += len(ids)
        while len(self._entries) > self.max_entries or self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self._tokens -= len(entry.ids)
