"""The common core of engine-server backends: sans-I/O request flows, sync and async drivers.

An adapter describes each request as a *flow*: a generator that yields :class:`Call`
values (path + JSON payload), receives the decoded response bodies, and returns the
result. ``select`` by prompt logprobs, for example, is a flow of several calls. The same
flow is driven by a thread pool (``generate``) or by asyncio tasks (``agenerate``), so
sync, async and test fakes share one core.

Per request, a failure becomes that request's :class:`~structgen.errors.StructgenError`
in the result list; the rest of the batch finishes. Capability checks run for the whole
batch before anything is sent. Each request has one deadline (``deadline=`` seconds,
shared by all the HTTP calls of its flow, retries and waits included): past it, the
request fails alone with :class:`~structgen.errors.DeadlineExceededError`. A response
the adapter cannot read (missing fields, non-string text) is a
:class:`~structgen.errors.BackendError` quoting the body, never a crash in the caller.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from structgen.extras import missing_dependency

try:
    import httpx
except ImportError as exc:  # the `servers` extra
    raise missing_dependency(exc, "structgen's HTTP client") from exc

from structgen.constraints.spec import ChoiceSpec
from structgen.contract.backend import (
    Backend,
    Capabilities,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    SelectRequest,
    SelectResult,
    TextCallback,
)
from structgen.contract.chat_template import ChatTemplate
from structgen.contract.http import (
    DEFAULT_DEADLINE,
    DEFAULT_MAX_RESPONSE_BYTES,
    Deadline,
    HttpClient,
    HttpConfig,
    RetryPolicy,
)
from structgen.contract.responses import describe, finish_reason, require, text_field
from structgen.errors import BackendError, OutputValidationError, StructgenError
from structgen.redact import RedactingFilter

__all__ = ["Call", "Flow", "ServerBackend", "common_prefix", "finish_reason", "hf_chat_template", "require",
           "text_field"]

log = logging.getLogger("structgen.backends")
log.addFilter(RedactingFilter())

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request of a flow."""

    path: str
    payload: Any
    method: str = "POST"
    what: str | None = None


Flow = Generator[Call, Any, T]


def common_prefix(texts: Sequence[str]) -> str:
    if not texts:
        return ""
    lo, hi = min(texts), max(texts)
    n = 0
    while n < len(lo) and lo[n] == hi[n]:
        n += 1
    return lo[:n]


def hf_chat_template(path: str | None) -> ChatTemplate | None:
    """The chat template of a local Hugging Face tokenizer directory, if it has one."""
    if not path or not os.path.isdir(path):
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
    except Exception:
        return None
    if not getattr(tok, "chat_template", None):
        return None

    def render(messages: list[dict[str, str]]) -> str:
        return str(tok.apply_chat_template(messages, tokenize=False))

    def render_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return str(tok.apply_chat_template(messages, tools=list[Any](tools), tokenize=False))

    return ChatTemplate(render, name=os.path.basename(path.rstrip("/")), render_tools=render_tools,
                        source=tok.chat_template if isinstance(tok.chat_template, str) else None)


