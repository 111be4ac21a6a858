"""Misbehaving HTTP servers on 127.0.0.1, for deadline, size-cap and parsing tests.

:class:`MisbehavingServer` speaks raw HTTP/1.1 over sockets so it can break the protocol
the way real failures do. Each connection reads one request, then acts on ``mode``:

- ``"silent"``: accept, read the request, never answer (until the server stops);
- ``"drip"``: answer 200 with a JSON body, sending the whole response (status line and
  headers included) one byte per ``interval`` seconds -- no single read ever stalls;
- ``"drip_body"``: headers at once (a large ``Content-Length``), then the body one byte
  per ``interval``;
- ``"huge"``: a 200 whose body is ``size`` bytes, sent as fast as the socket takes it
  (``chunked=True``: no ``Content-Length``, so only counting the bytes can stop it);
- ``"json"``: a normal response with ``status`` and ``body`` (a JSON-able value, or a
  callable ``(request_json, headers) -> value``), after ``delay`` seconds. A callable may
  return :class:`Act` (``Act("drip")``) to misbehave for that one request only.

``paths`` maps a request path to another mode for that path. ``hits`` counts the
requests read; ``requests`` keeps (method, path, headers, body). Stopping the server
(``close`` / leaving the ``with``) ends every held connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODES = ("silent", "drip", "drip_body", "huge", "json")
#: what ``huge`` repeats: a JSON array of 32,768 zeros (so ``size=len(JSON_BLOCK)`` is valid JSON)
JSON_BLOCK = b"[" + b"0," * 32767 + b"0]"


@dataclass(frozen=True)
class Act:
    """Returned by a ``json`` body callable: act as ``mode`` for this request (for ``"json"``:
    answer ``status`` with ``body`` and ``headers``)."""

    mode: str
    status: int = 200
    body: Any = None
    headers: dict[str, str] | None = None


class MisbehavingServer:
    def __init__(self, mode: str, *, interval: float = 1.0, size: int = 64 << 20, chunked: bool = False,
                 status: int = 200, body: Any = None, headers: dict[str, str] | None = None,
                 delay: float = 0.0, paths: dict[str, str] | None = None):
        for m in (mode, *(paths or {}).values()):
            if m not in MODES:
                raise ValueError(f"mode must be one of {MODES}, not {m!r}")
        self.mode = mode
        self.paths = dict(paths or {})
        self.delay = delay
        self.interval = interval
        self.size = size
        self.chunked = chunked
        self.status = status
        self.body: Any = body
        self.extra_headers = dict(headers or {})
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True, name="misbehaving-accept")

    @property
    def hits(self) -> int:
        with self._lock:
            return len(self.requests)

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> MisbehavingServer:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(timeout=5)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in threads:
            t.join(timeout=5)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="misbehaving-conn")
            with self._lock:
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    # -- one connection --------------------------------------------------------------------
    def _read_request(self, conn: socket.socket) -> tuple[str, str, dict[str, str], Any] | None:
        conn.settimeout(0.2)
        data = b""
        while b"\r\n\r\n" not in data:
            if self._stop.is_set():
                return None
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length and not self._stop.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return None
            rest += chunk
        try:
            payload = json.loads(rest) if rest else None
        except ValueError:
            payload = rest
        return method, path, headers, payload

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                req = self._read_request(conn)
                if req is None:
                    return
                with self._lock:
                    self.requests.append(req)
                if not self._respond(conn, req):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def _respond(self, conn: socket.socket, req: tuple[str, str, dict[str, str], Any]) -> bool:
        """Act on one request; True to keep the connection for another."""
        conn.settimeout(None)
        mode = self.paths.get(req[1], self.mode)
        body: Any = None
        status, extra = self.status, None
        if mode == "json":
            body = self.body(req[3], req[2]) if callable(self.body) else self.body
            if isinstance(body, Act):
                mode, status, extra, body = body.mode, body.status, body.headers, body.body
        if mode == "silent":
            self._stop.wait()
            return False
        if mode == "drip":
            body = b'{"choices": [{"text": "' + b"x" * 4096 + b'"}]}'
            data = self._head(200, len(body)) + body
            for i in range(len(data)):
                if self._stop.wait(self.interval):
                    return False
                conn.sendall(data[i:i + 1])
            return False
        if mode == "drip_body":
            conn.sendall(self._head(200, 1 << 20))
            while not self._stop.wait(self.interval):
                conn.sendall(b" ")
            return False
        if mode == "huge":
            return self._send_huge(conn)
        if self.delay and self._stop.wait(self.delay):
            return False
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.sendall(self._head(status, len(raw), extra=extra) + raw)
        return True

    def _head(self, status: int, length: int | None, *, extra: dict[str, str] | None = None) -> bytes:
        lines = [f"HTTP/1.1 {status} {'OK' if status < 400 else 'Error'}", "Content-Type: application/json"]
        if length is None:
            lines.append("Transfer-Encoding: chunked")
        else:
            lines.append(f"Content-Length: {length}")
        lines += [f"{k}: {v}" for k, v in {**self.extra_headers, **(extra or {})}.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send_huge(self, conn: socket.socket) -> bool:
        block = JSON_BLOCK
        if self.chunked:
            conn.sendall(self._head(200, None))
        else:
            conn.sendall(self._head(200, self.size))
        sent = 0
        while sent < self.size and not self._stop.is_set():
            piece = block[: min(len(block), self.size - sent)]
            if self.chunked:
                conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            else:
                conn.sendall(piece)
            sent += len(piece)
        if self.chunked and not self._stop.is_set():
            conn.sendall(b"0\r\n\r\n")
        return False


def completions_body(text: Any, *, finish_reason: str = "stop") -> dict[str, Any]:
    """An OpenAI completions response whose ``choices[0].text`` is ``text`` (any JSON value)."""
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


Body = Callable[[Any, dict[str, str]], Any]
