"""The embedded backend: a real small model in-process (CPU, or CUDA when present).

The default backend. It serves the whole :class:`~structgen.contract.backend.Backend` contract:
constrained generation (regex, JSON schema, choices, grammar via the constraint engines in
:mod:`structgen.constraints`), ``select`` by prompt log-probabilities, streaming, and KV
reuse between the steps of a program, forks and batch items (a radix prefix cache).

This module only translates: each request becomes a
:class:`~structgen.backends.embedded.generation.GenSequence` (sampling, constraint, stops,
streaming) over token ids, and one decode engine
(:class:`~structgen.backends.embedded.protocol.DecodeEngine`, implemented by the batched
:class:`~structgen.backends.embedded.engine.Engine`) runs them -- requests from every
thread decode together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from structgen.backends.embedded.compute_thread import ComputeThread
from structgen.backends.embedded.dtype_choice import DtypeChoice, pick_cpu_dtype
from structgen.backends.embedded.engine import Engine, EngineConfig
from structgen.backends.embedded.generation import GenSequence
from structgen.backends.embedded.kernel_cache import bound_kernel_caches
from structgen.backends.embedded.loader import load_model
from structgen.backends.embedded.protocol import DecodeEngine
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


def _pick_dtype(dtype: Any, device: str) -> torch.dtype | None:
    """The dtype asked for; None where ``auto`` on the CPU must be measured
    (:func:`~structgen.backends.embedded.dtype_choice.pick_cpu_dtype`, on the model's thread)."""
    if dtype is None or dtype == "auto":  # "auto": the fastest dtype on this machine
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return None if dtype == "auto" else torch.float32
    if isinstance(dtype, str):
        try:
            dtype = getattr(torch, dtype)
        except AttributeError:
            raise BackendError(f"unknown dtype {dtype!r}", backend="embedded") from None
    if not isinstance(dtype, torch.dtype):
        raise BackendError(f"unknown dtype {dtype!r}", backend="embedded")
    return dtype


class EmbeddedBackend(Backend):
    """SmolLM2-135M-Instruct (or any local HF causal LM / ``.gguf`` / hub id of a family
    the engine runs: Llama, Mistral, Qwen2, Qwen3) in-process.

    ``device="auto"`` picks CUDA when available, else CPU; ``dtype=None`` picks float32 on
    CPU and bfloat16 (float16) on CUDA. ``dtype="auto"`` also picks bfloat16 on a CPU with
    a bf16 instruction set (AVX512-BF16 / AMX) where a short probe measures it faster than
    float32 (:mod:`~structgen.backends.embedded.dtype_choice`; :attr:`dtype_choice` says
    what it measured). bf16 logits depend on the batch's shape, so greedy outputs may then
    differ between a sequence decoded alone and in a batch, or with jump-forward on and
    off; float32 keeps them identical.
    ``engine=EngineConfig(...)`` sets the engine's KV budget and switches (prefix cache,
    jump-forward, batch limits). A model the engine cannot run raises BackendError
    naming what is missing.
    """

    name = "embedded"
    capabilities = Capabilities(
        regex=True, tools=True, json_schema=True, grammar=True, choices=True, select="logprobs",
        prefix_cache=True, streaming=True, sampling=_SAMPLING)

    def __init__(self, model: Any = None, *, device: str = "auto", dtype: Any = None,
                 engine: EngineConfig | None = None):
        self.device = _pick_device(device)
        asked = _pick_dtype(dtype, self.device)
        if self.device == "cpu" and asked in (torch.bfloat16, torch.float16):
            bound_kernel_caches()  # before the first oneDNN kernel: see kernel_cache
        # the model loads (and auto's dtype probe runs) on the engine's thread: one thread
        # runs all of its torch work (see compute_thread: a second one would slow every kernel)
        thread = ComputeThread()
        try:
            #: auto's measured choice on the CPU (None: the dtype was given, or CUDA's)
            self.dtype_choice: DtypeChoice | None = thread.call(pick_cpu_dtype) if asked is None else None
            torch_dtype = asked if self.dtype_choice is None else self.dtype_choice.dtype
            loaded = thread.call(lambda: load_model(model, device=self.device, dtype=torch_dtype))
        except BaseException:
            thread.stop()
            raise
        self.model_path = loaded.path
        self.tokenizer = loaded.tokenizer
        self.hf_model = loaded.model
        #: the decode engine every request runs on (BackendError if it cannot run the model)
        self._engine: DecodeEngine | None = Engine(loaded.model, engine or EngineConfig(), thread=thread)
        self.vocab_size = int(loaded.model.get_output_embeddings().weight.shape[0])
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
    @property
    def engine(self) -> DecodeEngine:
        if self._engine is None:
            raise BackendError("backend is closed", backend=self.name)
        return self._engine

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` exactly as written: no BOS or other added special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _token_text(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

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

    def _as_error(self, exc: BaseException, request: Any) -> StructgenError:
        if isinstance(exc, StructgenError):
            return exc.with_context(program=request.program, variable=request.variable)
        err = BackendError(f"generation failed: {type(exc).__name__}: {exc}", backend=self.name,
                           program=request.program, variable=request.variable)
        err.__cause__ = exc
        return err

    # -- generate ---------------------------------------------------------------------
    def _sequence(self, index: int, request: GenerateRequest, on_text: TextCallback | None,
                  prefix: str = "") -> GenSequence:
        self.check_generate(request)
        compiled = self.compile(request.constraint) if request.constraint is not None else None
        prompt_ids = self.encode(request.prompt) or [self.start_token_id]
        prefix_ids = self.encode(prefix) if prefix else []
        emit = _emitter(index, on_text) if on_text is not None else None
        seq = GenSequence(request, prompt_ids + prefix_ids, decode=self._decode, eos_ids=self.eos_token_ids,
                          vocab=self.vocab_size, compiled=compiled, emit=emit,
                          token_text=self._token_text, cancel=request.cancel)
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
        return self._run(requests, None, prefixes)

    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        """All requests (and those of concurrent callers) decode together in the engine."""
        return self._run(requests, on_text, None)

    def _run(self, requests: Sequence[GenerateRequest], on_text: TextCallback | None,
             prefixes: Sequence[str] | None) -> list[GenerateResult | StructgenError]:
        results: list[GenerateResult | StructgenError | None] = [None] * len(requests)
        seqs: list[tuple[int, GenSequence]] = []
        for i, request in enumerate(requests):
            try:
                seqs.append((i, self._sequence(i, request, on_text, prefixes[i] if prefixes else "")))
            except Exception as exc:
                results[i] = self._as_error(exc, request)
        outcomes = self.engine.generate([g for _, g in seqs]) if seqs else []
        for (i, gen), outcome in zip(seqs, outcomes, strict=True):
            request = requests[i]
            if outcome.error is not None:
                results[i] = outcome.error.with_context(program=request.program, variable=request.variable)
                continue
            try:
                results[i] = gen.result({"prompt_tokens": len(gen.prompt_ids), **outcome.counters})
            except Exception as exc:
                results[i] = self._as_error(exc, request)
        return results  # type: ignore[return-value]

    def warm(self, prefix: str) -> None:
        self.engine.warm(self.encode(prefix))

    # -- select -----------------------------------------------------------------------
    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        results: list[SelectResult | StructgenError] = []
        for request in requests:
            try:
                self.check_select(request)
                results.append(self._select_one(request))
            except Exception as exc:
                results.append(self._as_error(exc, request))
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
        if request.cancel is not None and request.cancel.cancelled:
            raise request.cancel.error(program=request.program, variable=request.variable)
        prompt_ids, fulls, starts = self.choice_tokens(request.prompt, request.choices)
        shared = min(starts)
        choice_ids = [f[k:] for f, k in zip(fulls, starts, strict=True)]
        engine = self.engine
        before = engine.stats()
        if shared > 0:
            prefix, conts, skip = prompt_ids[:shared], [f[shared:] for f in fulls], shared
        else:  # nothing before the choices: score them after the start-of-text token
            prefix, conts, skip = [self.start_token_id], fulls, 0
        scored = engine.score(prefix, conts)
        cond = [lp[k - skip:] for lp, k in zip(scored, starts, strict=True)]
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
        return self._engine.stats() if self._engine is not None else {}

    def clear_prefix_cache(self) -> None:
        self.engine.clear_cache()

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __repr__(self) -> str:
        return f"<EmbeddedBackend {self.model_path} on {self.device}>"


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _emitter(index: int, on_text: TextCallback) -> Callable[[str], None]:
    def emit(delta: str) -> None:
        try:
            on_text(index, delta)
        except Exception as exc:
            raise ProgramError(f"the on_text callback raised {type(exc).__name__}: {exc}") from exc

    return emit
