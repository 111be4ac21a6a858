"""structgen's one exception tree.

Every error structgen raises on purpose is a :class:`StructgenError`::

    StructgenError
    ├── ProgramError            a program misused the DSL, or failed while running
    │   └── OptionError         a run or sampling option has the wrong type or range
    ├── ConstraintError         a regex / JSON schema / choice set cannot be compiled
    ├── BackendError            a backend failed; ``retryable`` says whether to try again
    │   ├── CapabilityError     the backend cannot honour a feature (raised before sending)
    │   ├── DeadlineExceededError  a request's whole time budget ran out (attempts, elapsed, URL)
    │   ├── ResponseTooLargeError  a server's response passed the configured size cap
    │   └── ModelCacheError     a cached converted model failed verification and cannot be replaced
    ├── InputError              an input file or record cannot be read (batch extraction)
    ├── OutputValidationError   generated text failed parsing or validation
    └── RequestCancelled        the caller cancelled the work (Ctrl-C, an interrupted batch)

    BatchInterrupted            (a KeyboardInterrupt) ``run_batch`` stopped early; carries
                                every item's state, finished or cancelled

Lower-layer exceptions (httpx, torch, jsonschema, llguidance) are mapped at the
boundary with ``raise ... from exc`` so the cause stays attached; :func:`map_error` is
the one mapping for an exception whose origin (program body, backend, output) is known.
Every message is passed through :func:`structgen.redact.redact`: API keys and
credential-looking values never show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from structgen.redact import redact

__all__ = [
    "BackendError",
    "BatchInterrupted",
    "CapabilityError",
    "ConstraintError",
    "DeadlineExceededError",
    "InputError",
    "ModelCacheError",
    "OptionError",
    "OutputValidationError",
    "ProgramError",
    "RequestCancelled",
    "ResponseTooLargeError",
    "StructgenError",
    "map_error",
]


def _where(program: str | None, variable: str | None) -> str:
    parts = []
    if program:
        parts.append(f"program {program!r}")
    if variable:
        parts.append(f"variable {variable!r}")
    return (" [" + ", ".join(parts) + "]") if parts else ""


class StructgenError(Exception):
    """Base of every error structgen raises on purpose."""

    def __init__(self, message: str, *, program: str | None = None, variable: str | None = None):
        self.message = redact(message)
        self.program = program
        self.variable = variable
        super().__init__(self.message + _where(program, variable))

    def with_context(self, *, program: str | None = None, variable: str | None = None) -> StructgenError:
        """Fill in the program / variable this error belongs to, if not yet known."""
        self.program = self.program or program
        self.variable = self.variable or variable
        self.args = (self.message + _where(self.program, self.variable),)
        return self

    def extend_message(self, text: str) -> StructgenError:
        """Append ``text`` to the message (kept by :meth:`with_context`, redacted too)."""
        self.message = redact(self.message + text)
        return self.with_context()


class ProgramError(StructgenError):
    """A program misused the DSL (unknown variable, bad argument) or failed while running."""


class OptionError(ProgramError):
    """A run or sampling option has the wrong type or is out of range (raised where it is passed).

    ``option`` is the option's name as the caller spelled it (``max_tokens``,
    ``max_new_tokens``, ``temperature``...); ``value`` is what was passed.
    """

    def __init__(self, option: str, value: Any, expected: str, **kw: Any):
        self.option = option
        self.value = value
        super().__init__(f"{option} must be {expected}, not {value!r}", **kw)


class ConstraintError(StructgenError):
    """A constraint (regex, JSON schema, choices, grammar) is malformed or cannot be compiled.

    Raised before any token is generated. ``constraint`` names the offending constraint.
    """

    def __init__(self, message: str, *, constraint: str | None = None, **kw: Any):
        self.constraint = constraint
        if constraint:
            shown = constraint if len(constraint) <= 200 else constraint[:197] + "..."
            message = f"{message} (constraint: {shown})"
        super().__init__(message, **kw)


class BackendError(StructgenError):
    """A backend failed to serve a request.

    ``retryable`` is true for transient failures (connection refused/reset, 429, 503,
    timeouts) and false for everything else. ``backend`` names the backend.
    """

    def __init__(self, message: str, *, backend: str | None = None, retryable: bool = False,
                 status: int | None = None, **kw: Any):
        self.backend = backend
        self.retryable = retryable
        self.status = status
        if backend:
            message = f"{backend}: {message}"
        super().__init__(message, **kw)


class CapabilityError(BackendError):
    """The backend (at its version) cannot honour a requested feature.

    Always raised before anything is sent, never silently dropped.
    """

    def __init__(self, feature: str, *, backend: str, version: str | None = None,
                 hint: str | None = None, **kw: Any):
        self.feature = feature
        self.version = version
        msg = f"does not support {feature}"
        if version:
            msg = f"(version {version}) {msg}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg, backend=backend, retryable=False, **kw)


class DeadlineExceededError(BackendError):
    """A request did not complete within its deadline (connect, reads, retries and waits together).

    ``attempts`` is how many times it was sent (0: the budget was spent before it could be),
    ``elapsed`` the seconds spent, ``deadline`` the budget in seconds, ``url`` where it went.
    ``retryable`` is true: the server was slow, silent or kept failing transiently, so a
    later try may succeed -- structgen itself never retries past the deadline, and a caller
    that tries again gives the new try a fresh deadline.
    """

    def __init__(self, message: str, *, attempts: int, elapsed: float, deadline: float,
                 url: str | None = None, **kw: Any):
        self.attempts = attempts
        self.elapsed = elapsed
        self.deadline = deadline
        self.url = url
        kw.setdefault("retryable", True)
        super().__init__(message, **kw)


class ResponseTooLargeError(BackendError):
    """A server's response body passed the configured maximum (``limit`` bytes); not retryable."""

    def __init__(self, message: str, *, limit: int, url: str | None = None, **kw: Any):
        self.limit = limit
        self.url = url
        kw.setdefault("retryable", False)
        super().__init__(message, **kw)


