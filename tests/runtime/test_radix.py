"""Unit and property tests for the block pool and the radix prefix cache (no model)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import structgen.runtime as rt
from structgen.errors import BackendError
from structgen.runtime import BlockPool, KVCacheError, RadixCache, RadixNode


def test_public_surface_sorted_and_complete() -> None:
    assert rt.__all__ == sorted(rt.__all__)
    for name in rt.__all__:
        assert hasattr(rt, name)


def test_runtime_imports_no_torch_numpy_or_transformers() -> None:
    root = Path(rt.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in {"torch", "numpy", "transformers"}, path


# -- BlockPool -------------------------------------------------------------------------------------
def test_pool_allocate_returns_none_when_exhausted_and_allocates_nothing() -> None:
    pool = BlockPool(4, page_size=16)
    a = pool.allocate(3)
    assert a is not None and len(set(a)) == 3
    assert pool.allocate(2) is None
    assert pool.num_free == 1 and pool.num_used == 3
    assert pool.allocate(0) == []
    assert pool.capacity_tokens == 64
    assert pool.blocks_for(17) == 2 and pool.blocks_for(16) == 1 and pool.blocks_for(0) == 0


def test_pool_refcounts_and_double_free() -> None:
    pool = BlockPool(2, page_size=1)
    (b,) = pool.allocate(1) or []
    pool.incref([b])
    assert pool.ref_count(b) == 2
    pool.free([b])
    assert pool.num_free == 1
    pool.free([b])
    assert pool.num_free == 2 and pool.ref_count(b) == 0
    with pytest.raises(KVCacheError, match="double free"):
        pool.free([b])
    with pytest.raises(KVCacheError):
        pool.incref([b])
    with pytest.raises(KVCacheError):
        pool.free([7])
    assert issubclass(KVCacheError, BackendError)


def test_pool_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)
    with pytest.raises(ValueError):
        BlockPool(4, page_size=0)


def test_slot_mapping() -> None:
    pool = BlockPool(8, page_size=4)
    assert pool.slot_mapping([5, 2], 2, 7) == [22, 23, 8, 9, 10]
    with pytest.raises(KVCacheError):
        pool.slot_mapping([5], 0, 5)


# -- RadixCache: exact numbers --------------------------------------------------
def _fill(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> rt.InsertResult:
    """Caller protocol: match, allocate the rest, insert, free redundant."""
    m = cache.match_prefix(tokens)
    own = pool.allocate(len(tokens) // cache.page_size - len(m.blocks))
    assert own is not None
    res = cache.insert(tokens, m.blocks + own)
    pool.free(res.redundant)
    return res


def test_sixteen_sequences_share_a_100_token_prefix() -> None:
    pool = BlockPool(1000, page_size=1)
    cache = RadixCache(page_size=1)
    prefix = list(range(1000, 1100))
    seqs = [prefix + [i] * 20 for i in range(16)]
    _fill(pool, cache, seqs[0])
    assert (cache.hit_tokens, cache.miss_tokens) == (0, 120)
    for s in seqs[1:]:
        m = cache.match_prefix(s)
        assert m.length == 100
        assert m.blocks == cache.path_blocks(m.node) and len(m.blocks) == 100
    assert cache.hit_tokens == 1500
    assert cache.miss_tokens == 120 + 15 * 20
    assert cache.hit_rate == pytest.approx(1500 / (1500 + 420))
    for s in seqs[1:]:
        _fill(pool, cache, s)
    assert cache.total_tokens == 100 + 16 * 20
    assert pool.num_used == 420
    assert sorted(cache.blocks()) == sorted(set(cache.blocks()))


def test_insert_splits_and_returns_redundant_blocks() -> None:
    cache = RadixCache()
    r1 = cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert r1.redundant == []
    r2 = cache.insert([1, 2, 9], [20, 21, 22])  # first two already cached under other blocks
    assert r2.redundant == [20, 21]
    assert cache.total_tokens == 5
    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert (m.length, m.blocks) == (4, [10, 11, 12, 13])
    assert cache.match_prefix([1, 2, 9]).blocks == [10, 11, 22]
    # the tree's own blocks are not redundant
    assert cache.insert([1, 2, 3], [10, 11, 12]).redundant == []
    # inserting a prefix that ends mid-edge splits it and returns the upper node
    res = cache.insert([1], [10])
    assert res.node.key == (1,) and len(res.node.children) == 1


def test_match_splits_so_the_node_ends_at_the_match() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    m = cache.match_prefix([1, 2, 7])
    assert m.length == 2 and m.node.key == (1, 2)
    assert cache.peek_prefix_len([1, 2, 3, 9]) == 3


def test_pages_match_and_insert_whole_pages_only() -> None:
    cache = RadixCache(page_size=4)
    cache.insert(list(range(8)), [5, 6])
    assert cache.match_prefix(list(range(7))).length == 4
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 6, 99, 8]).length == 4
    assert cache.match_prefix(list(range(10))).blocks == [5, 6]
    assert cache.match_prefix([0, 1, 2]).length == 0
    with pytest.raises(KVCacheError, match="whole pages"):
        cache.insert([1, 2, 3], [0])


def test_lock_protects_and_evict_is_lru_leaves_first() -> None:
    cache = RadixCache()
    a = cache.insert([1, 2, 3], [0, 1, 2]).node          # oldest
    b = cache.insert([1, 2, 4, 5], [0, 1, 3, 4]).node     # splits [1,2] off
    cache.insert([7, 8], [5, 6])                          # newest
    assert cache.total_tokens == 7 and cache.evictable_tokens == 7
    cache.lock(b)
    assert cache.protected_tokens == 4 and cache.evictable_tokens == 3
    assert cache.evict(1) == [2]                          # leaf a, the LRU one
    assert a.parent is None
    assert cache.evict(100) == [5, 6]                     # c; b's path is locked
    assert cache.total_tokens == 4
    cache.unlock(b)
    assert cache.protected_tokens == 0
    assert sorted(cache.evict(100)) == [0, 1, 3, 4]       # b, then its parent [1, 2]
    assert cache.total_tokens == 0
    with pytest.raises(KVCacheError):
        cache.lock(a)
    fresh = cache.insert([9], [9]).node
    with pytest.raises(KVCacheError, match="unlock"):
        cache.unlock(fresh)


def test_match_refreshes_lru() -> None:
    cache = RadixCache()
    cache.insert([1], [1])
    cache.insert([2], [2])
    cache.match_prefix([1])
    assert cache.evict(1) == [2]


def test_split_keeps_lock_counts() -> None:
    cache = RadixCache()
    n = cache.insert([1, 2, 3, 4], [0, 1, 2, 3]).node
    cache.lock(n)
    cache.insert([1, 2, 9], [7, 8, 9])
    assert cache.protected_tokens == 4 and cache.evictable_tokens == 1
    cache.unlock(n)
    assert cache.protected_tokens == 0


def test_disabled_cache_keeps_nothing() -> None:
    cache = RadixCache(disabled=True)
    res = cache.insert([1, 2, 3], [4, 5, 6])
    assert res.redundant == [4, 5, 6] and res.node is cache.root
    m = cache.match_prefix([1, 2, 3])
    assert (m.length, m.blocks) == (0, [])
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.total_tokens == 0 and cache.miss_tokens == 3 and cache.hit_rate == 0.0


# -- property test: a random workload against a brute-force model -----------------------------
tokens_st = st.lists(st.integers(0, 2), max_size=12)


class RadixMachine(RuleBasedStateMachine):
    """Random insert/match/lock/unlock/evict against a dict of cached page-prefixes."""

    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(24, page_size=self.page_size)
        self.cache = RadixCache(self.page_size)
        self.model: dict[tuple[int, ...], int] = {}  # cached page-aligned prefix -> its last block
        self.held: list[RadixNode] = []

    # helpers
    def _aligned(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) - len(tokens) % self.page_size]

    def _brute(self, tokens: list[int]) -> tuple[int, list[int]]:
        p, n, blocks = self.page_size, 0, []
        while n + p <= len(tokens) and tuple(tokens[: n + p]) in self.model:
            n += p
            blocks.append(self.model[tuple(tokens[:n])])
        return n, blocks

    def _path(self, node: RadixNode) -> tuple[int, ...]:
        keys = []
        n: RadixNode | None = node
        while n is not None:
            keys.append(n.key)
            n = n.parent
        return tuple(t for k in reversed(keys) for t in k)

    def _protected(self) -> set[tuple[int, ...]]:
        out = set()
        for node in self.held:
            path = self._path(node)
            out |= {path[:i] for i in range(self.page_size, len(path) + 1, self.page_size)}
        return out

    def _evict(self, num_tokens: int) -> None:
        protected = self._protected()
        freed = self.cache.evict(num_tokens)
        gone = {k for k, b in self.model.items() if b in set(freed)}
        assert len(gone) == len(freed)
        assert not gone & protected, "evicted a locked prefix"
        for k in gone:
            del self.model[k]
        self.pool.free(freed)

    def _record(self, tokens: list[int], blocks: list[int]) -> None:
        p = self.page_size
        for i, b in enumerate(blocks):
            self.model.setdefault(tuple(tokens[: (i + 1) * p]), b)

    # rules
    @rule(tokens=tokens_st, keep_lock=st.booleans())
    def insert_reusing_prefix(self, tokens: list[int], keep_lock: bool) -> None:
        tokens = self._aligned(tokens)
        m = self.cache.match_prefix(tokens)
        self.cache.lock(m.node)
        need = len(tokens) // self.page_size - len(m.blocks)
        if self.pool.num_free < need:
            self._evict((need - self.pool.num_free) * self.page_size)
        own = self.pool.allocate(need)
        if own is None:
            self.cache.unlock(m.node)
            return
        res = self.cache.insert(tokens, m.blocks + own)
        assert res.redundant == []
        self._record(tokens, m.blocks + own)
        self.cache.lock(res.node)
        self.cache.unlock(m.node)
        if keep_lock:
            self.held.append(res.node)
        else:
            self.cache.unlock(res.node)

    @rule(tokens=tokens_st)
    def insert_fresh_blocks(self, tokens: list[int]) -> None:
        """A sequence computed everything itself; already-cached pages come back redundant."""
        tokens = self._aligned(tokens)
        own = self.pool.allocate(len(tokens) // self.page_size)
        if own is None:
            return
        cached_n, _ = self._brute(tokens)
        res = self.cache.insert(tokens, own)
        assert res.redundant == own[: cached_n // self.page_size]
        self.pool.free(res.redundant)
        self._record(tokens, own)

    @rule(tokens=tokens_st)
    def match(self, tokens: list[int]) -> None:
        m = self.cache.match_prefix(tokens)
        assert (m.length, m.blocks) == self._brute(tokens)
        assert self.cache.peek_prefix_len(tokens) == m.length
        assert self._path(m.node) == tuple(tokens[: m.length])

    @rule(tokens=tokens_st)
    def lock(self, tokens: list[int]) -> None:
        m = self.cache.match_prefix(tokens)
        self.cache.lock(m.node)
        self.held.append(m.node)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        node = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 30))
    def evict(self, num_tokens: int) -> None:
        self._evict(num_tokens)

    # invariants
    @invariant()
    def blocks_owned_exactly_once(self) -> None:
        tree_blocks = self.cache.blocks()
        assert len(tree_blocks) == len(set(tree_blocks))
        assert set(tree_blocks) == set(self.model.values())
        assert self.pool.num_used == len(tree_blocks) <= self.pool.num_blocks
        assert all(self.pool.ref_count(b) == 1 for b in tree_blocks)

    @invariant()
    def counters_agree_with_model(self) -> None:
        p = self.page_size
        assert self.cache.total_tokens == len(self.model) * p
        assert self.cache.protected_tokens == len(self._protected()) * p
        assert self.cache.evictable_tokens == self.cache.total_tokens - self.cache.protected_tokens

    @invariant()
    def locked_nodes_stay_and_model_is_prefix_closed(self) -> None:
        for node in self.held:
            assert node is self.cache.root or node.parent is not None
        p = self.page_size
        for k in self.model:
            assert len(k) == p or k[:-p] in self.model


class RadixMachinePaged(RadixMachine):
    page_size = 2


_settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = _settings
TestRadixMachinePaged = RadixMachinePaged.TestCase
TestRadixMachinePaged.settings = _settings


@settings(max_examples=200, deadline=None)
@given(key=st.lists(st.integers(0, 1), max_size=40),
       tokens=st.lists(st.integers(0, 1), max_size=40),
       start=st.integers(0, 5), page=st.sampled_from([1, 3]))
def test_edge_match_length_equals_naive_scan(key: list[int], tokens: list[int], start: int,
                                             page: int) -> None:
    start = min(start, len(tokens))
    i = 0
    while i < min(len(key), len(tokens) - start) and key[i] == tokens[start + i]:
        i += 1
    assert RadixCache(page)._match_len(tuple(key), tokens, start) == i - i % page
