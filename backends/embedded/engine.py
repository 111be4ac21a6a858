"""The batched engine: radix prefix cache + continuous scheduler + owned forward pass.

Callers on any thread hand :meth:`Engine.generate` a list of :class:`GenSequence` (each
with its own sampling parameters, stop rules and constraint matcher) and block until
they finish. One loop thread owns the model: every step it asks the
:class:`~structgen.runtime.Scheduler` for a batch (prefill of newly admitted sequences,
longest cached prefix first, or one decode token per running sequence), runs one
:meth:`LlamaModel.forward` over it -- sequences that share a cached prefix read its KV
once (cascade attention) -- and samples each sequence's next token under its own mask.
Sequences from different threads, forks and batch items decode together; a finished
one leaves the batch and a waiting one joins at the next step.

Jump-forward: when a sequence's constraint allows exactly one continuation (JSON keys,
punctuation), its forced tokens are appended at once and computed in the next single
forward pass instead of one pass each. The engine forces only whole tokens that every
tokenization shares; the forced text's tail (the last token, held back because it could
merge with the free text that follows) is *drafted*: its tokens (as the model split the
same text before, else canonical) are computed in the same pass, with logits at each, and each is kept only if the sampler, looking at
those logits under the constraint's mask, picks it -- then the next token comes from the
same pass too. A rejected draft is dropped with its KV. Sampling stays exactly what
token-by-token decoding would do (the sampler draws every token; a draft only saves the
pass when the draw agrees), so greedy outputs are identical.

Memory: the KV pool has a fixed budget (``kv_tokens``); the scheduler evicts cached
prefixes, queues or preempts, so a batch larger than memory still completes; only a
single sequence larger than the whole pool fails, with a typed error.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from structgen.backends.embedded.llama import LlamaModel, SeqInput
from structgen.backends.embedded.sequence import GenSequence
from structgen.errors import BackendError, StructgenError
from structgen.runtime import BlockPool, RadixCache, Scheduler, SchedulerConfig, SeqState

__all__ = ["Engine", "EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """``kv_tokens``: KV budget in tokens (the pool's size; SmolLM2-135M in fp32 takes
    45 KiB per token, so the default 16,384 is 0.7 GiB). ``prefix_cache``: reuse
    cached prefixes across sequences (off = recompute every prompt). ``jump_forward``:
    append a constraint's forced tokens without sampling. ``max_running``: sequences
    decoding at once. ``max_prefill_tokens``: tokens per prefill pass."""

    kv_tokens: int = 16384
    prefix_cache: bool = True
    jump_forward: bool = True
    max_running: int = 64
    max_prefill_tokens: int = 4096

    def __post_init__(self) -> None:
        for name in ("kv_tokens", "max_running", "max_prefill_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int")


class _Job:
    """A caller's wait handle for one sequence."""

    __slots__ = ("done", "draft", "error", "gen", "rt", "spans", "warm")

    def __init__(self, gen: GenSequence | None, rt: SeqState, warm: bool = False):
        self.gen = gen
        self.rt = rt
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.warm = warm
        #: drafted tokens at the end of ``rt`` awaiting verification by the next pass
        self.draft: list[int] = []
        #: (forced text, index in the output where it starts) of drafts whose text the
        #: output has not covered yet
        self.spans: list[tuple[bytes, int]] = []


