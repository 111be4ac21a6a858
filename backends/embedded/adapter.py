"""The embedded backend: a real small model in-process (CPU, or CUDA when present).

The default backend. It serves the whole :class:`~structgen.contract.backend.Backend` contract:
constrained generation (regex, JSON schema, choices, grammar via the llguidance engine in
:mod:`structgen.constraints`), ``select`` by prompt log-probabilities, streaming, and KV
reuse between the steps of a program (:class:`PrefixCache`).

Decoding, one request at a time under a lock (a continuous-batching scheduler can later
drive the same pieces): :class:`ModelRunner` runs the model, :class:`GenSequence` samples,
applies the constraint and checks stops. The constraint's bitmask for step ``t+1`` is
computed in a worker thread while the model runs step ``t`` (llguidance releases the
GIL, torch too), so constrained decoding costs about the same per token as free decoding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from structgen.backends.embedded.engine import Engine, EngineConfig
from structgen.backends.embedded.loader import load_model
from structgen.backends.embedded.prefix_cache import PrefixCache, common_prefix_len
from structgen.backends.embedded.runner import ModelRunner
from structgen.backends.embedded.sequence import GenSequence
from structgen.constraints.spec import ConstraintSpec
from structgen.contract.backend import (
    Backend,
    Capabilities,
    GenerateRequest,
    GenerateResult,
    SelectRequest,
    SelectResult,
    TextCallback,
)
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import BackendError, ConstraintError, ProgramError, StructgenError

__all__ = ["EmbeddedBackend"]

_SAMPLING = frozenset({
    "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature",
    "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
    "return_logprob", "top_logprobs_num", "return_text_in_logprobs", "seed",
})


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _pick_dtype(dtype: Any, device: str) -> torch.dtype:
    if dtype is None or dtype == "auto":  # "auto": the fastest dtype computed natively
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if dtype == "auto" and cpu_has_native_bf16() else torch.float32
    if isinstance(dtype, str):
        try:
            dtype = getattr(torch, dtype)
        except AttributeError:
            raise BackendError(f"unknown dtype {dtype!r}", backend="embedded") from None
    return dtype


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX): there a bf16 forward is
    faster than fp32 (SmolLM2 batch decode ~1.3x on a Zen 4). Without it bf16 is emulated
    and 3-4x slower (measured on an AVX2-only CPU), so fp32 stays the default there."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


class EmbeddedBackend(Backend):
    """SmolLM2-135M-Instruct (or any local HF causal LM / ``.gguf`` / hub id) in-process.

    ``device="auto"`` picks CUDA when available, else CPU; ``dtype=None`` picks float32 on
    CPU and bfloat16 (float16) on CUDA. ``dtype="auto"`` also picks bfloat16 on a CPU that
    computes it natively (AVX512-BF16 / AMX): faster there (P2), but bf16 logits depend on
    the batch's shape, so greedy outputs may then differ between a sequence decoded alone
    and in a batch, or with jump-forward on and off; float32 keeps them identical.
    ``prefix_cache_entries`` / ``prefix_cache_tokens`` bound the KV kept for reuse between
    program steps on the unbatched path.
    ``overlap_mask=False`` computes constraint masks inline (for benchmarking the overlap).

    ``batched=True`` (default, Llama-architecture models): requests from every thread,
    fork and batch item decode together in one :class:`Engine` -- radix prefix cache,
    continuous cache-aware scheduling, an owned forward pass with shared-prefix attention,
    jump-forward over forced tokens; ``engine=EngineConfig(...)`` sets its KV budget and
    switches. ``batched=False`` serves each request alone on transformers' own cache.
    """

    name = "embedded"
    capabilities = Capabilities(
        regex=True, tools=True, json_schema=True, grammar=True, choices=True, select="logprobs",
        prefix_cache=True, streaming=True, sampling=_SAMPLING)

    def __init__(self, model: Any = None, *, device: str = "auto", dtype: Any = None,
                 prefix_cache_entries: int = 8, prefix_cache_tokens: int = 16384,
                 overlap_mask: bool = True, batched: bool = True,
                 engine: EngineConfig | None = None):
        self.device = _pick_device(device)
        loaded = load_model(model, device=self.device, dtype=_pick_dtype(dtype, self.device))
        #: the batched engine (radix cache, continuous scheduler, owned forward); None runs
        #: each request alone on transformers' cache (the reference path)
        self._engine: Engine | None = None
        # the owned forward pass covers Llama-architecture models; others run unbatched
        if batched and getattr(loaded.model.config, "model_type", None) == "llama":
            self._engine = Engine(loaded.model, engine or EngineConfig())
        self.model_path = loaded.path
        self.tokenizer = loaded.tokenizer
        self._runner: ModelRunner | None = ModelRunner(
            loaded.model, prefix_cache=PrefixCache(prefix_cache_entries, prefix_cache_tokens))
        self.vocab_size = int(loaded.model.get_output_embeddings().weight.shape[0])
        self.overlap_mask = overlap_mask
        self._lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._compiler: Any = None
        tok = self.tokenizer
        eos: set[int] = set()
        for value in (tok.eos_token_id, getattr(loaded.model.generation_config, "eos_token_id", None)):
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        self.eos_token_ids = frozenset(eos)
        #: context for text without a prompt (unconditional select, empty prompts):
        #: the tokenizer's BOS, else its EOS (the document separator of BOS-less models)
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.start_token_id = int(start if start is not None else 0)

    # -- small helpers --------------------------------------------------------------
    def runner(self) -> ModelRunner:
        if self._runner is None:
            raise BackendError("backend is closed", backend=self.name)
        return self._runner

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` exactly as written: no BOS or other added special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _token_text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def compile(self, spec: ConstraintSpec) -> Any:
        """Compile ``spec`` for this model's tokenizer (cached); ConstraintError if malformed."""
        if self._compiler is None:
            from structgen.constraints.compiler import compiler_for

            self._compiler = compiler_for(self.tokenizer, n_vocab=self.vocab_size)
        try:
            return self._compiler.compile(spec)
        except StructgenError:
            raise
        except Exception as exc:  # llguidance / schema errors not mapped by the engine
            raise ConstraintError(f"cannot compile constraint: {exc}",
                                  constraint=spec.describe()) from exc

    def _mask_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="structgen-mask")
        return self._pool

    # -- generate ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        if self._engine is not None:
            return self._generate_batched(requests, on_text)
        results: list[GenerateResult | StructgenError] = []
        for i, request in enumerate(requests):
            try:
                results.append(self._generate_one(i, request, on_text))
            except StructgenError as exc:
                results.append(exc.with_context(program=request.program, variable=request.variable))
            except Exception as exc:
                err = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend=self.name,
                                   program=request.program, variable=request.variable)
                err.__cause__ = exc
                results.append(err)
        return results

    def _sequence(self, index: int, request: GenerateRequest, on_text: TextCallback | None,
                  prefix: str = "") -> GenSequence:
        self.check_generate(request)
        compiled = self.compile(request.constraint) if request.constraint is not None else None
        prompt_ids = self.encode(request.prompt) or [self.start_token_id]
        prefix_ids = self.encode(prefix) if prefix else []
        emit = _emitter(index, on_text) if on_text is not None else None
        seq = GenSequence(request, prompt_ids + prefix_ids, decode=self._decode, eos_ids=self.eos_token_ids,
                          vocab=self.vocab_size, compiled=compiled, emit=emit,
                          token_text=self._token_text)
        if prefix_ids and (seq.matcher is None or not seq.matcher.consume_many(prefix_ids)):
            raise ConstraintError(f"the output prefix {prefix[:80]!r} is not valid under the constraint")
        return seq

    def continue_generate(self, requests: Sequence[GenerateRequest],
                          prefixes: Sequence[str]) -> list[GenerateResult | StructgenError]:
        """Like :meth:`generate`, each output continuing a given start: ``prefixes[i]`` follows
        request i's prompt and its constraint has consumed it, so decoding resumes inside the
        constrained value (a retry keeping the valid part of a rejected output). A result's
        text is what follows the prefix."""
        if len(prefixes) != len(requests):
            raise ProgramError(f"{len(prefixes)} prefixes for {len(requests)} requests")
        if self._engine is None:
            out: list[GenerateResult | StructgenError] = []
            for i, (request, prefix) in enumerate(zip(requests, prefixes)):
                try:
                    out.append(self._generate_one(i, request, None, prefix))
                except Exception as exc:
                    out.append(self._as_error(exc, request))
            return out
        return self._generate_batched(requests, None, prefixes)

    def _generate_batched(self, requests: Sequence[GenerateRequest], on_text: TextCallback | None,
                          prefixes: Sequence[str] | None = None) -> list[GenerateResult | StructgenError]:
        """All requests (and those of concurrent callers) decode together in the engine."""
        results: list[GenerateResult | StructgenError | None] = [None] * len(requests)
        seqs: list[tuple[int, GenSequence]] = []
        for i, request in enumerate(requests):
            try:
                seqs.append((i, self._sequence(i, request, on_text, prefixes[i] if prefixes else "")))
            except Exception as exc:
                results[i] = self._as_error(exc, request)
        engine = self._engine
        if engine is None:
            raise BackendError("backend is closed", backend=self.name)
        outcomes = engine.generate([g for _, g in seqs]) if seqs else []
        for (i, gen), (err, counters) in zip(seqs, outcomes):
            request = requests[i]
            if err is not None:
                results[i] = err.with_context(program=request.program, variable=request.variable)
                continue
            try:
                results[i] = gen.result({"prompt_tokens": len(gen.prompt_ids), **counters})
            except Exception as exc:
                results[i] = self._as_error(exc, request)
        return results  # type: ignore[return-value]

    def _as_error(self, exc: BaseException, request: Any) -> StructgenError:
        if isinstance(exc, StructgenError):
            return exc.with_context(program=request.program, variable=request.variable)
        err = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend=self.name,
                           program=request.program, variable=request.variable)
        err.__cause__ = exc
        return err

    def warm(self, prefix: str) -> None:
        if self._engine is not None:
            self._engine.warm(self.encode(prefix))

    def _generate_one(self, index: int, request: GenerateRequest,
                      on_text: TextCallback | None, prefix: str = "") -> GenerateResult:
        seq = self._sequence(index, request, on_text, prefix)
        with self._lock:
            meta = self._decode_loop(seq)
        return seq.result(meta)

    def _decode_loop(self, seq: GenSequence) -> dict[str, Any]:
        """Prefill (reusing cached KV), then sample / accept / forward until finished."""
        runner = self.runner()
        meta: dict[str, Any] = {"prompt_tokens": len(seq.prompt_ids), "cached_tokens": 0}
        if seq.finished:
            return meta
        pending = self._start_mask(seq)
        try:
            with torch.inference_mode():  # logits are inference tensors, edited in place
                pre = runner.prefill(seq.prompt_ids)
                meta["cached_tokens"] = pre.reused
                logits = pre.logits
                while True:
                    if pending is not None:
                        pending.result()
                        pending = None
                    token = seq.pick(logits)
                    runner.counters.generated_tokens += 1
                    if seq.accept(token):
                        break
                    pending = self._start_mask(seq)
                    logits = runner.decode(pre.cache, token)  # overlaps with the mask thread
        finally:
            if pending is not None:
                pending.exception()  # never leave the worker touching a dead matcher
        runner.save(seq.kv_ids, pre.cache)
        return meta

    def _start_mask(self, seq: GenSequence) -> Future[None] | None:
        if not seq.constrained:
            return None
        if not self.overlap_mask:
            seq.compute_mask()
            return None
        return self._mask_pool().submit(seq.compute_mask)

    # -- select -----------------------------------------------------------------------
    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        results: list[SelectResult | StructgenError] = []
        for request in requests:
            try:
                self.check_select(request)
                results.append(self._select_one(request))
            except StructgenError as exc:
                results.append(exc.with_context(program=request.program, variable=request.variable))
            except Exception as exc:
                err = BackendError(f"select failed: {type(exc).__name__}: {exc}", backend=self.name,
                                   program=request.program, variable=request.variable)
                err.__cause__ = exc
                results.append(err)
        return results

    def choice_tokens(self, prompt: str, choices: Sequence[str]) -> tuple[list[int], list[list[int]], list[int]]:
        """``(prompt ids, per choice the full ids of prompt+choice, per choice where its tokens start)``.

        Prompt and choice are tokenized together; a choice's tokens are those after the
        longest common prefix with the prompt's own tokens, so a boundary merge (a prompt
        ending in a space, a choice sharing the prompt's last token) is scored as the model
        would write it.
        """
        prompt_ids = self.encode(prompt)
        fulls = [self.encode(prompt + c) for c in choices]
        starts = [common_prefix_len(prompt_ids, f) for f in fulls]
        return prompt_ids, fulls, starts

    def _select_one(self, request: SelectRequest) -> SelectResult:
        if not request.choices:
            raise ProgramError("select needs at least one choice")
        prompt_ids, fulls, starts = self.choice_tokens(request.prompt, request.choices)
        shared = min(starts)
        choice_ids = [f[k:] for f, k in zip(fulls, starts)]
        if self._engine is not None:
            return self._select_batched(request, prompt_ids, fulls, starts, shared, choice_ids)
        with self._lock:
            runner = self.runner()
            before = runner.counters.as_dict()
            if shared > 0:
                prefix, conts, skip = prompt_ids[:shared], [f[shared:] for f in fulls], shared
            else:  # nothing before the choices: score them after the start-of-text token
                prefix, conts, skip = [self.start_token_id], fulls, 0
            scored = runner.score(prefix, conts)
            cond = [lp[k - skip:] for lp, k in zip(scored, starts)]
            uncond = None
            if request.need_unconditional:
                uncond = runner.score([self.start_token_id], choice_ids)
            after = runner.counters.as_dict()
        meta = {"prompt_tokens": len(prompt_ids), "choice_token_ids": choice_ids,
                "cached_tokens": after["cached_tokens"] - before["cached_tokens"],
                "computed_tokens": after["computed_tokens"] - before["computed_tokens"]}
        return SelectResult(input_token_logprobs=cond, unconditional_token_logprobs=uncond, meta=meta)

    def _select_batched(self, request: SelectRequest, prompt_ids: list[int], fulls: list[list[int]],
                        starts: list[int], shared: int, choice_ids: list[list[int]]) -> SelectResult:
        engine = self._engine
        assert engine is not None
        before = engine.stats()
        if shared > 0:
            prefix, conts, skip = prompt_ids[:shared], [f[shared:] for f in fulls], shared
        else:
            prefix, conts, skip = [self.start_token_id], fulls, 0
        scored = engine.score(prefix, conts)
        cond = [lp[k - skip:] for lp, k in zip(scored, starts)]
        uncond = engine.score([self.start_token_id], choice_ids) if request.need_unconditional else None
        after = engine.stats()
        meta = {"prompt_tokens": len(prompt_ids), "choice_token_ids": choice_ids,
                "scored_tokens": after["scored_tokens"] - before["scored_tokens"]}
        return SelectResult(input_token_logprobs=cond, unconditional_token_logprobs=uncond, meta=meta)

    # -- the rest of the contract ----------------------------------------------------------
    def chat_template(self) -> ChatTemplate | None:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return None
        return ChatTemplate(lambda msgs: tok.apply_chat_template(msgs, tokenize=False),
                            name=f"{self.model_path} chat template",
                            render_tools=lambda msgs, tools: tok.apply_chat_template(msgs, tools=tools, tokenize=False),
                            source=tok.chat_template if isinstance(tok.chat_template, str) else None)

    def stats(self) -> Mapping[str, Any]:
        if self._engine is not None:
            return self._engine.stats()
        with self._lock:
            if self._runner is None:
                return {}
            out: dict[str, Any] = self._runner.counters.as_dict()
            out["prefix_cache_entries"] = len(self._runner.prefix_cache)
            out["prefix_cache_tokens"] = self._runner.prefix_cache.tokens
            return out

    def clear_prefix_cache(self) -> None:
        if self._engine is not None:
            self._engine.clear_cache()
        with self._lock:
            if self._runner is not None:
                self._runner.prefix_cache.clear()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        with self._lock:
            self._runner = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return f"<EmbeddedBackend {self.model_path} on {self.device}>"


def _emitter(index: int, on_text: TextCallback) -> Callable[[str], None]:
    def emit(delta: str) -> None:
        try:
            on_text(index, delta)
        except Exception as exc:
            raise ProgramError(f"the on_text callback raised {type(exc).__name__}: {exc}") from exc

    return emit
