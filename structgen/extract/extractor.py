"""One record through the model: prompt, constrained generation, validation, retries.

:class:`Extractor` turns an :class:`~structgen.extract.records.InputRecord` into exactly
one :class:`~structgen.extract.records.ExtractResult`, never raising for the record's
sake: every failure (unreadable input, bad schema, backend error, output the validator
rejects) comes back as the result's ``error``.

Retries (instructor-style): a rejected output goes back to the model with the
validator's messages as a new user turn. On a backend that can continue a constrained
output (the embedded one: ``continue_generate``), the retry keeps the rejected output's
valid part -- everything before the failing value -- and generates only from there.
Retries sample (temperature 0.7) with a seed drawn from the record's key, so a rerun
of the same job gives the same output.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from structgen.constraints.validation import validate_output
from structgen.contract.backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from structgen.errors import BackendError, InputError, OutputValidationError, StructgenError
from structgen.extract.confidence import TokenSpan, confidence_entries, leaf_confidence, token_spans
from structgen.extract.fit import BudgetFit
from structgen.extract.jsonspans import resume_point
from structgen.extract.prompt import PromptBuilder, Turn
from structgen.extract.records import ExtractResult, InputRecord, RecordError, Usage
from structgen.extract.schemas import Schema, resolve_schema

__all__ = ["ExtractConfig", "Extractor"]


@dataclass(frozen=True)
class ExtractConfig:
    """How each record is generated. ``retries``: extra attempts after a rejected output
    (with the validator's feedback); ``confidence``: per-leaf log-probabilities (the
    backend must return token logprobs); ``resume_prefix``: on backends that can, keep the
    valid part of a rejected output on retry; ``fit_budget``: generate under the schema with
    its free lengths bounded to fit ``max_tokens`` (:mod:`structgen.extract.fit`)."""

    max_tokens: int = 512
    temperature: float = 0.0
    retries: int = 1
    retry_temperature: float = 0.7
    confidence: bool = False
    resume_prefix: bool = True
    backend_retries: int = 2
    #: bound the schema's free lengths so the longest object fits max_tokens
    #: (:mod:`structgen.extract.fit`)
    fit_budget: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError("max_tokens must be a positive int")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError("retries must be a non-negative int")

    def sampling_key(self) -> dict[str, Any]:
        """What changes the output (part of each record's progress key)."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "retries": self.retries,
                "retry_temperature": self.retry_temperature, "confidence": self.confidence,
                "resume_prefix": self.resume_prefix, "fit_budget": self.fit_budget}


def _first_path(errors: list[str]) -> str | None:
    for e in errors:
        head, sep, _ = e.partition(": ")
        if sep and head.startswith("$"):
            return head
    return None


def record_error(exc: BaseException, raw: str | None = None) -> RecordError:
    if isinstance(exc, OutputValidationError):
        return RecordError(type(exc).__name__, exc.message, raw=exc.raw, path=_first_path(exc.errors),
                           errors=tuple(exc.errors), truncated=exc.truncated)
    message = exc.message if isinstance(exc, StructgenError) else f"{type(exc).__name__}: {exc}"
    return RecordError(type(exc).__name__ if isinstance(exc, StructgenError) else "BackendError",
                       message, raw=raw)


