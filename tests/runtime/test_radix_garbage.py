"""A throwaway radix tree leaves no cyclic garbage: RadixCache.discard() unlinks its nodes,
and the scheduler's per-step in-batch tree is discarded (a long job's memory stays flat)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from structgen.runtime import BlockPool, RadixCache, Scheduler, SchedulerConfig, SeqState
from structgen.runtime.radix_cache import RadixNode

MARK = 10**9  # token ids no real vocabulary has


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def live_marked_nodes() -> int:
    return sum(1 for o in gc.get_objects()
               if isinstance(o, RadixNode) and o.key and o.key[0] >= MARK)


def _tree() -> RadixCache:
    tree = RadixCache(1)
    for i in range(5):
        tokens = [MARK, MARK + 1, MARK + 2 + i, MARK + 10 + i]
        tree.insert(tokens, [0] * len(tokens))
    return tree


def test_discard_frees_nodes_without_the_collector() -> None:
    with collector_off():
        tree = _tree()
        assert live_marked_nodes() >= 5
        tree.discard()
        del tree
        assert live_marked_nodes() == 0
        assert RadixCache(1).total_tokens == 0


def test_without_discard_nodes_wait_for_the_collector() -> None:
    # the control: the parent <-> children cycle keeps a dropped tree alive until gc runs
    with collector_off():
        tree = _tree()
        del tree
        assert live_marked_nodes() >= 5
    assert live_marked_nodes() == 0


def test_the_schedulers_in_batch_tree_is_freed_each_step() -> None:
    pool = BlockPool(4096, page_size=1)
    sched = Scheduler(pool, RadixCache(1), SchedulerConfig(max_running_seqs=8, in_batch_prefix_threshold=2))
    with collector_off():
        for i in range(6):
            sched.add(SeqState(i, [MARK, MARK + 1, MARK + 2, MARK + 3 + i, MARK + 20 + i]))
        sched.schedule()
        # marked nodes alive now are the scheduler's own cache's, nothing else
        owned = sum(1 for _ in sched.cache._nodes())
        assert live_marked_nodes() <= owned
