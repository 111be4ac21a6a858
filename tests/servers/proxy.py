"""A fault-injecting HTTP proxy on 127.0.0.1 for resilience tests.

Each incoming request takes the next action from ``plan`` (then ``default``):
``"pass"`` forwards to the upstream server, ``503``/``429``/any int answers that status
(429 with ``Retry-After: 0``), ``"stall"`` holds the connection open without answering
(until the proxy stops), ``"reset"`` closes the socket without a response.
Every request is counted in ``seen`` (path, action).
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class FaultProxy:
    def __init__(self, upstream: str | None, plan: list[Any] | None = None, default: Any = "pass"):
        self.upstream = upstream.rstrip("/") if upstream else None
        self.plan = list(plan or [])
        self.default = default
        self.seen: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    action = proxy.plan.pop(0) if proxy.plan else proxy.default
                    proxy.seen.append((self.path, action))
                if action == "stall":
                    proxy._stop.wait(120)
                    self.close_connection = True
                    return
                if action == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(action, int):
                    payload = b'{"error": {"message": "injected by FaultProxy"}}'
                    self.send_response(action)
                    if action == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                assert proxy.upstream is not None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "connection")}
                r = httpx.request(self.command, proxy.upstream + self.path, content=body,
                                  headers=headers, timeout=120)
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = _handle
            do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def count(self, path_prefix: str = "") -> int:
        with self._lock:
            return sum(1 for p, _ in self.seen if p.startswith(path_prefix))
