"""A cache-aware continuous-batching scheduler over a block pool and a radix cache.

Protocol (one forward pass per :meth:`Scheduler.schedule` call)::

    sched.add(seq)                       # queue a prompt
    while sched.has_work:
        batch = sched.schedule()         # allocates KV for every entry
        # run the model on tokens[entry.start:entry.end] of each entry, then for each
        # entry's sequence either append the sampled token or finish it:
        sched.append(seq, token)         # or sched.finish(seq)
        # batch.failed: sequences that can never fit (seq.error is a KVCapacityError)

Prefill batches take priority over decode. Waiting sequences are admitted
longest-cached-prefix first (SGLang's LPM policy), ties in arrival order; a sequence
passed over ``starvation_limit`` times goes first. A sequence whose uncached prefix
is shared with one already admitted to the same batch waits one step, so it reuses
that prefix instead of computing it again. Prompts are inserted into the radix tree
after their prefill and whole sequences when they finish.

Admission is by need: a sequence takes KV for its prompt, then one slot per token as it
grows -- never a reservation for the most it may generate, so a generous
``max_new_tokens`` costs nothing until used. Memory is never an error: when the pool is
short the scheduler evicts unlocked cached prefixes, then stops admitting (prefill) or
preempts the most recently admitted running sequence (decode). Only a sequence that
cannot fit alone fails, with :class:`~structgen.runtime.errors.KVCapacityError` (raised
by :meth:`Scheduler.add` for a prompt larger than the pool, else attached to
``seq.error`` and listed in ``batch.failed`` when it outgrows the pool), and a prompt
that fills the model's context (``max_context``) is refused by :meth:`Scheduler.add`
with :class:`~structgen.runtime.errors.ContextLengthError`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

from structgen.runtime.batch import Batch, BatchEntry
from structgen.runtime.block_pool import BlockPool
from structgen.runtime.errors import ContextLengthError, KVCacheError, KVCapacityError
from structgen.runtime.radix_cache import RadixCache
from structgen.runtime.seq_state import SeqState, SequenceStatus
from structgen.runtime.stats import SchedulerStats

__all__ = ["Scheduler", "SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler limits, validated on construction.

    ``max_running_seqs``: sequences holding KV at once. ``max_prefill_tokens``: tokens
    computed by one prefill batch (a single longer prompt is still admitted alone).
    ``policy``: ``"lpm"`` (longest prefix match) or ``"fcfs"``. ``starvation_limit``:
    prefill batches a waiting sequence may be passed over before it goes first.
    ``in_batch_prefix_threshold``: shared uncached tokens that make a sequence wait for
    a batch-mate's prefix (0 turns this off). ``lpm_max_waiting``: above this many
    waiting sequences LPM falls back to FCFS (matching every prompt gets costly).
    ``max_context``: positions one sequence may use (the model's context length); a
    prompt of that many tokens or more is refused (None: no limit).
    """

    max_running_seqs: int = 256
    max_prefill_tokens: int = 8192
    policy: Literal["lpm", "fcfs"] = "lpm"
    starvation_limit: int = 8
    in_batch_prefix_threshold: int = 32
    lpm_max_waiting: int = 256
    max_context: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_running_seqs", "max_prefill_tokens", "starvation_limit",
                     "lpm_max_waiting"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.in_batch_prefix_threshold < 0:
            raise ValueError("in_batch_prefix_threshold must be >= 0")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2 or None, got {self.max_context!r}")
        if self.policy not in ("lpm", "fcfs"):
            raise ValueError(f"policy must be 'lpm' or 'fcfs', got {self.policy!r}")