class ServerBackend(Backend):
    """Base of the HTTP engine backends. Subclasses implement the flows and detection.

    ``timeout``: seconds any one read may stall (then retried); ``deadline``: seconds a
    whole request may take, retries and ``Retry-After`` waits included (settable later as
    ``backend.deadline``); ``max_response_bytes``: the largest response body accepted.
    """

    name = "server"
    #: the shared prefix of a group is sent once first when at least this long (chars)
    warm_prefix_min_chars = 64

    def __init__(self, base_url: str, *, model: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, connect_timeout: float = 5.0, max_retries: int = 3,
                 backoff: float = 0.2, deadline: float = DEFAULT_DEADLINE,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 max_concurrency: int = 32, version: str | None = None,
                 capabilities: Capabilities | None = None, tokenizer: str | None = None,
                 warm_prefix: bool = True, transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None):
        self.http = HttpClient(
            HttpConfig(base_url.rstrip("/"), api_key=api_key, read_timeout=timeout,
                       connect_timeout=connect_timeout, deadline=deadline,
                       max_response_bytes=max_response_bytes, max_connections=max(max_concurrency, 1),
                       retry=RetryPolicy(max_retries=max_retries, backoff_base=backoff)),
            backend=self.name, transport=transport, async_transport=async_transport)
        self.base_url = base_url.rstrip("/")
        self.model: str | None = model
        self.max_concurrency = max_concurrency
        self.warm_prefix = warm_prefix
        self._tokenizer_path: str | None = tokenizer
        self._version: str | None = version
        self._caps: Capabilities | None = capabilities
        self._detected = version is not None and capabilities is not None
        self._detect_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._template: ChatTemplate | None = None
        self._template_loaded = False
        self._stats: dict[str, int] = {"requests": 0, "errors": 0, "warm_prefixes": 0,
                                       "prompt_tokens": 0, "completion_tokens": 0}

    @property
    def deadline(self) -> float:
        """Seconds one request may take in all (every HTTP call of its flow, retries, waits)."""
        return self.http.config.deadline

    @deadline.setter
    def deadline(self, seconds: float) -> None:
        self.http.config = replace(self.http.config, deadline=seconds)  # validated there

    # -- detection ----------------------------------------------------------------------
    def _detect(self) -> tuple[str | None, Capabilities]:
        """Ask the server for its version and model; return (version, capabilities)."""
        raise NotImplementedError

    def _capabilities_for(self, version: str | None) -> Capabilities:
        raise NotImplementedError

    def _is_detected(self) -> bool:
        return self._detected

    def _ensure_detected(self) -> None:
        if self._detected:
            return
        with self._detect_lock:
            if self._is_detected():  # another thread may have finished while this one waited
                return
            version: str | None
            if self._version is not None:
                version, caps = self._version, self._capabilities_for(self._version)
            else:
                version, caps = self._detect()
            self._version = version
            if self._caps is None:
                self._caps = caps
            self._detected = True

    @property
    def version(self) -> str | None:  # type: ignore[override]
        self._ensure_detected()
        return self._version

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]
        self._ensure_detected()
        assert self._caps is not None  # set by _ensure_detected
        return self._caps

    def chat_template(self) -> ChatTemplate | None:
        if not self._template_loaded:
            self._ensure_detected()
            self._template = hf_chat_template(self._tokenizer_path)
            self._template_loaded = True
        return self._template

    # -- what adapters implement ----------------------------------------------------------
    def _generate_flow(self, request: GenerateRequest) -> Flow[GenerateResult]:
        raise NotImplementedError

    def _select_flow(self, request: SelectRequest) -> Flow[SelectResult]:
        """Default for ``select="choice"``: a generation constrained to the choices."""
        longest = max(len(c) for c in request.choices)
        gen = GenerateRequest(prompt=request.prompt, messages=request.messages,
                              params=SamplingParams(max_new_tokens=longest + 8,
                                                    temperature=request.temperature),
                              constraint=ChoiceSpec(tuple(request.choices)),
                              program=request.program, variable=request.variable)
        result = yield from self._generate_flow(gen)
        try:
            index = request.choices.index(result.text)
        except ValueError:
            raise OutputValidationError("constrained choice returned text that is none of the choices",
                                        raw=result.text, errors=[f"choices: {list(request.choices)!r}"],
                                        program=request.program, variable=request.variable) from None
        return SelectResult(index=index, meta={"text": result.text, **result.meta})

    def _warm_flow(self, prefix: str) -> Flow[None] | None:
        """A flow that puts ``prefix`` into the engine's prefix cache, or None."""
        return None

    # -- drivers ----------------------------------------------------------------------------
    def _drive(self, flow: Flow[T]) -> T:
        budget = Deadline(self.deadline)  # one budget for every call of the flow
        try:
            call = next(flow)
            while True:
                body = self.http.request(call.method, call.path, call.payload, what=call.what, deadline=budget)
                call = flow.send(body)
        except StopIteration as stop:
            return cast(T, stop.value)

    async def _adrive(self, flow: Flow[T]) -> T:
        budget = Deadline(self.deadline)
        try:
            call = next(flow)
            while True:
                body = await self.http.arequest(call.method, call.path, call.payload, what=call.what,
                                                deadline=budget)
                call = flow.send(body)
        except StopIteration as stop:
            return cast(T, stop.value)

    def _checked(self, result: Any, kind: type[T]) -> T:
        """``result`` if it is a well-formed ``kind``; a BackendError otherwise (an adapter bug
        or a server reply it let through must not surface as a crash in the program)."""
        if not isinstance(result, kind):
            raise BackendError(f"adapter returned {type(result).__name__}, not {kind.__name__}", backend=self.name)
        if isinstance(result, GenerateResult) and not isinstance(result.text, str):
            raise BackendError(f"unexpected response: the generated text is {describe(result.text)}, "
                               "not a string", backend=self.name)
        return result

    def _wrap(self, exc: Exception, req: GenerateRequest | SelectRequest) -> StructgenError:
        self._stats["errors"] += 1
        if isinstance(exc, StructgenError):
            return exc.with_context(program=req.program, variable=req.variable)
        err = BackendError(f"unexpected response from the server: {type(exc).__name__}: {exc}",
                           backend=self.name, program=req.program, variable=req.variable)
        err.__cause__ = exc
        return err

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency,
                                            thread_name_prefix=f"structgen-{self.name}")
        return self._pool

    def _warm_flows(self, requests: Sequence[GenerateRequest]) -> list[Flow[None]]:
        if not (self.warm_prefix and self.capabilities.prefix_cache):
            return []
        groups: dict[str, list[str]] = {}
        for r in requests:
            if r.group is not None:
                groups.setdefault(r.group, []).append(r.prompt)
        flows = []
        for prompts in groups.values():
            if len(prompts) < 2:
                continue
            prefix = common_prefix(prompts)
            if len(prefix) >= self.warm_prefix_min_chars:
                flow = self._warm_flow(prefix)
                if flow is not None:
                    flows.append(flow)
        return flows

    def warm(self, prefix: str) -> None:
        """Put ``prefix`` into the engine's prefix cache once (``run_batch`` calls this with
        the batch's traced shared prefix). Never raises: warming is an optimisation."""
        if not prefix or not self.warm_prefix:
            return
        try:
            if not self.capabilities.prefix_cache:
                return
            flow = self._warm_flow(prefix)
            if flow is not None:
                self._stats["warm_prefixes"] += 1
                self._drive(flow)
        except Exception as exc:
            log.debug("%s: prefix warm-up failed: %s", self.name, exc)

    def _run_one(self, i: int, req: GenerateRequest,
                 on_text: TextCallback | None) -> GenerateResult | StructgenError:
        self._stats["requests"] += 1
        try:
            result = self._checked(self._drive(self._generate_flow(req)), GenerateResult)
        except Exception as exc:
            return self._wrap(exc, req)
        if on_text is not None and result.text:
            on_text(i, result.text)
        return result

    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        for r in requests:
            self.check_generate(r)
        if not requests:
            return []
        pool = self._executor()
        warm = self._warm_flows(requests)
        for done in [pool.submit(self._drive, f) for f in warm]:
            self._stats["warm_prefixes"] += 1
            try:
                done.result()
            except Exception as exc:
                log.debug("%s: prefix warm-up failed: %s", self.name, exc)
        # submit related requests together (same group, then prompts sorted so shared
        # prefixes are adjacent): the engine's prefix cache sees them back to back
        order = sorted(range(len(requests)), key=lambda i: (requests[i].group or "", requests[i].prompt))
        futures = {i: pool.submit(self._run_one, i, requests[i], on_text) for i in order}
        return [futures[i].result() for i in range(len(requests))]

    async def agenerate(self, requests: Sequence[GenerateRequest], *,
                        on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        for r in requests:
            self.check_generate(r)
        sem = asyncio.Semaphore(self.max_concurrency)
        for flow in self._warm_flows(requests):
            self._stats["warm_prefixes"] += 1
            try:
                await self._adrive(flow)
            except Exception as exc:
                log.debug("%s: prefix warm-up failed: %s", self.name, exc)

        async def one(i: int, req: GenerateRequest) -> GenerateResult | StructgenError:
            async with sem:
                self._stats["requests"] += 1
                try:
                    result = self._checked(await self._adrive(self._generate_flow(req)), GenerateResult)
                except Exception as exc:
                    return self._wrap(exc, req)
            if on_text is not None and result.text:
                on_text(i, result.text)
            return result

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))

    def _select_one(self, req: SelectRequest) -> SelectResult | StructgenError:
        self._stats["requests"] += 1
        try:
            return self._checked(self._drive(self._select_flow(req)), SelectResult)
        except Exception as exc:
            return self._wrap(exc, req)

    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        for r in requests:
            self.check_select(r)
        pool = self._executor()
        return [f.result() for f in [pool.submit(self._select_one, r) for r in requests]]

    async def aselect(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        for r in requests:
            self.check_select(r)
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(req: SelectRequest) -> SelectResult | StructgenError:
            async with sem:
                self._stats["requests"] += 1
                try:
                    return self._checked(await self._adrive(self._select_flow(req)), SelectResult)
                except Exception as exc:
                    return self._wrap(exc, req)

        return list(await asyncio.gather(*(one(r) for r in requests)))

    # -- bookkeeping ------------------------------------------------------------------------
    def _count_usage(self, usage: Any) -> None:
        """Add a response's token counts; bookkeeping only, so malformed counts are skipped."""
        if not isinstance(usage, Mapping):
            return
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self._stats[key] += value

    def stats(self) -> Mapping[str, Any]:
        return {**self._stats, "http_requests": self.http.requests_sent, "retries": self.http.retries}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self.http.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.base_url}>"
