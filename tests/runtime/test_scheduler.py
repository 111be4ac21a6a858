"""Scheduler tests driven by a fake "model" loop (no torch, no model)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from structgen.errors import BackendError
from structgen.runtime import (
    Batch,
    BlockPool,
    ContextLengthError,
    KVCacheError,
    KVCapacityError,
    RadixCache,
    Scheduler,
    SchedulerConfig,
    SeqState,
    SequenceStatus,
)


def check_invariants(sched: Scheduler) -> None:
    """Every used block is owned by exactly one tree node or one running sequence."""
    pool, cache = sched.pool, sched.cache
    tree = cache.blocks()
    owned = list(tree)
    for seq in sched.running:
        assert seq.status is SequenceStatus.RUNNING
        assert len(seq.blocks) == pool.blocks_for(seq.kv_len)
        assert seq.node is not None
        assert seq.blocks[: seq.num_tree_blocks] == cache.path_blocks(seq.node)
        owned.extend(seq.blocks[seq.num_tree_blocks:])
    for seq in sched.waiting:
        assert seq.status is SequenceStatus.WAITING
        assert seq.blocks == [] and seq.node is None and seq.kv_len == 0
    assert len(owned) == len(set(owned)), "a block has two owners"
    assert pool.num_used == len(owned) <= pool.num_blocks, "a block leaked"
    assert all(pool.ref_count(b) == 1 for b in owned)


def drive(sched: Scheduler, targets: dict[object, int], rng: random.Random, *,
          max_steps: int = 5000, forced_p: float = 0.0) -> list[Batch]:
    """Fake model: append random tokens; finish a sequence at its target output length."""
    batches = []
    for _ in range(max_steps):
        if not sched.has_work:
            return batches
        batch = sched.schedule()
        check_invariants(sched)
        batches.append(batch)
        for entry in batch.entries:
            seq = entry.seq
            assert entry.start == seq.kv_len - entry.num_tokens and entry.end == seq.num_tokens
            sched.append(seq, rng.randrange(50))
            while rng.random() < forced_p and seq.num_output_tokens < targets[seq.seq_id]:
                sched.append(seq, rng.randrange(50), forced=True)
            if seq.num_output_tokens >= targets[seq.seq_id]:
                sched.finish(seq, "length")
        check_invariants(sched)
    raise AssertionError(f"not done after {max_steps} steps")


def make_sched(num_blocks: int = 1000, page_size: int = 1, **cfg: object) -> Scheduler:
    pool = BlockPool(num_blocks, page_size=page_size)
    return Scheduler(pool, RadixCache(page_size), SchedulerConfig(**cfg))  # type: ignore[arg-type]


# -- exact numbers ---------------------------------------------------------------------------
def test_sixteen_sequences_share_a_prefix_computed_once() -> None:
    sched = make_sched()
    prefix = list(range(1000, 1100))
    seqs = [SeqState(i, prefix + [i] * 10) for i in range(16)]
    for s in seqs:
        sched.add(s)
    first = sched.schedule()
    assert first.kind == "prefill" and first.seqs == [seqs[0]]  # batch-mates wait one step
    assert (first.entries[0].start, first.entries[0].end) == (0, 110)
    sched.append(seqs[0], 7)
    second = sched.schedule()
    assert second.kind == "prefill" and second.seqs == seqs[1:]
    assert all((e.start, e.end) == (100, 110) for e in second.entries)
    assert [s.cached_prefix_len for s in seqs[1:]] == [100] * 15
    for s in seqs[1:]:
        sched.append(s, 7)
    drive(sched, {s.seq_id: 5 for s in seqs}, random.Random(0))
    st = sched.stats
    assert st.prompt_tokens == 16 * 110
    assert st.cached_tokens == 1500
    assert st.prefill_computed_tokens == 110 + 15 * 10
    assert st.cache_hit_rate == pytest.approx(1500 / 1760)
    assert (st.prefill_steps, st.decode_steps, st.steps) == (2, 4, 6)
    assert st.decode_computed_tokens == 16 * 4
    assert st.computed_tokens == 260 + 64
    assert st.finished == 16 and st.preemptions == 0
    # the cache counts the prefix each admission looked up (the prompt less its last token)
    assert sched.cache.hit_tokens == 1500 and sched.cache.miss_tokens == 109 + 15 * 9
    assert all(s.status is SequenceStatus.FINISHED and s.num_output_tokens == 5 for s in seqs)
    # everything left is cache, none of it locked
    assert sched.cache.protected_tokens == 0
    assert sched.pool.num_used == len(sched.cache.blocks())
    assert sched.cache.total_tokens == 100 + 16 * 14  # prefix + each suffix and its KV'd outputs


def test_without_in_batch_dedup_all_compute_the_prefix() -> None:
    sched = make_sched(in_batch_prefix_threshold=0)
    prefix = list(range(100))
    seqs = [SeqState(i, prefix + [500 + i]) for i in range(4)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == seqs and sched.stats.cached_tokens == 0
    for s in seqs:
        sched.append(s, 1)
    # their prompts are cached after the prefill; duplicates came back and were freed
    sched.schedule()
    assert sched.cache.total_tokens == 100 + 4
    check_invariants(sched)


def test_disabled_cache_reuses_nothing_and_frees_everything() -> None:
    pool = BlockPool(500, page_size=1)
    sched = Scheduler(pool, RadixCache(1, disabled=True))
    seqs = [SeqState(i, list(range(100)) + [i]) for i in range(4)]
    for s in seqs:
        sched.add(s)
    drive(sched, {s.seq_id: 3 for s in seqs}, random.Random(1))
    assert sched.stats.cached_tokens == 0 and sched.stats.prefill_computed_tokens == 404
    assert pool.num_used == 0


@pytest.mark.parametrize("policy, lpm_max_waiting, first",
                         [("lpm", 256, "hit"), ("fcfs", 256, "miss"), ("lpm", 2, "miss")])
def test_longest_prefix_first_with_fcfs_tie_break(policy: str, lpm_max_waiting: int,
                                                  first: str) -> None:
    sched = make_sched(policy=policy, max_prefill_tokens=1, lpm_max_waiting=lpm_max_waiting)
    warm = SeqState("warm", list(range(50)))
    sched.add(warm)
    drive(sched, {"warm": 1}, random.Random(0))
    miss = SeqState("miss", [900] * 30)
    hit = SeqState("hit", list(range(50)) + [1])
    tie = SeqState("tie", list(range(50)) + [2])
    for s in (miss, hit, tie):
        sched.add(s)
    order = [sched.schedule().seqs[0].seq_id for _ in range(3)]
    expected = ["hit", "tie", "miss"] if first == "hit" else ["miss", "hit", "tie"]
    assert order == expected and order[0] == first


def test_anti_starvation() -> None:
    sched = make_sched(max_prefill_tokens=1, starvation_limit=2)
    sched.add(SeqState("warm", list(range(40))))
    drive(sched, {"warm": 1}, random.Random(0))
    sched.add(SeqState("cold", [999] * 10))
    for i in range(5):
        sched.add(SeqState(f"hot{i}", list(range(40)) + [i]))
    order = [sched.schedule().seqs[0].seq_id for _ in range(6)]
    assert order == ["hot0", "hot1", "cold", "hot2", "hot3", "hot4"]


def test_forced_tokens_are_computed_in_one_pass_and_counted() -> None:
    sched = make_sched()
    seq = SeqState("s", [1, 2, 3])
    sched.add(seq)
    sched.schedule()
    sched.append(seq, 10)
    sched.append(seq, 11, forced=True)
    sched.append(seq, 12, forced=True)
    batch = sched.schedule()
    assert batch.kind == "decode" and (batch.entries[0].start, batch.entries[0].end) == (3, 6)
    assert sched.stats.forced_tokens == 2 == seq.forced_tokens
    assert sched.stats.decode_computed_tokens == 3 and seq.computed_tokens == 6


def test_truncate_drops_rejected_draft_tokens_and_their_kv() -> None:
    sched = make_sched(num_blocks=20, page_size=2)
    seq = SeqState("s", [1, 2, 3])
    sched.add(seq)
    sched.schedule()  # prefill: 3 tokens, pages [0,1] [2,-]
    free0 = sched.pool.num_free
    sched.append(seq, 10)
    for t in (20, 21, 22):  # a draft of three tokens, computed with 10 in one pass
        sched.append(seq, t)
    batch = sched.schedule()
    assert (batch.entries[0].start, batch.entries[0].end) == (3, 7) and seq.kv_len == 7
    assert sched.pool.num_free == free0 - 2  # positions 4..6 need two more pages
    sched.truncate(seq, 2)  # 21 and 22 rejected: 5 tokens stay, their pages too
    assert seq.token_ids == [1, 2, 3, 10, 20] and seq.kv_len == 5
    assert len(seq.blocks) == 3 and sched.pool.num_free == free0 - 1
    sched.append(seq, 30)  # the sampler's own choice, computed next pass
    batch = sched.schedule()
    assert (batch.entries[0].start, batch.entries[0].end) == (5, 6)
    sched.append(seq, 40)
    sched.truncate(seq, 1)  # an uncomputed token: no KV to release
    assert seq.kv_len == 6 and seq.token_ids[-1] == 30
    with pytest.raises(KVCacheError):
        sched.truncate(seq, 4)  # more than the output
    sched.finish(seq)
    check_invariants(sched)


# -- memory ------------------------------------------------------------------------------------
def test_batch_larger_than_memory_completes_with_preemption() -> None:
    sched = make_sched(num_blocks=16, page_size=4)  # 64 token slots
    seqs = [SeqState(i, [i] * 20) for i in range(10)]  # 10 x (20 + 15) tokens >> 64
    for s in seqs:
        sched.add(s)
    drive(sched, dict.fromkeys(range(10), 15), random.Random(3))
    assert all(s.is_finished and s.error is None and s.num_output_tokens == 15 for s in seqs)
    assert sched.stats.preemptions > 0


def test_preempted_sequence_goes_back_to_waiting_and_resumes_from_cache() -> None:
    sched = make_sched(num_blocks=10, in_batch_prefix_threshold=0)
    a, b = SeqState("a", [1, 2, 3, 4]), SeqState("b", [5, 6, 7, 8])
    sched.add(a)
    sched.add(b)
    assert sched.schedule().seqs == [a, b]
    for _ in range(2):
        sched.append(a, 0)
        sched.append(b, 0)
        batch = sched.schedule()
    assert batch.kind == "decode" and batch.seqs == [a] and batch.preempted == (b,)
    assert b.status is SequenceStatus.WAITING and b.blocks == [] and b.num_preemptions == 1
    assert list(sched.waiting) == [b]
    # b's KV went to the cache; its newest page (first output) was evicted to make room
    assert sched.stats.evicted_tokens == 1
    check_invariants(sched)
    sched.finish(a)
    again = sched.schedule()
    assert again.kind == "prefill" and again.seqs == [b]
    # b's prompt is reused; a's two cached output tokens were evicted to make room
    assert sched.stats.evicted_tokens == 3
    assert b.cached_prefix_len == 4 and b.cached_tokens == 4
    assert (again.entries[0].start, again.entries[0].end) == (4, 6)


def test_sequence_that_cannot_fit_alone() -> None:
    sched = make_sched(num_blocks=4, page_size=4)  # 16 token slots
    with pytest.raises(KVCapacityError) as err:
        sched.add(SeqState("long", list(range(17))))
    assert err.value.needed_tokens == 17 and err.value.capacity_tokens == 16
    grows, ok = SeqState("grows", list(range(10))), SeqState("ok", [1, 2])
    sched.add(grows)
    sched.add(ok)
    failed = []
    for _ in range(20):
        batch = sched.schedule()
        failed.extend(batch.failed)
        for s in batch.seqs:
            sched.append(s, 0)
            if s is ok and s.num_output_tokens == 3:
                sched.finish(s)
        check_invariants(sched)
        if not sched.has_work:
            break
    assert failed == [grows] and isinstance(grows.error, KVCapacityError)
    assert grows.finish_reason == "error" and grows.num_tokens == 17
    assert ok.is_finished and ok.error is None
    assert sched.stats.failed == 1


def test_admission_is_by_need_not_by_max_new_tokens() -> None:
    """Issue 13 item 13: nothing is reserved for tokens a sequence may never generate.
    A 10-token prompt in a 16-slot pool is admitted whatever its max_new_tokens, grows a
    slot per token, and finishes when its (short) answer ends."""
    sched = make_sched(num_blocks=4, page_size=4)
    seq = SeqState("generous", list(range(10)))  # e.g. max_new_tokens=10_000, answer of 3
    sched.add(seq)
    for _ in range(3):
        batch = sched.schedule()
        assert not batch.failed and batch.seqs == [seq]
        sched.append(seq, 0)
    sched.finish(seq)
    assert seq.error is None and seq.num_output_tokens == 3 and not sched.has_work


def test_a_prompt_that_fills_the_context_is_refused() -> None:
    sched = make_sched(max_context=8)
    with pytest.raises(ContextLengthError) as err:
        sched.add(SeqState("long", list(range(8))))
    assert err.value.prompt_tokens == 8 and err.value.context_length == 8
    assert isinstance(err.value, BackendError)
    sched.add(SeqState("fits", list(range(7))))  # room for one generated token
    assert sched.has_work
    with pytest.raises(ValueError):
        SchedulerConfig(max_context=1)


def test_abort_a_waiting_sequence() -> None:
    sched = make_sched()
    s = SeqState("s", [1, 2])
    sched.add(s)
    sched.finish(s, "abort")
    assert not sched.has_work and s.finish_reason == "abort" and s.blocks == []


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(max_running_seqs=0)
    with pytest.raises(ValueError):
        SchedulerConfig(policy="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Scheduler(BlockPool(4, page_size=4), RadixCache(1))


# -- property: a random workload always completes within budget ----------------------------------
workload = st.fixed_dictionaries({
    "page_size": st.sampled_from([1, 2, 4]),
    "num_blocks": st.integers(4, 40),
    "prefixes": st.lists(st.lists(st.integers(0, 3), max_size=24), min_size=1, max_size=3),
    "seqs": st.lists(st.tuples(st.integers(0, 2), st.integers(1, 8), st.integers(1, 12),
                               st.booleans(), st.integers(0, 6)), min_size=1, max_size=12),
    "config": st.builds(SchedulerConfig, max_running_seqs=st.integers(1, 8),
                        max_prefill_tokens=st.integers(1, 64),
                        policy=st.sampled_from(["lpm", "fcfs"]),
                        starvation_limit=st.integers(1, 4),
                        in_batch_prefix_threshold=st.sampled_from([0, 1, 4])),
    "disabled": st.booleans(),
    "forced_p": st.sampled_from([0.0, 0.3]),
    "max_draft": st.sampled_from([0, 3]),
    "seed": st.integers(0, 2**16),
})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload)
def test_every_sequence_finishes_within_budget(w: dict) -> None:
    page, pool = w["page_size"], BlockPool(w["num_blocks"], page_size=w["page_size"])
    sched = Scheduler(pool, RadixCache(page, disabled=w["disabled"]), w["config"])
    rng = random.Random(w["seed"])
    capacity = pool.capacity_tokens
    targets: dict[object, int] = {}
    added: list[SeqState] = []
    arrivals: dict[int, list[SeqState]] = {}
    for i, (pi, extra, out, _declare, arrive) in enumerate(w["seqs"]):
        prefixes = w["prefixes"]
        prompt = prefixes[pi % len(prefixes)] + [100 + i] * extra
        seq = SeqState(i, prompt)
        targets[i] = out
        arrivals.setdefault(arrive, []).append(seq)

    def add(seq: SeqState) -> None:
        try:
            sched.add(seq)
        except KVCapacityError:  # only a prompt larger than the pool is refused up front
            assert seq.num_tokens > capacity
        else:
            added.append(seq)

    drafts: dict[object, int] = {}  # speculative tokens appended, not yet verified
    # continuous batching: some sequences arrive while others run
    for seq in arrivals.pop(0, []):
        add(seq)
    step = 0
    while arrivals or sched.has_work:
        step += 1
        assert step < 5000, "scheduler made no progress"
        for seq in arrivals.pop(step, []):
            add(seq)
        if not sched.has_work:
            continue
        batch = sched.schedule()
        check_invariants(sched)
        for s in batch.preempted:  # the engine drops a preempted sequence's unverified draft
            sched.truncate(s, drafts.pop(s.seq_id, 0))
        check_invariants(sched)
        for e in batch.entries:
            s = e.seq
            # speculative tokens drafted last step were computed by this pass: reject some
            d = drafts.pop(s.seq_id, 0)
            sched.truncate(s, rng.randint(0, d))
            sched.append(s, rng.randrange(4))
            while rng.random() < w["forced_p"] and s.num_output_tokens < targets[s.seq_id]:
                sched.append(s, rng.randrange(4), forced=True)
            if s.num_output_tokens >= targets[s.seq_id]:
                sched.truncate(s, s.num_output_tokens - targets[s.seq_id])
                sched.finish(s)
                continue
            # as the engine: no more than the room left before the last, sampled token
            d = max(min(rng.randint(0, w["max_draft"]), targets[s.seq_id] - s.num_output_tokens - 1), 0)
            for _ in range(d):
                sched.append(s, rng.randrange(4))
            drafts[s.seq_id] = d
        check_invariants(sched)
    for seq in added:
        assert seq.is_finished
        if seq.error is None:
            assert seq.num_output_tokens == targets[seq.seq_id]
        else:
            assert isinstance(seq.error, KVCapacityError)
            assert pool.blocks_for(seq.num_tokens) > pool.num_blocks
    assert sched.cache.protected_tokens == 0
    assert pool.num_used == len(sched.cache.blocks())
    st_ = sched.stats
    for name in ("preemptions", "failed", "evicted_tokens", "cached_tokens", "forced_tokens"):
        event(f"{name} > 0: {getattr(st_, name) > 0}")
    assert st_.finished + st_.failed == len(added)
    assert st_.prompt_tokens == sum(s.num_prompt_tokens for s in added)
