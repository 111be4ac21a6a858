"""Mapping HTTP failures into structgen's errors (sans-I/O).

:func:`classify_response` (a non-2xx status) and :func:`classify_exception` (an httpx
transport failure) give a :class:`~structgen.errors.BackendError` naming what was tried
and the URL, with ``retryable`` set for connection refused/reset, timeouts and HTTP
429/502/503/504; :func:`final_error` adds how many attempts a retried request made.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx

from structgen.errors import BackendError

__all__ = ["RETRYABLE_STATUS", "classify_exception", "classify_response", "decode_json", "final_error", "plain"]

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


def _error_detail(response: httpx.Response) -> str:
    """The server's own error message, from the usual JSON shapes or the text body."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return text[:500] if text else response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
        for key in ("error", "message", "detail"):
            if body.get(key):
                val = body[key]
                return (val if isinstance(val, str) else json.dumps(val))[:500]
    return json.dumps(body)[:500]


def _url_of(obj: httpx.Response | httpx.HTTPError) -> str:
    try:
        return str(obj.request.url)
    except (RuntimeError, AttributeError):
        return "the server"


def classify_response(response: httpx.Response, *, backend: str, what: str,
                      url: str | None = None) -> BackendError:
    """A BackendError for a non-2xx response (retryable for 429/502/503/504)."""
    status = response.status_code
    err = BackendError(f"{what} failed with HTTP {status} from {url or _url_of(response)}: "
                       f"{_error_detail(response)}",
                       backend=backend, retryable=status in RETRYABLE_STATUS, status=status)
    ra = response.headers.get("retry-after")
    if ra is not None:
        with contextlib.suppress(ValueError):
            err.retry_after = max(0.0, float(ra))  # type: ignore[attr-defined]
    return err


def classify_exception(exc: Exception, *, backend: str, what: str, url: str | None = None) -> BackendError:
    """A BackendError for an httpx transport failure; the caller chains ``from exc``."""
    where = url or (_url_of(exc) if isinstance(exc, httpx.HTTPError) else "the server")
    if isinstance(exc, httpx.ConnectTimeout):
        return BackendError(f"{what}: timed out connecting to {where}", backend=backend, retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return BackendError(f"{what}: timed out waiting for {where} (stalled response; {type(exc).__name__})",
                            backend=backend, retryable=True)
    if isinstance(exc, httpx.ConnectError):
        return BackendError(f"{what}: cannot connect to {where} (connection refused?): {exc}",
                            backend=backend, retryable=True)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return BackendError(f"{what}: connection to {where} lost mid-request (server died or reset): "
                            f"{type(exc).__name__}: {exc}", backend=backend, retryable=True)
    return BackendError(f"{what} ({where}): {type(exc).__name__}: {exc}", backend=backend, retryable=False)


def plain(err: BackendError) -> str:
    """The message without the ``backend: `` prefix BackendError adds."""
    return err.message.removeprefix(f"{err.backend}: ") if err.backend else err.message


def final_error(err: BackendError, attempts: int, first: BackendError | None, elapsed: float) -> BackendError:
    """The error to raise after ``attempts`` tries: how many, and the first failure too."""
    if attempts > 1:
        retries = attempts - 1
        note = f" (after {attempts} attempts: {retries} retr{'y' if retries == 1 else 'ies'} in {elapsed:.1f}s"
        if first is not None and first.message != err.message:
            note += f"; first failure: {plain(first)}"
        err.extend_message(note + ")")
    return err


def decode_json(response: httpx.Response, *, backend: str, what: str, url: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise BackendError(f"{what}: {url} sent a non-JSON body: {response.text[:200]!r}",
                           backend=backend) from exc
