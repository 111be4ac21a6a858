"""Shared HTTP plumbing for engine backends: pooled sync/async httpx clients.

One :class:`HttpClient` per backend holds an ``httpx.Client`` (thread-safe, used by the
sync path's worker threads) and an ``httpx.AsyncClient`` (created lazily per event loop).
Both go through the same sans-I/O pieces:

- :func:`classify_response` / :func:`classify_exception` map an HTTP status or an httpx
  exception into :class:`~structgen.errors.BackendError` with ``retryable`` set
  (connection refused/reset, 429, 502, 503, 504 and timeouts are retryable; the rest not);
- :class:`RetryPolicy` yields the backoff delays (bounded count, exponential, jittered,
  ``Retry-After`` honoured up to a cap).

API keys are only ever placed in the ``Authorization`` header; they never appear in
``repr``, error messages or logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from structgen.errors import BackendError

__all__ = ["HttpClient", "HttpConfig", "RetryPolicy", "classify_exception", "classify_response"]

log = logging.getLogger("structgen.backends.http")

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff for retryable failures only."""

    max_retries: int = 3
    backoff_base: float = 0.2
    backoff_max: float = 5.0
    retry_after_max: float = 10.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if self.backoff_base < 0 or self.backoff_max < 0:
            raise ValueError("backoff times must be >= 0")

    def delay(self, attempt: int, error: BackendError) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            return min(float(retry_after), self.retry_after_max)
        base = min(self.backoff_base * (2 ** (attempt - 1)), self.backoff_max)
        return base * (0.5 + random.random() / 2)


@dataclass(frozen=True)
class HttpConfig:
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    #: seconds to wait for a connection / for the whole response to start and each read
    connect_timeout: float = 5.0
    read_timeout: float = 120.0
    max_connections: int = 64
    retry: RetryPolicy = RetryPolicy()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, not {self.base_url!r}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.read_timeout, connect=self.connect_timeout,
                             pool=self.read_timeout)

    def all_headers(self) -> dict[str, str]:
        out = {"Accept": "application/json", **self.headers}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out


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


def classify_response(response: httpx.Response, *, backend: str, what: str) -> BackendError:
    """A BackendError for a non-2xx response (retryable for 429/502/503/504)."""
    status = response.status_code
    retryable = status in RETRYABLE_STATUS
    err = BackendError(f"{what} failed with HTTP {status}: {_error_detail(response)}",
                       backend=backend, retryable=retryable, status=status)
    ra = response.headers.get("retry-after")
    if ra is not None:
        try:
            err.retry_after = max(0.0, float(ra))  # type: ignore[attr-defined]
        except ValueError:
            pass
    return err


def classify_exception(exc: Exception, *, backend: str, what: str) -> BackendError:
    """A BackendError for an httpx transport failure; the caller chains ``from exc``."""
    if isinstance(exc, httpx.ConnectTimeout):
        return BackendError(f"{what}: timed out connecting ({exc})", backend=backend, retryable=True)
    if isinstance(exc, httpx.TimeoutException):
        return BackendError(f"{what}: timed out waiting for the server (stalled response; {type(exc).__name__})",
                            backend=backend, retryable=True)
    if isinstance(exc, httpx.ConnectError):
        return BackendError(f"{what}: cannot connect (connection refused?): {exc}",
                            backend=backend, retryable=True)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return BackendError(f"{what}: connection lost mid-request (server died or reset): "
                            f"{type(exc).__name__}: {exc}", backend=backend, retryable=True)
    if isinstance(exc, httpx.HTTPError):
        return BackendError(f"{what}: {type(exc).__name__}: {exc}", backend=backend, retryable=False)
    return BackendError(f"{what}: {type(exc).__name__}: {exc}", backend=backend, retryable=False)


def _final(err: BackendError, attempts: int, first: BackendError | None) -> BackendError:
    """The error to raise after ``attempts`` retries, naming the first failure too."""
    if attempts:
        note = f" (after {attempts} retr{'y' if attempts == 1 else 'ies'}"
        if first is not None and first.message != err.message:
            note += f"; first failure: {first.message}"
        err.args = (err.args[0] + note + ")",)
    return err


def _decode(response: httpx.Response, *, backend: str, what: str) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise BackendError(f"{what}: server sent a non-JSON body: {response.text[:200]!r}",
                           backend=backend) from exc


