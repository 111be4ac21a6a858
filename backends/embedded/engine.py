"""The batched decode engine: radix prefix cache + continuous scheduler + owned forward pass.

The :class:`~structgen.backends.embedded.protocol.DecodeEngine` implementation. Callers on
any thread hand :meth:`Engine.generate` a list of :class:`GenSequence` (each with its own
sampling parameters, stop rules and constraint matcher) and block until they finish. One
loop thread owns the model: every step it asks the :class:`~structgen.runtime.Scheduler`
for a batch (prefill of newly admitted sequences, longest cached prefix first, or one
decode token per running sequence), runs one :meth:`DecoderModel.forward` over it --
sequences that share a cached prefix read its KV once (cascade attention) -- and samples
each sequence's next token under its own mask. Sequences from different threads, forks
and batch items decode together; a finished one leaves the batch and a waiting one
joins at the next step. Constraint masks for the next step are computed in a worker
thread while the forward runs. Jump-forward over forced text: :mod:`.drafting`.

Isolation: everything done for one sequence in a step (sampling, its mask, stops,
forced runs, drafts) is guarded for that sequence alone -- an exception fails only the
sequence whose work raised. A sequence whose request's ``Cancellation`` is set (or that
:meth:`Engine.cancel` names, or whose waiting thread is interrupted) leaves at the next
step -- queued or running, its KV freed -- failing with RequestCancelled.

Memory: the KV pool has a fixed budget (``kv_tokens``). Sequences are admitted by need
(their prompt, then a slot per token); the scheduler evicts cached prefixes, queues or
preempts, so a batch larger than memory still completes. Only a sequence larger than
the whole pool fails (KVCapacityError), and a prompt that fills the model's context is
refused (ContextLengthError); output stops at the context (``finish_reason="length"``).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from structgen.backends.embedded import drafting
from structgen.backends.embedded.compute_thread import ComputeThread
from structgen.backends.embedded.generation import GenSequence
from structgen.backends.embedded.heap import HeapTrimmer
from structgen.backends.embedded.model import DecoderModel, SeqInput
from structgen.backends.embedded.protocol import Outcome
from structgen.backends.embedded.scoring import Scorer
from structgen.errors import BackendError, RequestCancelled, StructgenError
from structgen.runtime import BlockPool, RadixCache, Scheduler, SchedulerConfig, SeqState
from structgen.runtime.batch import BatchEntry

__all__ = ["KV_BUDGET_BYTES", "Engine", "EngineConfig"]

T = TypeVar("T")
log = logging.getLogger("structgen.embedded")


#: the KV pool's default size in bytes (``EngineConfig.kv_tokens=None``), as vLLM-CPU's
#: default ``VLLM_CPU_KVCACHE_SPACE`` of a few GiB holds it: 1 GiB is 46,603 tokens of
#: SmolLM2-135M in bfloat16 (23,040 bytes each), 23,301 in float32
KV_BUDGET_BYTES = 1 << 30


@dataclass(frozen=True)
class EngineConfig:
    """``kv_tokens``: KV budget in tokens, the pool's size (None: :data:`KV_BUDGET_BYTES`
    worth in the model's dtype). ``prefix_cache``: reuse cached prefixes across sequences
    (off = recompute every prompt). ``jump_forward``: append a constraint's forced tokens
    without sampling. ``max_running``: sequences decoding at once (512: on 2 cores with AMX,
    SmolLM2-135M in bfloat16 with the kernels of :mod:`.native`, one decode step of
    sequences with 60-79 own tokens behind a shared 389-token prefix took 0.56 ms per
    sequence at 512 and 0.62 ms at 256; at 64 a pass ran the matrix products at half the
    rate per row of 256, and batch extraction 1.47x slower -- ``bench/extract.py
    --alt-concurrency 256``). ``max_prefill_tokens``: tokens per prefill pass."""

    kv_tokens: int | None = None
    prefix_cache: bool = True
    jump_forward: bool = True
    max_running: int = 512
    max_prefill_tokens: int = 4096

    def __post_init__(self) -> None:
        for name in ("kv_tokens", "max_running", "max_prefill_tokens"):
            value = getattr(self, name)
            if name == "kv_tokens" and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int")


class _Job:
    """A caller's wait handle for one sequence (``gen`` None: warming a prefix)."""

    __slots__ = ("done", "draft", "error", "gen", "killed", "rt", "spans")

    def __init__(self, gen: GenSequence | None, rt: SeqState):
        self.gen = gen
        self.rt = rt
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.killed = False  # cancelled through Engine.cancel
        #: drafted tokens at the end of ``rt`` awaiting verification by the next pass
        self.draft: list[int] = []
        #: (forced text, index in the output where it starts) of drafts whose text the
        #: output has not covered yet
        self.spans: list[tuple[bytes, int]] = []

    @property
    def cancelled(self) -> bool:
        return self.killed or (self.gen is not None and self.gen.cancelled)