class Scheduler:
    """Continuous batching over ``pool`` and ``cache``. See the module docstring.

    Not thread-safe: one driver loop owns a scheduler. The KV of a batch's entries must
    be computed before the next :meth:`schedule` call, which caches freshly prefilled
    prompts in the radix tree for later sequences to reuse.
    """

    def __init__(self, pool: BlockPool, cache: RadixCache | None = None,
                 config: SchedulerConfig | None = None) -> None:
        self.pool = pool
        self.cache = cache if cache is not None else RadixCache(pool.page_size)
        if self.cache.page_size != pool.page_size:
            raise ValueError(f"cache page size {self.cache.page_size} != pool page size "
                             f"{pool.page_size}")
        self.config = config or SchedulerConfig()
        self.stats = SchedulerStats()
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self._arrivals = 0
        self._just_prefilled: list[SeqState] = []

    # -- queries ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        """Whether any sequence is waiting or running."""
        return bool(self.waiting or self.running)

    # -- public state changes ----------------------------------------------------------------
    def add(self, seq: SeqState) -> None:
        """Queue a WAITING sequence. Raises :class:`ContextLengthError` if its prompt fills
        the context, :class:`KVCapacityError` if the prompt alone exceeds the pool."""
        if seq.status is not SequenceStatus.WAITING or seq.arrival >= 0:
            raise KVCacheError(f"sequence {seq.seq_id!r} was already added")
        limit = self.config.max_context
        if limit is not None and seq.num_tokens >= limit:
            raise ContextLengthError(seq.seq_id, prompt_tokens=seq.num_tokens, context_length=limit)
        needed = seq.num_tokens
        if self.pool.blocks_for(needed) > self.pool.num_blocks:
            raise KVCapacityError(seq.seq_id, needed_tokens=needed,
                                  capacity_tokens=self.pool.capacity_tokens)
        seq.arrival = self._arrivals
        self._arrivals += 1
        self.stats.prompt_tokens += seq.num_prompt_tokens
        self.waiting.append(seq)

    def append(self, seq: SeqState, token_id: int, *, forced: bool = False) -> None:
        """Append an output token to a running sequence (counted if ``forced``)."""
        if seq.status is not SequenceStatus.RUNNING:
            raise KVCacheError(f"append to sequence {seq.seq_id!r} in status {seq.status.name}")
        seq.append(token_id, forced=forced)
        if forced:
            self.stats.forced_tokens += 1

    def truncate(self, seq: SeqState, n: int) -> None:
        """Drop the last ``n`` output tokens (rejected speculative tokens). KV already
        computed for them is released: whole pages past the new length go back to the
        pool. Only the sequence's own pages can be dropped, never the tree's."""
        if not 0 <= n <= seq.num_output_tokens:
            raise KVCacheError(f"cannot truncate {n} of {seq.num_output_tokens} output tokens "
                               f"of sequence {seq.seq_id!r}")
        if n == 0:
            return
        new_len = seq.num_tokens - n
        if seq.status is SequenceStatus.RUNNING and seq.kv_len > new_len:
            keep = self.pool.blocks_for(new_len)
            if keep < seq.num_tree_blocks:
                raise KVCacheError(f"truncating sequence {seq.seq_id!r} to {new_len} tokens "
                                   "would cut into cached prefix pages")
            self.pool.free(seq.blocks[keep:])
            del seq.blocks[keep:]
            seq.kv_len = new_len
        del seq.output_token_ids[len(seq.output_token_ids) - n:]

    def finish(self, seq: SeqState, reason: str = "stop") -> None:
        """Finish (or abort) a sequence: cache its tokens, release its KV and lock."""
        if seq.status is SequenceStatus.FINISHED:
            raise KVCacheError(f"sequence {seq.seq_id!r} is already finished")
        self._retire(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.stats.finished += 1

    def schedule(self) -> Batch:
        """Choose the next forward pass: prefill if a waiting sequence fits, else decode."""
        self._cache_prefilled()
        failed: list[SeqState] = []
        entries = self._schedule_prefill(failed)
        if entries:
            self.stats.prefill_steps += 1
            return Batch("prefill", tuple(entries), tuple(failed))
        preempted: list[SeqState] = []
        entries = self._schedule_decode(failed, preempted)
        if entries:
            self.stats.decode_steps += 1
            return Batch("decode", tuple(entries), tuple(failed), tuple(preempted))
        return Batch("idle", (), tuple(failed), tuple(preempted))

    # -- prefill ----------------------------------------------------------------------------
    def _prefill_order(self) -> list[SeqState]:
        """Starving sequences first (FCFS), then longest cached prefix, ties by arrival."""
        limit = self.config.starvation_limit
        starving = sorted((s for s in self.waiting if s.times_skipped >= limit),
                          key=lambda s: s.arrival)
        rest = [s for s in self.waiting if s.times_skipped < limit]
        if self.config.policy == "lpm" and len(rest) <= self.config.lpm_max_waiting:
            lens = {id(s): self.cache.peek_prefix_len(s.token_ids[:-1]) for s in rest}
            rest.sort(key=lambda s: (-lens[id(s)], s.arrival))
        else:
            rest.sort(key=lambda s: s.arrival)
        return starving + rest

    def _schedule_prefill(self, failed: list[SeqState]) -> list[BatchEntry]:
        cfg = self.config
        if not self.waiting or len(self.running) >= cfg.max_running_seqs:
            return []
        budget = cfg.max_prefill_tokens
        batch_tree = RadixCache(1) if cfg.in_batch_prefix_threshold else None
        try:
            return self._fill_prefill(budget, batch_tree, failed)
        finally:
            if batch_tree is not None:
                batch_tree.discard()  # freed now, not left as cyclic garbage

    def _fill_prefill(self, budget: int, batch_tree: RadixCache | None,
                      failed: list[SeqState]) -> list[BatchEntry]:
        cfg = self.config
        entries: list[BatchEntry] = []
        for seq in self._prefill_order():
            if len(self.running) >= cfg.max_running_seqs:
                break
            if self.pool.blocks_for(seq.num_tokens) > self.pool.num_blocks:
                self._fail(seq, seq.num_tokens, failed)
                continue
            prefix = seq.token_ids[:-1]
            cached = self.cache.peek_prefix_len(prefix)
            if entries and seq.num_tokens - cached > budget:
                break
            if (batch_tree is not None and seq.times_skipped < cfg.starvation_limit
                    and batch_tree.peek_prefix_len(prefix) - cached
                    >= cfg.in_batch_prefix_threshold):
                continue  # a batch-mate computes this prefix; reuse it next step
            if not self._admit(seq):
                break
            entries.append(BatchEntry(seq, seq.cached_prefix_len, seq.num_tokens))
            budget -= seq.num_tokens - seq.cached_prefix_len
            if batch_tree is not None:
                batch_tree.insert(prefix, [0] * len(prefix))
        if entries:
            for seq in self.waiting:
                seq.times_skipped += 1
        return entries

    def _admit(self, seq: SeqState) -> bool:
        """Reuse the cached prefix and allocate the rest; False (nothing held) if it won't fit."""
        prefix = seq.token_ids[:-1]
        match = self.cache.match_prefix(prefix, record=False)
        self.cache.lock(match.node)
        need = self.pool.blocks_for(seq.num_tokens) - len(match.blocks)
        if not self._make_room(need):
            self.cache.unlock(match.node)
            return False
        self.cache.record_lookup(match.length, len(prefix))
        own = self.pool.allocate(need)
        assert own is not None  # _make_room guaranteed the blocks
        seq.node, seq.blocks = match.node, match.blocks + own
        seq.num_tree_blocks = len(match.blocks)
        seq.cached_prefix_len = match.length
        seq.cached_tokens += match.length
        seq.computed_tokens += seq.num_tokens - match.length
        seq.kv_len = seq.num_tokens
        seq.status = SequenceStatus.RUNNING
        seq.times_skipped = 0
        self.waiting.remove(seq)
        self.running.append(seq)
        self._just_prefilled.append(seq)
        self.stats.cached_tokens += match.length
        self.stats.prefill_computed_tokens += seq.num_tokens - match.length
        return True

    def _cache_prefilled(self) -> None:
        """Insert the KV computed by the last prefill into the tree, so batch-mates reuse it."""
        if not self.cache.disabled:
            for seq in self._just_prefilled:
                if seq.status is SequenceStatus.RUNNING:
                    self._cache_running(seq)
        self._just_prefilled.clear()

    def _cache_running(self, seq: SeqState) -> None:
        """Hand a running sequence's full KV pages to the tree and lock them for it."""
        n = seq.kv_len // self.pool.page_size
        res = self.cache.insert(seq.token_ids[:n * self.pool.page_size], seq.blocks[:n])
        self.pool.free(res.redundant)
        seq.blocks[:n] = self.cache.path_blocks(res.node)
        self.cache.lock(res.node)
        if seq.node is not None:
            self.cache.unlock(seq.node)
        seq.node, seq.num_tree_blocks = res.node, n

    # -- decode -----------------------------------------------------------------------------
    def _schedule_decode(self, failed: list[SeqState],
                         preempted: list[SeqState]) -> list[BatchEntry]:
        entries: list[BatchEntry] = []
        queue = deque(s for s in self.running if s.num_tokens > s.kv_len)
        while queue:
            seq = queue.popleft()
            if self.pool.blocks_for(seq.num_tokens) > self.pool.num_blocks:
                self._fail(seq, seq.num_tokens, failed)
                continue
            need = self.pool.blocks_for(seq.num_tokens) - len(seq.blocks)
            while not self._make_room(need):
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                own = self.pool.allocate(need)
                assert own is not None
                seq.blocks.extend(own)
                entries.append(BatchEntry(seq, seq.kv_len, seq.num_tokens))
                seq.computed_tokens += seq.num_tokens - seq.kv_len
                self.stats.decode_computed_tokens += seq.num_tokens - seq.kv_len
                seq.kv_len = seq.num_tokens
        return entries

    def _preempt(self, seq: SeqState) -> None:
        """Send a running sequence back to the front of the queue; its KV goes to the cache."""
        self._retire(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    # -- memory -----------------------------------------------------------------------------
    def _make_room(self, need: int) -> bool:
        """Evict unlocked cache until ``need`` blocks are free; whether that succeeded."""
        short = need - self.pool.num_free
        if short > 0:
            freed = self.cache.evict(short * self.pool.page_size)
            self.pool.free(freed)
            self.stats.evicted_tokens += len(freed) * self.pool.page_size
        return self.pool.num_free >= need

    def _retire(self, seq: SeqState) -> None:
        """Take ``seq`` off its queue; cache its full KV pages, free the rest, drop its lock."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            return
        self.running.remove(seq)
        n = seq.kv_len // self.pool.page_size
        res = self.cache.insert(seq.token_ids[:n * self.pool.page_size], seq.blocks[:n])
        self.pool.free(res.redundant)
        self.pool.free(seq.blocks[n:])
        if seq.node is not None:
            self.cache.unlock(seq.node)
        seq.node, seq.blocks, seq.num_tree_blocks, seq.kv_len = None, [], 0, 0

    def _fail(self, seq: SeqState, needed: int, failed: list[SeqState]) -> None:
        self._retire(seq)
        seq.error = KVCapacityError(seq.seq_id, needed_tokens=needed,
                                    capacity_tokens=self.pool.capacity_tokens)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "error"
        self.stats.failed += 1
        failed.append(seq)