class HttpClient:
    """Pooled sync + async JSON client with bounded retries. Safe to share across threads."""

    def __init__(self, config: HttpConfig, *, backend: str,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self.backend = backend
        self._transport = transport
        self._async_transport = async_transport
        self._lock = threading.Lock()
        self._sync: httpx.Client | None = None
        self._async: dict[int, httpx.AsyncClient] = {}
        self.requests_sent = 0
        self.retries = 0

    def __repr__(self) -> str:
        return f"<HttpClient {self.backend} {self.config.base_url}>"

    def _limits(self) -> httpx.Limits:
        n = self.config.max_connections
        return httpx.Limits(max_connections=n, max_keepalive_connections=n)

    @property
    def sync(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(base_url=self.config.base_url, timeout=self.config.timeout(),
                                          headers=self.config.all_headers(), limits=self._limits(),
                                          transport=self._transport)
            return self._sync

    def _async_client(self) -> httpx.AsyncClient:
        loop_id = id(asyncio.get_running_loop())
        with self._lock:
            client = self._async.get(loop_id)
            if client is None or client.is_closed:
                client = httpx.AsyncClient(base_url=self.config.base_url, timeout=self.config.timeout(),
                                           headers=self.config.all_headers(), limits=self._limits(),
                                           transport=self._async_transport)
                self._async[loop_id] = client
            return client

    # -- the retry flow, shared by both shells -------------------------------------------
    def _flow(self, what: str, retries: int | None) -> Generator[float | None, Any, Any]:
        """Sans-I/O retry loop. Yields ``None`` to ask for one attempt and receives its
        outcome (an ``httpx.Response`` or the ``httpx.HTTPError`` it raised); yields a delay
        in seconds to ask for a pause before the next attempt; returns the decoded body
        or raises the mapped :class:`BackendError`."""
        policy = self.config.retry
        max_retries = policy.max_retries if retries is None else retries
        attempt = 0
        first: BackendError | None = None
        while True:
            self.requests_sent += 1
            outcome = yield None
            if isinstance(outcome, httpx.HTTPError):
                err = classify_exception(outcome, backend=self.backend, what=what)
                cause: BaseException = outcome
            elif outcome.is_success:
                return _decode(outcome, backend=self.backend, what=what)
            else:
                err = classify_response(outcome, backend=self.backend, what=what)
                cause = httpx.HTTPStatusError(str(outcome.status_code), request=outcome.request,
                                              response=outcome)
            if not err.retryable or attempt >= max_retries:
                raise _final(err, attempt, first) from cause
            first = first or err
            attempt += 1
            self.retries += 1
            delay = policy.delay(attempt, err)
            log.debug("%s: retry %d in %.2fs after: %s", self.backend, attempt, delay, err)
            yield delay

    def _timeout_kw(self, timeout: float | None) -> dict[str, Any]:
        if timeout is None:
            return {}
        return {"timeout": httpx.Timeout(timeout, connect=min(timeout, self.config.connect_timeout))}

    # -- sync -------------------------------------------------------------------------
    def request(self, method: str, path: str, payload: Any = None, *, what: str | None = None,
                timeout: float | None = None, retries: int | None = None) -> Any:
        """Send one JSON request, retrying retryable failures; return the decoded body."""
        flow = self._flow(what or f"{method} {path}", retries)
        kw = self._timeout_kw(timeout)
        next(flow)
        while True:
            try:
                outcome: Any = self.sync.request(method, path, json=payload, **kw)
            except httpx.HTTPError as exc:
                outcome = exc
            try:
                delay = flow.send(outcome)
            except StopIteration as done:
                return done.value
            time.sleep(delay)
            next(flow)

    def post(self, path: str, payload: Any, **kw: Any) -> Any:
        return self.request("POST", path, payload, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def get_text(self, path: str, *, timeout: float | None = None) -> str:
        """GET a text body (e.g. Prometheus ``/metrics``), no retries."""
        try:
            response = self.sync.get(path, timeout=timeout or self.config.read_timeout)
        except httpx.HTTPError as exc:
            raise classify_exception(exc, backend=self.backend, what=f"GET {path}") from exc
        if not response.is_success:
            raise classify_response(response, backend=self.backend, what=f"GET {path}")
        return response.text

    # -- async ------------------------------------------------------------------------
    async def arequest(self, method: str, path: str, payload: Any = None, *,
                       what: str | None = None, timeout: float | None = None,
                       retries: int | None = None) -> Any:
        flow = self._flow(what or f"{method} {path}", retries)
        kw = self._timeout_kw(timeout)
        client = self._async_client()
        next(flow)
        while True:
            try:
                outcome: Any = await client.request(method, path, json=payload, **kw)
            except httpx.HTTPError as exc:
                outcome = exc
            try:
                delay = flow.send(outcome)
            except StopIteration as done:
                return done.value
            await asyncio.sleep(delay)
            next(flow)

    async def apost(self, path: str, payload: Any, **kw: Any) -> Any:
        return await self.arequest("POST", path, payload, **kw)

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._sync is not None:
                self._sync.close()
                self._sync = None
            clients = list(self._async.values())
            self._async.clear()
        for client in clients:
            if client.is_closed:
                continue
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                loop.create_task(client.aclose())
            else:
                try:
                    asyncio.run(client.aclose())
                except RuntimeError:  # the client's own loop is gone; sockets close with it
                    pass