class Engine:
    """``thread``: the :class:`ComputeThread` that loaded ``hf_model``, if any (the engine
    takes it over: its torch work then runs on the thread that already ran some, see
    :mod:`.compute_thread`); else the engine starts its own."""

    def __init__(self, hf_model: Any, config: EngineConfig = EngineConfig(), *, dtype: Any = None,
                 thread: ComputeThread | None = None):
        self.config = config
        self._thread = thread or ComputeThread()
        try:
            self.model = self._thread.call(lambda: DecoderModel.from_hf(hf_model, dtype=dtype))
            #: the pool's size in tokens (config.kv_tokens, or KV_BUDGET_BYTES worth)
            self.kv_tokens = config.kv_tokens or max(1024, KV_BUDGET_BYTES // self.model.bytes_per_token)
            self.kv = self._thread.call(lambda: self.model.new_kv_pool(num_slots=self.kv_tokens))
        except BaseException:
            self._thread.stop()
            raise
        self.context_length = self.model.context_length
        self.pool = BlockPool(self.kv_tokens, page_size=1)
        self.cache = RadixCache(1, disabled=not config.prefix_cache)
        self.scheduler = Scheduler(self.pool, self.cache, SchedulerConfig(
            max_running_seqs=config.max_running, max_prefill_tokens=config.max_prefill_tokens,
            max_context=self.context_length))
        self.scorer = Scorer(self.model, self.kv, self.pool, self.cache)
        self.drafts = drafting.Drafts()
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._incoming: list[_Job] = []
        self._tasks: list[tuple[Callable[[], Any], Future[Any]]] = []  # run on the loop thread
        self._closed = False
        self._cancel_ids: set[int] = set()  # sequences named by cancel(), not yet dropped
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="structgen-mask")
        self._mask_future: Future[None] | None = None
        self._mask_jobs: set[int] = set()
        self.forward_passes = 0
        self.generated_tokens = 0
        self.draft_tokens = 0  # drafted (computed speculatively)
        self.draft_accepted = 0  # drafted and then chosen by the sampler
        self._heap = HeapTrimmer()  # freed activations go back to the OS every few hundred sequences
        self._loop_done = self._thread.submit(self._loop)

    # -- the protocol (any thread) -----------------------------------------------------------
    def generate(self, seqs: Sequence[GenSequence]) -> list[Outcome]:
        """Run ``seqs`` to completion; one :class:`Outcome` per sequence. Interrupted
        (KeyboardInterrupt in the waiting thread), it cancels them before re-raising."""
        jobs = [_Job(gen, SeqState(next(self._ids), list(gen.prompt_ids), payload=gen)) for gen in seqs]
        for job in jobs:
            gen = job.gen
            assert gen is not None
            if len(gen.prompt_ids) < self.context_length:
                gen.cap_total(self.context_length)
            if gen.finished:  # nothing to generate (max_new_tokens=0)
                job.done.set()
        self._submit([j for j in jobs if not j.done.is_set()])
        try:
            for job in jobs:
                job.done.wait()
        except BaseException:
            self.cancel(seqs)
            raise
        return [Outcome(_as_error(job.error) if job.error is not None else None,
                        {"cached_tokens": job.rt.cached_tokens,
                         "computed_tokens": job.rt.computed_tokens,
                         "forced_tokens": job.rt.forced_tokens}) for job in jobs]

    def warm(self, token_ids: Sequence[int]) -> None:
        """Compute and cache ``token_ids`` (a shared prefix) without sampling."""
        if len(token_ids) < 2 or self.cache.disabled or len(token_ids) >= self.context_length:
            return
        job = _Job(None, SeqState(next(self._ids), list(token_ids)))
        self._submit([job])
        job.done.wait()
        if job.error is not None:
            raise _as_error(job.error)

    def score(self, prefix: Sequence[int], conts: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probabilities of each continuation's tokens after ``prefix`` (shared KV)."""
        return self._call(lambda: self.scorer.score(list(prefix), [list(c) for c in conts]))

    def cancel(self, seqs: Sequence[GenSequence]) -> None:
        """Stop ``seqs`` at the next step; they fail with a cancellation error."""
        ids = {id(g) for g in seqs}
        with self._cond:
            self._cancel_ids |= ids
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        """Counters since start (select scoring included): tokens seen, reused from the
        cache and computed; forward passes; sampled + forced tokens; cache hit rate."""
        s, sc = self.scheduler.stats, self.scorer
        prompt = s.prompt_tokens + sc.prompt_tokens
        cached = s.cached_tokens + sc.cached_tokens
        return {"prompt_tokens": prompt, "cached_tokens": cached,
                # prompt positions the model computed (prefill and select scoring)
                "computed_tokens": s.prefill_computed_tokens + sc.scored_tokens,
                "prefill_computed_tokens": s.prefill_computed_tokens,
                "decode_computed_tokens": s.decode_computed_tokens,
                "cache_hit_rate": cached / prompt if prompt else 0.0,
                "forward_passes": self.forward_passes + sc.forward_passes,
                "generated_tokens": self.generated_tokens,
                "prefill_steps": s.prefill_steps, "decode_steps": s.decode_steps,
                "forced_tokens": s.forced_tokens, "draft_tokens": self.draft_tokens,
                "draft_accepted": self.draft_accepted, "preemptions": s.preemptions,
                "evicted_tokens": s.evicted_tokens, "scored_tokens": sc.scored_tokens,
                "cached_tree_tokens": self.cache.total_tokens, "heap_trims": self._heap.trims}

    def clear_cache(self) -> None:
        def clear() -> None:
            self.pool.free(self.cache.evict(self.cache.total_tokens))
        self._call(clear)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if not self._thread.is_current():
            try:
                self._loop_done.result(timeout=30)
            except Exception:  # a loop that did not end in time, or raised: the thread goes regardless
                log.warning("the engine loop did not end cleanly on close", exc_info=True)
        self._thread.stop(timeout=None if self._loop_done.done() else 0)
        self._masks.shutdown(wait=True)

    def _submit(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        with self._cond:
            if self._closed:
                raise BackendError("engine is closed", backend="embedded")
            self._incoming.extend(jobs)
            self._cond.notify_all()

    def _call(self, fn: Callable[[], T]) -> T:
        fut: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise BackendError("engine is closed", backend="embedded")
            self._tasks.append((fn, fut))
            self._cond.notify_all()
        return fut.result()

    # -- the loop thread -------------------------------------------------------------------
    def _loop(self) -> None:
        jobs: dict[int, _Job] = {}  # by id of the job's SeqState
        while True:
            with self._cond:
                while not (self._incoming or self._tasks or self.scheduler.has_work or self._closed):
                    self._cond.wait()
                if self._closed:
                    for job in [*jobs.values(), *self._incoming]:
                        job.error = BackendError("engine closed", backend="embedded")
                        job.done.set()
                    return
                incoming, self._incoming = self._incoming, []
                tasks, self._tasks = self._tasks, []
                killed, self._cancel_ids = self._cancel_ids, set()
            try:
                self._iteration(jobs, incoming, tasks, killed)
            except BaseException as exc:  # the loop never dies: what it holds fails
                for job in [*jobs.values(), *(j for j in incoming if not j.done.is_set())]:
                    self._end(jobs, job, exc, "error")

    def _iteration(self, jobs: dict[int, _Job], incoming: list[_Job],
                   tasks: list[tuple[Callable[[], Any], Future[Any]]], killed: set[int]) -> None:
        for fn, fut in tasks:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
        for job in incoming:
            try:
                if self._cancelled(job, killed):
                    raise _cancelled(job)
                self.scheduler.add(job.rt)
                jobs[id(job.rt)] = job
            except Exception as exc:
                job.error = exc
                job.done.set()
        for job in list(jobs.values()):  # cancelled sequences leave between steps
            try:
                if self._cancelled(job, killed):
                    self._end(jobs, job, _cancelled(job), "cancelled")
            except Exception as exc:
                self._end(jobs, job, exc, "error")
        if self.scheduler.has_work:
            try:
                with torch.inference_mode():  # logits are inference tensors, edited in place
                    self._step(jobs)
            except BaseException as exc:  # the model failed: every sequence in it fails
                for job in list(jobs.values()):
                    self._end(jobs, job, exc, "error")

    @staticmethod
    def _cancelled(job: _Job, killed: set[int]) -> bool:
        if job.gen is not None and id(job.gen) in killed:
            job.killed = True
        return job.cancelled

    def _end(self, jobs: dict[int, _Job], job: _Job, error: BaseException | None,
             reason: str = "stop") -> None:
        """Finish ``job``'s sequence (its computed KV goes to the cache) and wake its caller."""
        try:
            if not job.rt.is_finished and job.rt.arrival >= 0:
                self.scheduler.finish(job.rt, reason)
        except Exception:  # bookkeeping failed (a bug): the caller still gets its answer
            log.exception("finishing sequence %s failed", job.rt.seq_id)
        jobs.pop(id(job.rt), None)
        job.error = error
        self._heap.finished_one()  # counted before the caller wakes (stats read after are exact)
        job.done.set()

    def _step(self, jobs: dict[int, _Job]) -> None:
        batch = self.scheduler.schedule()
        for rt in batch.failed:
            job = jobs.pop(id(rt))
            job.error = rt.error
            job.done.set()
        for rt in batch.preempted:  # back to waiting: its unverified draft goes
            job = jobs[id(rt)]
            self.scheduler.truncate(rt, len(job.draft))
            job.draft = []
        entries: list[BatchEntry] = []
        inputs: list[SeqInput] = []
        for e in batch.entries:
            job = jobs[id(e.seq)]
            try:
                drafted = len(job.draft)
                inputs.append(SeqInput(token_ids=e.seq.token_ids[e.start:e.end],
                                       slots=self.pool.slot_mapping(e.seq.blocks, 0, e.end),
                                       logits=drafted + 1 if drafted else "last"))
                entries.append(e)
            except Exception as exc:
                e.seq.kv_len = e.start  # nothing computed: cache none of it
                self._end(jobs, job, exc, "error")
        if not entries:
            return
        try:
            fb = self.model.prepare(inputs)
            logits = self.model.forward(fb, self.kv)
        except BaseException:
            for e in entries:  # the pass wrote no trustworthy KV for these tokens
                e.seq.kv_len = e.start
            raise
        self.forward_passes += 1
        # the sampler and the masks work on CPU rows (one copy per step); a drafted
        # sequence gets its last len(draft) + 1 rows
        rows = fb.split(logits.float().cpu())
        sampling: list[tuple[_Job, torch.Tensor]] = []
        for e, r in zip(entries, rows, strict=True):
            job = jobs[id(e.seq)]
            if job.gen is None:  # a warmed prefix: computed and (on finishing) cached
                self._end(jobs, job, None)
            else:
                sampling.append((job, r))
        if not sampling:
            return
        self._masks_ready([job for job, _ in sampling])
        for job, r in sampling:
            try:
                finished = self._advance(job, r)
            except Exception as exc:  # this sequence's work raised: it alone fails
                self._end(jobs, job, exc, "error")
                continue
            if finished:
                self._end(jobs, job, None)
        pending = [job.gen for job, _ in sampling
                   if not job.done.is_set() and job.gen is not None and job.gen.constrained]
        if pending:  # the next step's masks, computed while the next forward runs
            self._mask_future = self._masks.submit(_compute_masks, pending)
            self._mask_jobs = {id(g) for g in pending}

    def _advance(self, job: _Job, rows: torch.Tensor) -> bool:
        """Sample ``job``'s next token(s) from its logit rows, append them (forced runs and
        drafts included); whether the sequence finished."""
        gen = job.gen
        assert gen is not None
        draft, job.draft = job.draft, []
        token, finished, accepted = drafting.verify(gen, rows, draft)
        self.generated_tokens += accepted + 1
        self.draft_accepted += accepted
        self.scheduler.truncate(job.rt, len(draft) - accepted)  # rejected drafts and their KV
        if finished:
            return True
        jump = self.config.jump_forward and drafting.may_jump(gen)
        forced: list[int] = []
        if jump:
            forced, finished = drafting.forced_run(gen)
            self.generated_tokens += len(forced)
            if finished:
                return True
        self.scheduler.append(job.rt, token)
        for tok in forced:
            self.scheduler.append(job.rt, tok, forced=True)
        if jump and drafting.may_jump(gen):
            job.spans = self.drafts.learn(gen, job.spans)
            tokens, span = self.drafts.draft(gen)
            if span is not None:
                job.spans.append(span)
            for tok in tokens:
                self.scheduler.append(job.rt, tok)
            job.draft = tokens
            self.draft_tokens += len(tokens)
        return False

    def _masks_ready(self, jobs: list[_Job]) -> None:
        fut = self._mask_future
        done_ids: set[int] = set()
        if fut is not None:
            fut.result()
            done_ids = self._mask_jobs
            self._mask_future = None
        _compute_masks([j.gen for j in jobs
                        if j.gen is not None and j.gen.constrained and id(j.gen) not in done_ids])


def _compute_masks(gens: list[GenSequence]) -> None:
    for g in gens:
        g.compute_mask_safely()  # an error stays with its sequence (raised when it samples)


def _cancelled(job: _Job) -> StructgenError:
    flag = job.gen.cancel if job.gen is not None else None
    if flag is not None and flag.cancelled:
        return flag.error()
    return RequestCancelled("cancelled before it finished (Engine.cancel)")


def _as_error(exc: BaseException) -> StructgenError:
    if isinstance(exc, StructgenError):
        return exc
    err = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend="embedded")
    err.__cause__ = exc
    return err