class ModelCacheError(BackendError):
    """A converted model in the cache does not match the manifest written at its conversion,
    and cannot be converted again in its place (e.g. a cache directory of another user)."""


class InputError(StructgenError):
    """An input file or record cannot be read: a missing file, a malformed line, a record
    without its text field. ``source`` names the file and ``where`` the line or row."""

    def __init__(self, message: str, *, source: str | None = None, where: str | None = None, **kw: Any):
        self.source = source
        self.where = where
        loc = ":".join(x for x in (source, where) if x)
        super().__init__(f"{loc}: {message}" if loc else message, **kw)


class OutputValidationError(StructgenError):
    """Generated text could not be parsed or failed validation.

    ``raw`` is the exact generated text; ``errors`` lists every validation error;
    ``truncated`` is true when ``max_tokens`` cut the output short.
    """

    def __init__(self, message: str, *, raw: str, errors: Sequence[str] = (),
                 truncated: bool = False, **kw: Any):
        self.raw = raw
        self.errors = list(errors)
        self.truncated = truncated
        detail = "; ".join(self.errors[:5])
        shown = raw if len(raw) <= 300 else raw[:297] + "..."
        full = message
        if detail:
            full += f": {detail}"
        full += f" (raw output: {shown!r})"
        super().__init__(full, **kw)


class RequestCancelled(StructgenError):
    """The caller cancelled this work before it finished (Ctrl-C, an interrupted batch).

    Backends fail a request with it when its :class:`~structgen.contract.backend.Cancellation`
    is set; a run fails with it when its batch is interrupted.
    """


class BatchInterrupted(KeyboardInterrupt):
    """``run_batch`` was interrupted (Ctrl-C, or a KeyboardInterrupt / SystemExit in an item).

    The batch's outstanding requests were cancelled; ``states`` holds every item in input
    order: finished items with their results, the others failed with
    :class:`RequestCancelled`. ``cause`` is the exception that interrupted the batch. It is
    a ``KeyboardInterrupt``, so an uncaught one still stops the script.
    """

    def __init__(self, states: Sequence[Any], cause: BaseException, *, finished: int):
        self.states = list(states)
        self.cause = cause
        self.finished = finished
        super().__init__(f"run_batch interrupted by {type(cause).__name__}: "
                         f"{finished} of {len(self.states)} items finished")


#: where an exception came from, for :func:`map_error`
Origin = Literal["body", "backend", "output"]


def map_error(exc: BaseException, origin: Origin, *, backend: str | None = None, raw: str | None = None,
              truncated: bool = False, program: str | None = None,
              variable: str | None = None) -> StructgenError:
    """The :class:`StructgenError` for ``exc``, an exception from a known place.

    A ``StructgenError`` passes through (its program / variable filled in if unknown).
    Anything else is wrapped with ``exc`` as its ``__cause__``: from the program body a
    :class:`ProgramError`; from a backend (sending, or a result that cannot be recorded) a
    :class:`BackendError`; from checking an output an :class:`OutputValidationError` with
    the raw text (so ``retries=`` applies). An error raised below the program body is
    never reported as the body's.
    """
    if isinstance(exc, StructgenError):
        return exc.with_context(program=program, variable=variable)
    what = f"{type(exc).__name__}: {exc}"
    err: StructgenError
    if origin == "body":
        err = ProgramError(f"the program body raised {what}")
    elif origin == "output":
        err = OutputValidationError(f"the output could not be validated ({what})", raw=raw or "",
                                    truncated=truncated)
    else:
        err = BackendError(f"unexpected failure: {what}", backend=backend)
    err.__cause__ = exc
    return err.with_context(program=program, variable=variable)
