"""Shared HTTP plumbing for engine backends: pooled httpx clients, one deadline per request.

Every request is one coroutine under ``asyncio.timeout``: its *deadline* bounds the whole
call -- connecting, every read, every retry and every ``Retry-After`` wait -- whatever the
server does (stay silent, send a byte a second). The async API runs it on the caller's
event loop; the sync API on the client's own event-loop thread, the calling thread
waiting for the result. Inside the deadline:

- ``read_timeout`` still catches one stalled read early; like a refused or reset
  connection and HTTP 429/502/503/504 it is retryable (:func:`classify_exception`,
  :func:`classify_response`) and retried while time remains (:class:`RetryPolicy`:
  bounded, exponential, jittered, ``Retry-After`` honoured up to a cap);
- the body is read in chunks and refused past ``max_response_bytes``
  (:class:`~structgen.errors.ResponseTooLargeError`, not retried);
- failures are :class:`~structgen.errors.BackendError` naming the URL and, after retries,
  how many attempts were made; running out of time is
  :class:`~structgen.errors.DeadlineExceededError` (attempts, elapsed, URL).

API keys only ever go into the ``Authorization`` header and are registered with
:mod:`structgen.redact`, so no message or log line shows them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import ssl
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from structgen.extras import missing_dependency

try:
    import anyio
    import httpcore  # noqa: F401  (imported here, not inside the first request's deadline)
    import httpx
except ImportError as exc:  # the `servers` extra
    raise missing_dependency(exc, "structgen's HTTP client") from exc

from structgen.contract.http_config import (
    DEFAULT_DEADLINE,
    DEFAULT_MAX_RESPONSE_BYTES,
    Deadline,
    HttpConfig,
    RetryPolicy,
)
from structgen.contract.http_errors import (
    classify_exception,
    classify_response,
    decode_json,
    final_error,
    plain,
)
from structgen.errors import BackendError, DeadlineExceededError, ResponseTooLargeError
from structgen.redact import RedactingFilter

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Deadline",
    "HttpClient",
    "HttpConfig",
    "RetryPolicy",
    "classify_exception",
    "classify_response",
]

log = logging.getLogger("structgen.backends.http")
log.addFilter(RedactingFilter())

T = TypeVar("T")

#: headers that describe the wire body, not the decoded one kept after reading
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


_tls_lock = threading.Lock()
_tls_verified: ssl.SSLContext | None = None


def _tls_context(base_url: str) -> ssl.SSLContext:
    """The TLS context for a client of ``base_url``: one verifying context per process for
    ``https://`` (loading the CA bundle once), a bare one for ``http://`` -- never used, as
    redirects are not followed -- so a first request does not pay for certificates."""
    global _tls_verified
    if not base_url.startswith("https://"):
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    with _tls_lock:
        if _tls_verified is None:
            _tls_verified = httpx.create_ssl_context()
        return _tls_verified


class _LoopThread:
    """A private event loop on a daemon thread: where the sync API's requests run."""

    def __init__(self, name: str):
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        # load anyio's asyncio backend now, beside the first request rather than inside it
        asyncio.run_coroutine_threadsafe(anyio.sleep(0), self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a sync HttpClient call from its own event-loop thread would deadlock")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise BackendError("the HTTP client was closed while the request was in flight") from None
        except BaseException:  # KeyboardInterrupt in the waiting thread: stop the request too
            future.cancel()
            raise

    def stop(self, client: httpx.AsyncClient | None) -> None:
        async def shutdown() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if client is not None:
                await client.aclose()

        if self.loop.is_closed() or threading.current_thread() is self.thread:
            return
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=5)
        except Exception as exc:  # a stuck close: the daemon thread goes with the process
            log.debug("closing the HTTP event loop: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


class HttpClient:
    """Pooled JSON client with a deadline per request and bounded retries; thread-safe.

    ``transport`` / ``async_transport``: an ``httpx.AsyncBaseTransport`` to use instead of
    the network (``httpx.MockTransport`` in tests); every request, sync or async, runs on
    an event loop, so a sync-only transport is refused.
    """

    def __init__(self, config: HttpConfig, *, backend: str,
                 transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None):
        chosen = async_transport if async_transport is not None else transport
        if chosen is not None and not isinstance(chosen, httpx.AsyncBaseTransport):
            raise TypeError("the transport must be an httpx.AsyncBaseTransport (e.g. httpx.MockTransport): "
                            "sync and async requests both run on an event loop")
        self.config = config
        self.backend = backend
        self._transport: httpx.AsyncBaseTransport | None = chosen
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()
        self._runner: _LoopThread | None = None
        self.requests_sent = 0
        self.retries = 0

    def __repr__(self) -> str:
        return f"<HttpClient {self.backend} {self.config.base_url}>"

    def _client(self) -> httpx.AsyncClient:
        """The pooled client of the running event loop (one per loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                n = self.config.max_connections
                client = httpx.AsyncClient(
                    base_url=self.config.base_url, timeout=self.config.timeout(),
                    headers=self.config.all_headers(), transport=self._transport,
                    verify=_tls_context(self.config.base_url),
                    limits=httpx.Limits(max_connections=n, max_keepalive_connections=n))
                self._clients[loop] = client
            return client

    def _loop_thread(self) -> _LoopThread:
        with self._lock:
            if self._runner is None or self._runner.pid != os.getpid():
                runner = self._runner = _LoopThread(f"structgen-http-{self.backend}")
                # a client dropped without close() does not keep its thread; at exit the
                # daemon thread simply ends with the process
                weakref.finalize(self, runner.stop, None).atexit = False
            return self._runner

    def _budget(self, deadline: float | Deadline | None) -> Deadline:
        if isinstance(deadline, Deadline):
            return deadline
        return Deadline(self.config.deadline if deadline is None else deadline)

    # -- one request: attempts, retries, waits, all inside the deadline -----------------------
    async def _call(self, method: str, path: str, payload: Any, *, what: str | None, timeout: float | None,
                    retries: int | None, deadline: float | Deadline | None, decode: bool = True) -> Any:
        budget = self._budget(deadline)
        what = what or f"{method} {path}"
        url = self.config.url(path)
        policy = self.config.retry
        max_retries = policy.max_retries if retries is None else retries
        client = self._client()
        kw: dict[str, Any] = {}
        if timeout is not None:
            kw["timeout"] = httpx.Timeout(timeout, connect=min(timeout, self.config.connect_timeout))
        attempts = 0
        first: BackendError | None = None
        last: BackendError | None = None
        while True:
            remaining = budget.remaining()
            if remaining <= 0:
                raise self._expired(what, url, budget, attempts, first, last,
                                    "the time was spent before it could be sent")
            attempts += 1
            self.requests_sent += 1
            cause: BaseException
            try:
                async with asyncio.timeout(remaining) as scope:
                    response = await self._send(client, method, path, payload, kw, what=what, url=url)
            except TimeoutError as exc:
                if not scope.expired():
                    raise
                raise self._expired(what, url, budget, attempts, first, last,
                                    f"attempt {attempts} was still waiting for the response") from exc
            except httpx.HTTPError as exc:
                err = classify_exception(exc, backend=self.backend, what=what, url=url)
                cause = exc
            else:
                if response.is_success:
                    if not decode:
                        return response.text
                    return decode_json(response, backend=self.backend, what=what, url=url)
                err = classify_response(response, backend=self.backend, what=what, url=url)
                cause = httpx.HTTPStatusError(str(response.status_code), request=response.request,
                                              response=response)
            if not err.retryable or attempts > max_retries:
                raise final_error(err, attempts, first, budget.elapsed()) from cause
            first, last = first or err, err
            delay = policy.delay(attempts, err)
            if delay >= budget.remaining():
                raise self._expired(what, url, budget, attempts, first, last,
                                    f"a retry would wait {delay:.1f}s more, past the deadline") from cause
            self.retries += 1
            log.debug("%s: retry %d in %.2fs after: %s", self.backend, attempts, delay, err)
            await asyncio.sleep(delay)

    async def _send(self, client: httpx.AsyncClient, method: str, path: str, payload: Any,
                    kw: dict[str, Any], *, what: str, url: str) -> httpx.Response:
        """One attempt; the body read in chunks, up to ``max_response_bytes``."""
        request = client.build_request(method, path, json=payload, **kw)
        response = await client.send(request, stream=True)
        cap = self.config.max_response_bytes
        chunks: list[bytes] = []
        try:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > cap:
                raise self._too_large(what, url, f"declares {int(declared):,} bytes")
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > cap:
                    raise self._too_large(what, url, f"passed {size:,} bytes")
                chunks.append(chunk)
        finally:
            await response.aclose()
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks), request=request)

    def _too_large(self, what: str, url: str, detail: str) -> ResponseTooLargeError:
        cap = self.config.max_response_bytes
        return ResponseTooLargeError(f"{what}: the response from {url} {detail}, over the limit of "
                                     f"{cap:,} bytes (max_response_bytes)", limit=cap, url=url,
                                     backend=self.backend)

    def _expired(self, what: str, url: str, budget: Deadline, attempts: int, first: BackendError | None,
                 last: BackendError | None, detail: str) -> DeadlineExceededError:
        elapsed = budget.elapsed()
        msg = (f"{what}: no complete response from {url} within the {budget.seconds:g}s deadline "
               f"({attempts} attempt{'' if attempts == 1 else 's'} in {elapsed:.1f}s; {detail}")
        if last is not None:
            msg += f"; last failure: {plain(last)}"
        if first is not None and last is not None and first.message != last.message:
            msg += f"; first failure: {plain(first)}"
        return DeadlineExceededError(msg + ")", attempts=attempts, elapsed=elapsed, deadline=budget.seconds,
                                     url=url, backend=self.backend)

    # -- sync ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, payload: Any = None, *, what: str | None = None,
                timeout: float | None = None, retries: int | None = None,
                deadline: float | Deadline | None = None) -> Any:
        """Send one JSON request, retrying retryable failures; return the decoded body.

        ``timeout``: seconds for any one read (default ``config.read_timeout``);
        ``deadline``: seconds (or a shared :class:`Deadline`) for the whole request,
        retries included (default ``config.deadline``); ``retries``: at most this many.
        """
        coro = self._call(method, path, payload, what=what, timeout=timeout, retries=retries,
                          deadline=deadline)
        return self._loop_thread().run(coro)

    def post(self, path: str, payload: Any, **kw: Any) -> Any:
        return self.request("POST", path, payload, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def get_optional(self, path: str, **kw: Any) -> Any:
        """GET a JSON body, or None where the server has no such route (404): for routes
        only some servers or versions have (a version or properties route)."""
        try:
            return self.get(path, **kw)
        except BackendError as exc:
            if exc.status == 404:
                return None
            raise

    def get_text(self, path: str, *, timeout: float | None = None, deadline: float | Deadline | None = None) -> str:
        """GET a text body (e.g. Prometheus ``/metrics``), no retries."""
        coro = self._call("GET", path, None, what=f"GET {path}", timeout=timeout, retries=0,
                          deadline=deadline, decode=False)
        return str(self._loop_thread().run(coro))

    # -- async --------------------------------------------------------------------------------
    async def arequest(self, method: str, path: str, payload: Any = None, *, what: str | None = None,
                       timeout: float | None = None, retries: int | None = None,
                       deadline: float | Deadline | None = None) -> Any:
        """The async twin of :meth:`request`, on the running event loop."""
        return await self._call(method, path, payload, what=what, timeout=timeout, retries=retries,
                                deadline=deadline)

    async def apost(self, path: str, payload: Any, **kw: Any) -> Any:
        return await self.arequest("POST", path, payload, **kw)

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close every pooled connection; requests still in flight on the sync API fail."""
        with self._lock:
            runner, self._runner = self._runner, None
            clients = list(self._clients.items())
            self._clients.clear()
        own: httpx.AsyncClient | None = None
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, client in clients:
            if client.is_closed:
                continue
            if runner is not None and loop is runner.loop:
                own = client
            elif loop is running:
                loop.create_task(client.aclose())
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(client.aclose(), loop)
            elif not loop.is_closed():
                loop.run_until_complete(client.aclose())
            # a closed loop's sockets went with it
        if runner is not None and runner.pid == os.getpid():
            runner.stop(own)
