"""A radix tree over token-id sequences whose nodes own KV blocks (RadixAttention).

Granularity: each node's edge is a run of token ids whose length is a multiple of
``page_size``, and the node owns one KV block id per page of its edge. Keys are
matched and inserted in whole pages only, so a cached block is always full and never
written again; with ``page_size=1`` a block id is exactly a per-token slot index, like
SGLang's ``token_to_kv_pool``. Children are keyed by their first page.

The tree never touches a :class:`~structgen.runtime.block_pool.BlockPool`: methods that
give up blocks *return* them and the caller frees them (:meth:`RadixCache.insert`
returns the blocks made redundant by ones already cached, :meth:`RadixCache.evict`
returns the blocks of evicted nodes). Every block the tree holds is owned by exactly
one node.

Locks: :meth:`RadixCache.lock` increments a reference count on every node from the
given node up to the root; a node with a non-zero count is *protected* and never
evicted. Eviction removes unlocked leaves, least recently used first; a parent whose
last child goes becomes a leaf candidate in the same call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from structgen.runtime.errors import KVCacheError

__all__ = ["InsertResult", "MatchResult", "RadixCache", "RadixNode"]


class RadixNode:
    """One edge of the tree: ``key`` (token ids) and ``blocks`` (one per page of ``key``)."""

    __slots__ = ("blocks", "children", "id", "key", "last_access", "lock_ref", "parent")

    _ids = itertools.count()  # only breaks LRU ties deterministically; never a semantic id

    def __init__(self, key: tuple[int, ...] = (), blocks: list[int] | None = None,
                 parent: RadixNode | None = None) -> None:
        self.key = key
        self.blocks: list[int] = blocks if blocks is not None else []
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.id = next(RadixNode._ids)

    def __repr__(self) -> str:
        return (f"RadixNode(len={len(self.key)}, lock_ref={self.lock_ref}, "
                f"children={len(self.children)})")


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix: ``length`` tokens, ending at ``node``, held in ``blocks``."""

    length: int
    node: RadixNode
    blocks: list[int]


@dataclass(frozen=True)
class InsertResult:
    """``node`` ends the inserted key; ``redundant`` blocks were already cached: free them."""

    node: RadixNode
    redundant: list[int]