class Extractor:
    """Extracts records with one backend. Thread-safe: :meth:`process` is called from many
    threads at once, so the backend batches their requests."""

    def __init__(self, backend: Backend, schema: Any, *, config: ExtractConfig = ExtractConfig(),
                 prompts: PromptBuilder | None = None):
        self.backend = backend
        self.config = config
        self.schema: Schema | None = resolve_schema(schema) if schema is not None else None
        self.prompts = prompts or PromptBuilder(backend)
        self._continue: Callable[..., list[Any]] | None = (
            getattr(backend, "continue_generate", None) if config.resume_prefix else None)
        self._warmed: dict[str, threading.Event] = {}  # schema digest -> its prefix is computed
        self._warm_lock = threading.Lock()
        self._decode = self._tokenizer_decode()
        encode = getattr(backend, "encode", None) if config.fit_budget else None
        self._fit = BudgetFit(config.max_tokens, encode if callable(encode) else None)

    def _tokenizer_decode(self) -> Callable[[list[int]], str] | None:
        tok = getattr(self.backend, "tokenizer", None)
        if tok is None or not hasattr(tok, "decode"):
            return None
        return lambda ids: str(tok.decode(ids, skip_special_tokens=True))

    # -- schemas and prefixes -------------------------------------------------------------
    def schema_for(self, record: InputRecord) -> Schema:
        if record.schema is not None:
            return resolve_schema(record.schema)
        if self.schema is None:
            raise InputError(f"record {record.id!r} names no schema and the job has none")
        return self.schema

    def warm(self, schema: Schema) -> None:
        """Compute the shared prefix (instructions + few-shot) of ``schema``'s prompts once:
        the first caller computes it, callers meanwhile wait for it (so records of one schema
        reuse one cached prefix instead of each computing it), later callers return at once."""
        if not self.backend.capabilities.prefix_cache:
            return
        with self._warm_lock:
            done = self._warmed.get(schema.digest)
            first = done is None
            if done is None:
                done = self._warmed[schema.digest] = threading.Event()
        if not first:
            done.wait()
            return
        try:
            prefix = self.prompts.shared_prefix(schema)
            if prefix:
                with contextlib.suppress(StructgenError):  # an optimisation: the records still run
                    self.backend.warm(prefix)
        finally:
            done.set()

    def key_parts(self, record: InputRecord, schema_digest: str | None) -> dict[str, Any]:
        return {"id": record.id, "text": record.text, "messages": [list(m) for m in record.messages],
                "schema": schema_digest, "instructions": self.prompts.instructions,
                "few_shot": [(e.text, e.output) for e in self.prompts.examples],
                "sampling": self.config.sampling_key()}

    # -- one record -------------------------------------------------------------------------
    def process(self, record: InputRecord, seed: int = 0) -> ExtractResult:
        start = time.perf_counter()
        result = self._process(record, seed)
        result.usage.ms += (time.perf_counter() - start) * 1000.0
        result.extra = record.extra
        return result

    def _process(self, record: InputRecord, seed: int) -> ExtractResult:
        usage = Usage()
        if record.error is not None:
            return ExtractResult(record.id, error=RecordError("InputError", record.error), usage=usage)
        try:
            schema = self.schema_for(record)
        except StructgenError as exc:
            return ExtractResult(record.id, error=record_error(exc), usage=usage)
        cfg = self.config
        params = SamplingParams(max_new_tokens=cfg.max_tokens, temperature=cfg.temperature,
                                return_logprob=cfg.confidence, return_text_in_logprobs=cfg.confidence)
        turns: list[Turn] = self.prompts.turns(record, schema)
        source = record.text or " ".join(str(m[-1]) for m in record.messages)
        constraint = self._fit.spec_for(schema, source)
        prefix = ""
        kept: list[TokenSpan] = []
        error: RecordError | None = None
        for attempt in range(cfg.retries + 1):
            request = replace(self.prompts.request(turns, schema, params, record.id), constraint=constraint)
            res = self._generate(request, prefix)
            if isinstance(res, StructgenError):
                return ExtractResult(record.id, error=record_error(res), usage=usage)
            usage.add_meta(res.meta)
            text = prefix + res.text
            try:
                value = validate_output(schema.spec, text, truncated=res.finish_reason == "length")
            except OutputValidationError as exc:
                error = record_error(exc)
                if attempt == cfg.retries:
                    break
                cut = resume_point(text, error.path, truncated=error.truncated) if self._continue is not None else 0
                if cfg.confidence:
                    spans = kept + self._spans(res, len(prefix), text)
                    kept = [s for s in spans if s[1] <= cut]
                notes = list(exc.errors) + (["the output was cut short by max_tokens: answer more briefly"]
                                            if exc.truncated else [])
                turns = self.prompts.feedback(self.prompts.turns(record, schema), text, notes)
                prefix = text[:cut]
                params = replace(params, temperature=max(cfg.temperature, cfg.retry_temperature),
                                 seed=(seed + attempt + 1) % (2**31))
                continue
            conf = None
            if cfg.confidence:
                try:
                    conf = leaf_confidence(text, kept + self._spans(res, len(prefix), text), source=source)
                except StructgenError as exc:
                    return ExtractResult(record.id, error=record_error(exc, raw=text), usage=usage)
            return ExtractResult(record.id, data=value, usage=usage, confidence=conf)
        return ExtractResult(record.id, error=error, usage=usage)

    def _spans(self, res: GenerateResult, offset: int, text: str) -> list[TokenSpan]:
        entries = confidence_entries(res.meta)
        if not entries:
            raise BackendError("the backend returned no token logprobs for --confidence",
                               backend=self.backend.name)
        return token_spans(text[offset:], entries, self._decode, offset=offset)

    def _generate(self, request: GenerateRequest, prefix: str) -> GenerateResult | StructgenError:
        """One generation; a retryable backend failure is tried again a few times."""
        out: GenerateResult | StructgenError = BackendError("not run")
        for _ in range(self.config.backend_retries + 1):
            try:
                if prefix and self._continue is not None:
                    out = self._continue([request], [prefix])[0]
                else:
                    out = self.backend.generate([request])[0]
            except StructgenError as exc:
                out = exc
            except Exception as exc:
                err = BackendError(f"{type(exc).__name__}: {exc}", backend=self.backend.name)
                err.__cause__ = exc
                out = err
            if not (isinstance(out, BackendError) and out.retryable):
                return out
        return out


def seed_of(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
