"""The backend contract: a small ABC, frozen request/result data and declared capabilities.

The interpreter turns a program into :class:`GenerateRequest` / :class:`SelectRequest`
values; a backend serves a *list* of them at once (so engines can batch) and returns,
per request, a result or the :class:`~structgen.errors.StructgenError` that request
failed with -- one failure never takes down the others.

Before anything is sent, :meth:`Backend.check_generate` / :meth:`Backend.check_select`
compare each request against the backend's :class:`Capabilities` and raise
:class:`~structgen.errors.CapabilityError` naming the backend, its version and the
feature. A constraint is never dropped.

A request may carry a :class:`Cancellation`: when the caller sets it (Ctrl-C, an
interrupted batch), a backend stops the request's outstanding work and fails it with
:class:`~structgen.errors.RequestCancelled`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from structgen.constraints.kind import kind_of
from structgen.constraints.spec import ConstraintSpec
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import CapabilityError, RequestCancelled, StructgenError

__all__ = [
    "Backend",
    "Cancellation",
    "Capabilities",
    "GenerateRequest",
    "GenerateResult",
    "Message",
    "SamplingParams",
    "SelectRequest",
    "SelectResult",
    "TextCallback",
]


@dataclass(frozen=True)
class Capabilities:
    """What a backend (at its version) can honour. Checked before every request."""

    regex: bool = False
    json_schema: bool = False
    grammar: bool = False
    choices: bool = False
    #: how ``select`` is scored: from prompt log-probabilities, by a constrained choice
    #: generation (no scoring methods), or not at all.
    select: Literal["logprobs", "choice", "none"] = "none"
    prefix_cache: bool = False
    #: tool calls (checked by the tool-call constraint kind before sending)
    tools: bool = False
    #: generated text arrives token by token through ``on_text``; without it a streaming
    #: run receives each generation's text whole, when it completes
    streaming: bool = False
    #: the backend renders roles itself from ``messages`` (chat APIs) rather than
    #: receiving text rendered with :meth:`Backend.chat_template`.
    chat_messages: bool = False
    #: sampling parameters that are honoured; others raise CapabilityError when set
    #: (``return_logprob`` / ``top_logprobs_num`` here: the backend returns logprobs)
    sampling: frozenset[str] = frozenset(
        {"max_new_tokens", "temperature", "top_p", "top_k", "stop"})


log = logging.getLogger("structgen.backends")


class Cancellation:
    """A cancel flag shared by the requests of one run or one batch.

    The caller sets it (:meth:`cancel`: Ctrl-C, an interrupted batch). A backend checks
    :attr:`cancelled` between steps, or registers :meth:`on_cancel` to wake what waits,
    and fails the request's outstanding work with :meth:`error`
    (:class:`~structgen.errors.RequestCancelled`). Thread-safe; cancelling twice is a no-op.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.reason = ""

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Set the flag and run the registered callbacks (in this thread)."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a backend's wake-up hook must not stop the others
                log.exception("a cancellation callback failed")

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when cancelled (at once if already); returns an unregister function."""
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)

                def unregister() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return unregister
        callback()
        return lambda: None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled (True) or ``timeout`` seconds pass (False)."""
        return self._event.wait(timeout)

    def error(self, *, program: str | None = None, variable: str | None = None) -> RequestCancelled:
        """The error a backend fails cancelled work with."""
        return RequestCancelled(f"cancelled before it finished ({self.reason or 'cancelled'})",
                                program=program, variable=variable)

    def __repr__(self) -> str:
        return f"<Cancellation {'set: ' + self.reason if self.cancelled else 'clear'}>"


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one ``gen`` (SGLang's names). ``None`` = backend default."""

    max_new_tokens: int = 128
    min_new_tokens: int | None = None
    n: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool = False
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False
    seed: int | None = None

    def set_fields(self) -> frozenset[str]:
        """Names of the parameters that differ from 'unset' (for capability checks)."""
        return _set_fields(self)


@lru_cache(maxsize=1024)
def _set_fields(self: SamplingParams) -> frozenset[str]:
    out = {"max_new_tokens", "temperature"}
    for name in ("min_new_tokens", "n", "top_p", "top_k", "min_p", "frequency_penalty",
                 "presence_penalty", "logprob_start_len", "top_logprobs_num", "seed"):
        if getattr(self, name) is not None:
            out.add(name)
    for name in ("stop", "stop_token_ids", "stop_regex"):
        if getattr(self, name):
            out.add(name)
    for name in ("ignore_eos", "return_logprob", "return_text_in_logprobs"):
        if getattr(self, name):
            out.add(name)
    return frozenset(out)


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    #: a tool result's call id and tool name (the ``tool`` role), for chat APIs
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class GenerateRequest:
    """Continue ``prompt`` (the program's whole text so far) under ``constraint``.

    ``messages`` holds the same conversation as structured messages for chat-API
    backends; an open assistant turn is the last message. ``program``/``variable``
    name the origin for error messages. ``group`` ties requests that share a prefix
    (a batch or a fork) so a scheduler can keep them together. ``cancel``, when set by
    the caller, means: stop this request's work and fail it with ``RequestCancelled``.
    """

    prompt: str
    params: SamplingParams = SamplingParams()
    constraint: ConstraintSpec | None = None
    messages: tuple[Message, ...] = ()
    program: str | None = None
    variable: str | None = None
    group: str | None = None
    cancel: Cancellation | None = field(default=None, compare=False, repr=False)


@dataclass
class GenerateResult:
    text: str
    #: "stop" (EOS, a stop string, or the constraint completed) or "length" (max tokens)
    finish_reason: Literal["stop", "length"] = "stop"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectRequest:
    """Pick one of ``choices`` to continue ``prompt``.

    Backends with ``select="logprobs"`` return per-choice token log-probabilities and the
    frontend applies the scoring method; backends with ``select="choice"`` return the
    index chosen by a constrained generation.
    """

    prompt: str
    choices: tuple[str, ...]
    temperature: float = 0.0
    #: the scoring method's name when the user chose one explicitly (None = default)
    method: str | None = None
    need_unconditional: bool = False
    messages: tuple[Message, ...] = ()
    program: str | None = None
    variable: str | None = None
    group: str | None = None
    cancel: Cancellation | None = field(default=None, compare=False, repr=False)


@dataclass
class SelectResult:
    #: per choice, the log-probability of each of its tokens given the prompt
    input_token_logprobs: list[list[float]] | None = None
    #: per choice, the same without the prompt (for unconditional_likelihood_normalized)
    unconditional_token_logprobs: list[list[float]] | None = None
    #: set by backends that choose directly (``select="choice"``)
    index: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


#: ``on_text(request_index, delta)`` -- streaming callback for generated text.
TextCallback = Callable[[int, str], None]


class Backend(ABC):
    """A place programs run: the embedded model, or an engine server.

    Subclasses set :attr:`name` and :attr:`capabilities` and implement :meth:`generate`
    and (if ``capabilities.select != "none"``) :meth:`select`.
    """

    name: str = "backend"
    version: str | None = None
    capabilities: Capabilities = Capabilities()

    # -- what subclasses implement -------------------------------------------------
    @abstractmethod
    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        """Serve ``requests``; per request a result or the error it failed with."""

    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        raise CapabilityError("select", backend=self.name, version=self.version)

    def chat_template(self) -> ChatTemplate | None:
        """The tokenizer's own chat template, for backends that take rendered text."""
        return None

    def warm(self, prefix: str) -> None:  # noqa: B027  (optional hook)
        """Compute and cache ``prefix`` once, ahead of requests that all start with it
        (a batch's shared system prompt and few-shot examples). Backends without a
        prefix cache need not do anything. Must not raise for a transient failure."""

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release resources (connections, servers, model memory)."""

    def stats(self) -> Mapping[str, Any]:
        """Counters: prompt tokens, cached tokens, forward passes... (backend-specific)."""
        return {}

    # -- async shells over the same core -------------------------------------------
    async def agenerate(self, requests: Sequence[GenerateRequest], *,
                        on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        return await asyncio.to_thread(self.generate, requests, on_text=on_text)

    async def aselect(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        return await asyncio.to_thread(self.select, requests)

    # -- capability checks, before sending -------------------------------------------
    def check_generate(self, request: GenerateRequest) -> None:
        caps = self.capabilities
        c = request.constraint
        if c is not None:
            kind = kind_of(c)  # each kind names its Capabilities flag (structgen.constraints.kind)
            if not getattr(caps, kind.feature, False):
                raise CapabilityError(kind.description, backend=self.name, version=self.version,
                                      program=request.program, variable=request.variable)
        unsupported = sorted(request.params.set_fields() - caps.sampling)
        if unsupported:
            raise CapabilityError(f"sampling parameter(s) {', '.join(unsupported)}",
                                  backend=self.name, version=self.version,
                                  program=request.program, variable=request.variable)

    def check_select(self, request: SelectRequest) -> None:
        caps = self.capabilities
        if caps.select == "none":
            raise CapabilityError("select", backend=self.name, version=self.version,
                                  program=request.program, variable=request.variable)
        if request.method is not None and caps.select != "logprobs":
            raise CapabilityError(f"select scoring method {request.method} (needs prompt "
                                  "logprobs; this backend selects by constrained choice)",
                                  backend=self.name, version=self.version,
                                  program=request.program, variable=request.variable)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