class RadixCache:
    """The prefix cache. See the module docstring for ownership and locking rules.

    ``disabled=True`` turns caching off for A/B runs: nothing matches, :meth:`insert`
    keeps nothing and returns every block as redundant, locks are no-ops on the root.
    """

    def __init__(self, page_size: int = 1, *, disabled: bool = False) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size
        self.disabled = disabled
        self.root = RadixNode()
        self.root.lock_ref = 1  # the root is never evicted
        self._clock = 0
        self.total_tokens = 0
        """Tokens cached in the tree."""
        self.protected_tokens = 0
        """Cached tokens on locked nodes (never evicted)."""
        self.hit_tokens = 0
        """Tokens :meth:`match_prefix` found cached, summed over calls."""
        self.miss_tokens = 0
        """Tokens :meth:`match_prefix` did not find cached, summed over calls."""

    # -- counters ------------------------------------------------------------------------
    @property
    def evictable_tokens(self) -> int:
        """Cached tokens on unlocked nodes (all of them can be evicted)."""
        return self.total_tokens - self.protected_tokens

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / (hit_tokens + miss_tokens)``, 0.0 before any match."""
        seen = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / seen if seen else 0.0

    # -- lookup ----------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], *, record: bool = True) -> MatchResult:
        """Find the longest cached (whole-page) prefix of ``tokens``.

        If the match ends inside an edge the edge is split, so the returned node ends
        exactly at the match and can be locked. Marks the path as recently used. With
        ``record`` (the default) the hit/miss counters are updated; a caller that may
        give up on the match passes ``record=False`` and calls :meth:`record_lookup`.
        """
        if self.disabled:
            result = MatchResult(0, self.root, [])
        else:
            node, length, blocks = self._walk(tokens, split=True)
            result = MatchResult(length, node, blocks)
        if record:
            self.record_lookup(result.length, len(tokens))
        return result

    def record_lookup(self, hit: int, total: int) -> None:
        """Count one lookup of ``total`` tokens of which ``hit`` were cached."""
        self.hit_tokens += hit
        self.miss_tokens += total - hit

    def peek_prefix_len(self, tokens: Sequence[int]) -> int:
        """Length of the longest cached prefix, without splitting, counting or touching LRU."""
        if self.disabled:
            return 0
        return self._walk(tokens, split=False)[1]

    def _walk(self, tokens: Sequence[int], *, split: bool) -> tuple[RadixNode, int, list[int]]:
        """(node, matched length, blocks). Without ``split`` only the length is exact."""
        p = self.page_size
        node, pos, blocks = self.root, 0, []
        tick = self._tick() if split else 0
        while len(tokens) - pos >= p:
            child = node.children.get(tuple(tokens[pos:pos + p]))
            if child is None:
                break
            m = self._match_len(child.key, tokens, pos)
            if m < len(child.key):
                if not split:
                    pos += m
                    break
                child = self._split(child, m)
            if split:
                child.last_access = tick
            blocks.extend(child.blocks)
            node, pos = child, pos + m
        return node, pos, blocks

    def _match_len(self, key: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
        """Tokens (a multiple of the page size) of ``key`` equal to ``tokens[start:]``."""
        n = min(len(key), len(tokens) - start)
        seg = tuple(tokens[start:start + n])
        if key[:n] == seg:
            i = n
        else:  # binary search on slice equality: C-speed compares, O(log n) of them
            lo, hi = 0, n  # key[:lo] == seg[:lo] and key[:hi] != seg[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if key[:mid] == seg[:mid]:
                    lo = mid
                else:
                    hi = mid
            i = lo
        return i - i % self.page_size

    # -- insertion ---------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> InsertResult:
        """Cache ``tokens`` (whole pages: ``len(tokens) == len(blocks) * page_size``).

        Where a page is already cached, the tree keeps its own block and the given one
        (if different) is returned in ``redundant`` for the caller to free. New pages
        take ownership of the given blocks. Splits edges as needed.
        """
        p = self.page_size
        if len(tokens) != len(blocks) * p:
            raise KVCacheError(
                f"insert needs whole pages: {len(tokens)} tokens for {len(blocks)} blocks "
                f"of {p}")
        if self.disabled:
            return InsertResult(self.root, list(blocks))
        tick = self._tick()
        node, pos = self.root, 0
        redundant: list[int] = []
        while pos < len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + p]))
            if child is None:
                child = RadixNode(tuple(tokens[pos:]), list(blocks[pos // p:]), node)
                node.children[child.key[:p]] = child
                self.total_tokens += len(child.key)
                child.last_access = tick
                return InsertResult(child, redundant)
            m = self._match_len(child.key, tokens, pos)
            if m < len(child.key):
                child = self._split(child, m)
            first = pos // p
            redundant.extend(g for g, b in zip(blocks[first:first + len(child.blocks)],
                                               child.blocks, strict=True) if g != b)
            child.last_access = tick
            node, pos = child, pos + m
        return InsertResult(node, redundant)

    def _split(self, child: RadixNode, m: int) -> RadixNode:
        """Cut ``child``'s edge after ``m`` tokens; return the new upper node."""
        p = self.page_size
        parent = child.parent
        assert parent is not None  # internal invariant: only attached nodes are split
        upper = RadixNode(child.key[:m], child.blocks[:m // p], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        child.key = child.key[m:]
        child.blocks = child.blocks[m // p:]
        child.parent = upper
        upper.children[child.key[:p]] = child
        parent.children[upper.key[:p]] = upper
        return upper

    # -- locking -------------------------------------------------------------------------------
    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its ancestors from eviction (one more reference each)."""
        self._check_attached(node)
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            if n.lock_ref == 0:
                self.protected_tokens += len(n.key)
            n.lock_ref += 1
            n = n.parent

    def unlock(self, node: RadixNode) -> None:
        """Drop one reference taken by :meth:`lock` on ``node`` and its ancestors."""
        self._check_attached(node)
        n: RadixNode | None = node
        while n is not None and n is not self.root:
            if n.lock_ref == 0:
                raise KVCacheError(f"unlock of an unlocked node {n!r}")
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.protected_tokens -= len(n.key)
            n = n.parent

    def _check_attached(self, node: RadixNode) -> None:
        if node is not self.root and node.parent is None:
            raise KVCacheError(f"{node!r} is not in the tree (evicted?)")

    # -- eviction ----------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> list[int]:
        """Evict unlocked leaves, LRU first, until ``num_tokens`` tokens are gone or none is left.

        Whole nodes are evicted, so more than ``num_tokens`` may go. Returns the blocks of
        the evicted nodes; the caller frees them.
        """
        heap = [(n.last_access, n.id, n) for n in self._nodes()
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[:self.page_size]]
            leaf.parent = None
            freed.extend(leaf.blocks)
            evicted += len(leaf.key)
            self.total_tokens -= len(leaf.key)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def discard(self) -> None:
        """Empty a throwaway tree by unlinking every node, so its nodes are freed at once by
        reference counting instead of lingering as cyclic garbage (parent <-> children)
        until the collector's rare full pass (the scheduler builds one such tree per
        prefill step)."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            n.children = {}
            n.parent = None
        self.root.children = {}
        self.total_tokens = 0
        self.protected_tokens = 0

    # -- introspection ------------------------------------------------------------
    def _nodes(self) -> Iterator[RadixNode]:
        """Every node except the root."""
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def path_blocks(self, node: RadixNode) -> list[int]:
        """The blocks of the prefix ending at ``node``, root first."""
        self._check_attached(node)
        parts: list[list[int]] = []
        n: RadixNode | None = node
        while n is not None:
            parts.append(n.blocks)
            n = n.parent
        return [b for part in reversed(parts) for b in part]

    def blocks(self) -> list[int]:
        """Every block the tree owns (for invariant checks)."""
        return [b for n in self._nodes() for b in n.blocks]

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def __repr__(self) -> str:
        return (f"RadixCache(page_size={self.page_size}, total_tokens={self.total_tokens}, "
                f"protected_tokens={self.protected_tokens}, disabled={self.disabled})")