class Engine:
    def __init__(self, hf_model: Any, config: EngineConfig = EngineConfig(), *, dtype: Any = None):
        self.config = config
        self.model = LlamaModel.from_hf(hf_model, dtype=dtype)
        self.pool = BlockPool(config.kv_tokens, page_size=1)
        self.kv = self.model.new_kv_pool(num_slots=config.kv_tokens)
        self.cache = RadixCache(1, disabled=not config.prefix_cache)
        self.scheduler = Scheduler(self.pool, self.cache, SchedulerConfig(
            max_running_seqs=config.max_running, max_prefill_tokens=config.max_prefill_tokens))
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._incoming: list[_Job] = []
        self._tasks: list[tuple[Any, Future[Any]]] = []  # closures run on the loop thread
        self._closed = False
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="structgen-mask")
        self.forward_passes = 0
        self.generated_tokens = 0
        self.draft_tokens = 0  # drafted (computed speculatively)
        self.draft_accepted = 0  # drafted and then chosen by the sampler
        # forced text -> the tokens the model chose for it last time (the model often
        # splits JSON punctuation differently from the canonical tokenization)
        self._tokenizations: dict[bytes, tuple[int, ...]] = {}
        # select scoring runs beside the scheduler: its own prompt / cached / computed counts
        self.scored_tokens = 0
        self._score_prompt = 0
        self._score_cached = 0
        self._mask_future: Future[None] | None = None
        self._mask_jobs: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="structgen-engine", daemon=True)
        self._thread.start()

    # -- callers (any thread) --------------------------------------------------------------
    def generate(self, seqs: Sequence[GenSequence]) -> list[tuple[StructgenError | None, dict[str, int]]]:
        """Run ``seqs`` to completion; per sequence ``(None or the error it failed with,
        its KV counters: cached_tokens, computed_tokens, forced_tokens)``."""
        jobs = []
        for gen in seqs:
            rt = SeqState(next(self._ids), list(gen.prompt_ids), max_new_tokens=gen.params.max_new_tokens,
                            payload=gen)
            jobs.append(_Job(gen, rt))
        for job in jobs:
            if job.gen.finished:  # type: ignore[union-attr]  # nothing to generate (max_new_tokens=0)
                job.done.set()
        self._submit([j for j in jobs if not j.done.is_set()])
        out: list[tuple[StructgenError | None, dict[str, int]]] = []
        for job in jobs:
            job.done.wait()
            counters = {"cached_tokens": job.rt.cached_tokens, "computed_tokens": job.rt.computed_tokens,
                        "forced_tokens": job.rt.forced_tokens}
            out.append((_as_error(job.error) if job.error is not None else None, counters))
        return out

    def warm(self, token_ids: Sequence[int]) -> None:
        """Compute and cache ``token_ids`` (a shared prefix) without sampling."""
        if len(token_ids) < 2 or self.cache.disabled:
            return
        job = _Job(None, SeqState(next(self._ids), list(token_ids), max_new_tokens=1), warm=True)
        self._submit([job])
        job.done.wait()
        if job.error is not None:
            raise _as_error(job.error)

    def score(self, prefix: Sequence[int], conts: Sequence[Sequence[int]]) -> list[list[float]]:
        """Log-probabilities of each continuation's tokens after ``prefix`` (shared KV)."""
        return self._call(lambda: self._score(list(prefix), [list(c) for c in conts]))

    def stats(self) -> dict[str, Any]:
        """Counters since start (select scoring included): tokens seen, reused from the
        cache and computed; forward passes; sampled + forced tokens; cache hit rate."""
        s = self.scheduler.stats
        prompt = s.prompt_tokens + self._score_prompt
        cached = s.cached_tokens + self._score_cached
        return {"prompt_tokens": prompt, "cached_tokens": cached,
                # prompt positions the model computed (prefill and select scoring)
                "computed_tokens": s.prefill_computed_tokens + self.scored_tokens,
                "prefill_computed_tokens": s.prefill_computed_tokens,
                "decode_computed_tokens": s.decode_computed_tokens,
                "cache_hit_rate": cached / prompt if prompt else 0.0,
                "forward_passes": self.forward_passes, "generated_tokens": self.generated_tokens,
                "prefill_steps": s.prefill_steps, "decode_steps": s.decode_steps,
                "forced_tokens": s.forced_tokens, "draft_tokens": self.draft_tokens,
                "draft_accepted": self.draft_accepted, "preemptions": s.preemptions,
                "evicted_tokens": s.evicted_tokens, "scored_tokens": self.scored_tokens,
                "cached_tree_tokens": self.cache.total_tokens}

    def clear_cache(self) -> None:
        def clear() -> None:
            self.pool.free(self.cache.evict(self.cache.total_tokens))
        self._call(clear)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self._masks.shutdown(wait=True)

    def _submit(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        with self._cond:
            if self._closed:
                raise BackendError("engine is closed", backend="embedded")
            self._incoming.extend(jobs)
            self._cond.notify_all()

    def _call(self, fn: Any) -> Any:
        fut: Future[Any] = Future()
        with self._cond:
            if self._closed:
                raise BackendError("engine is closed", backend="embedded")
            self._tasks.append((fn, fut))
            self._cond.notify_all()
        return fut.result()

    # -- the loop thread -------------------------------------------------------------------
    def _loop(self) -> None:
        jobs: dict[int, _Job] = {}
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
            for fn, fut in tasks:
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
            for job in incoming:
                try:
                    self.scheduler.add(job.rt)
                    jobs[id(job.rt)] = job
                except StructgenError as exc:
                    job.error = exc
                    job.done.set()
            if self.scheduler.has_work:
                try:
                    with torch.inference_mode():  # logits are inference tensors, edited in place
                        self._step(jobs)
                except BaseException as exc:
                    for job in list(jobs.values()):
                        if not job.rt.is_finished:
                            self.scheduler.finish(job.rt, "error")
                        job.error = exc
                        job.done.set()
                    jobs.clear()

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
        if not batch.entries:
            return
        inputs = []
        for e in batch.entries:
            toks = e.seq.token_ids
            drafted = len(jobs[id(e.seq)].draft)
            inputs.append(SeqInput(token_ids=toks[e.start:e.end],
                                   slots=self.pool.slot_mapping(e.seq.blocks, 0, e.end),
                                   logits=drafted + 1 if drafted else "last"))
        fb = self.model.prepare(inputs)
        logits = self.model.forward(fb, self.kv)
        self.forward_passes += 1
        # the sampler and the masks work on CPU rows (one copy per step); a drafted
        # sequence gets its last len(draft) + 1 rows
        rows = fb.split(logits.float().cpu())
        sampling: list[tuple[_Job, int]] = []
        for i, e in enumerate(batch.entries):
            job = jobs[id(e.seq)]
            if job.warm:
                self.scheduler.finish(e.seq)
                jobs.pop(id(e.seq))
                job.done.set()
            else:
                sampling.append((job, i))
        if sampling:
            self._masks_ready([job for job, _ in sampling])
        for job, i in sampling:
            gen = job.gen
            assert gen is not None
            draft, job.draft = job.draft, []
            forced: list[int] = []
            try:
                token, finished = self._verify(job, rows[i], draft)
                if not finished and self.config.jump_forward and _may_jump(gen):
                    forced, finished = _forced_run(gen)
                    self.generated_tokens += len(forced)
            except BaseException as exc:
                job.error = exc
                finished, forced = True, []
            if finished:
                self.scheduler.finish(job.rt)
                jobs.pop(id(job.rt))
                job.done.set()
                continue
            self.scheduler.append(job.rt, token)
            for tok in forced:
                self.scheduler.append(job.rt, tok, forced=True)
            if self.config.jump_forward and _may_jump(gen):
                self._draft(job)
        pending = [job for job, _ in sampling if not job.done.is_set() and job.gen.constrained]  # type: ignore[union-attr]
        if pending:  # the next step's masks, computed while the next forward runs
            self._mask_future = self._masks.submit(_compute_masks, [j.gen for j in pending])
            self._mask_jobs = {id(j) for j in pending}

    def _verify(self, job: _Job, rows: torch.Tensor, draft: list[int]) -> tuple[int, bool]:
        """Sample from ``rows`` (``len(draft) + 1`` of them: the logits before each
        drafted token, then after the last) token by token, each under its mask, while
        the sampler picks the drafted token. ``(the next token, finished)``: the token is
        the first one not drafted -- new, its KV not computed yet. Rejected drafted
        tokens are dropped from the sequence with their KV."""
        gen = job.gen
        assert gen is not None
        for i, row in enumerate(rows):
            if i:
                gen.compute_mask()  # the mask after the accepted draft tokens
            token = gen.pick(row)
            self.generated_tokens += 1
            finished = gen.accept(token)
            if i < len(draft) and token == draft[i] and not finished:
                self.draft_accepted += 1
                continue
            self.scheduler.truncate(job.rt, len(draft) - i)
            return token, finished
        raise AssertionError("unreachable: the last row is never drafted")

    def _draft(self, job: _Job) -> None:
        """Append the constraint's forced text, as the model is likely to tokenize it, for
        the next pass to verify (:meth:`_verify`)."""
        gen = job.gen
        assert gen is not None and gen.matcher is not None
        m = gen.matcher
        pending = []
        for text, start in job.spans:  # learn how the model tokenized earlier forced text
            seen = b""
            for j, tok in enumerate(gen.out_ids[start:]):
                seen += m.token_bytes([tok])
                if len(seen) >= len(text):
                    if seen == text:
                        if len(self._tokenizations) >= _MAX_TOKENIZATIONS:
                            self._tokenizations.clear()
                        self._tokenizations[text] = tuple(gen.out_ids[start:start + j + 1])
                    break
            else:
                pending.append((text, start))
        job.spans = pending
        text = m.forced_text()
        if not text:
            return
        job.spans.append((text, len(gen.out_ids)))
        # no more than the tokens left before max_new_tokens, the last one sampled
        room = min(_MAX_DRAFT, gen.params.max_new_tokens - len(gen.out_ids) - 1)
        job.draft = m.draft_tokens(self._tokenizations.get(text))[:max(room, 0)]
        for tok in job.draft:
            self.scheduler.append(job.rt, tok)
        self.draft_tokens += len(job.draft)

    def _masks_ready(self, jobs: list[_Job]) -> None:
        fut = self._mask_future
        done_ids: set[int] = set()
        if fut is not None:
            fut.result()
            done_ids = self._mask_jobs
            self._mask_future = None
        _compute_masks([j.gen for j in jobs if j.gen is not None and j.gen.constrained and id(j) not in done_ids])

    def _score(self, prefix: list[int], conts: list[list[int]]) -> list[list[float]]:
        """Runs on the loop thread. One pass computes the prefix (through the cache) and
        gives every continuation's first-token logits; a second pass runs all
        continuations' remaining tokens together against the shared prefix KV."""
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
                fb = self.model.prepare([SeqInput(prefix[match.length:], prefix_slots, logits="last")])
                first = torch.log_softmax(self.model.forward(fb, self.kv)[0].float(), dim=-1)
                self.forward_passes += 1
                inputs = []
                for c in conts:
                    if len(c) > 1:
                        extra = self.pool.allocate(len(c) - 1) or []
                        held += extra
                        inputs.append(SeqInput(c[:-1], prefix_slots + list(
                            self.pool.slot_mapping(extra, 0, len(c) - 1)), logits="all"))
                rest = iter([])
                if inputs:
                    fb = self.model.prepare(inputs)
                    rest = iter(fb.split(self.model.forward(fb, self.kv)))
                    self.forward_passes += 1
                result = []
                for c in conts:
                    lps = [float(first[c[0]])] if c else []
                    if len(c) > 1:
                        rows = torch.log_softmax(next(rest).float(), dim=-1)
                        lps += [float(rows[j, t]) for j, t in enumerate(c[1:])]
                    result.append(lps)
            self.scored_tokens += new + sum(tails)
            self._score_prompt += len(prefix)
            self._score_cached += match.length
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


_MAX_DRAFT = 16  # drafted tokens per sequence and pass
_MAX_TOKENIZATIONS = 4096  # remembered tokenizations of forced text


def _may_jump(gen: GenSequence) -> bool:
    # forced and drafted tokens have no sampled logprob of their own
    return gen.matcher is not None and not gen.params.return_logprob and not gen.finished


def _forced_run(gen: GenSequence) -> tuple[list[int], bool]:
    """Accept the tokens the constraint forces after the last sampled one (llguidance's
    fast-forward tokens: whole tokens only, so greedy output is unchanged).
    ``(tokens, finished)``."""
    forced: list[int] = []
    assert gen.matcher is not None
    for tok in gen.matcher.forced_tokens():
        forced.append(tok)
        if gen.accept(tok):
            return forced, True
    return forced, False


def _compute_masks(gens: list[Any]) -> None:
    for g in gens:
        g.compute_mask()


def _as_error(exc: BaseException) -> StructgenError:
    if isinstance(exc, StructgenError):
        return exc
    err = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend="embedded")
    err.__cause__ = exc
    return err
