"""Helpers for adapter tests without a live engine: recording mock transports."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx


class Recorder:
    """An httpx mock transport (sync + async) that records every request it sees.

    ``routes`` maps ``"METHOD /path"`` (or ``"/path"``) to a JSON body or to a function
    ``(payload) -> body``; unknown routes answer 404.
    """

    def __init__(self, routes: dict[str, Any] | None = None):
        self.routes = dict(routes or {})
        self.requests: list[tuple[str, str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, payload))
        for key in (f"{request.method} {request.url.path}", request.url.path):
            if key in self.routes:
                body = self.routes[key]
                if callable(body):
                    body = body(payload)
                if isinstance(body, httpx.Response):
                    return body
                return httpx.Response(200, json=body)
        return httpx.Response(404, json={"detail": "Not Found"})

    def transports(self) -> dict[str, Any]:
        return {"transport": httpx.MockTransport(self.handler),
                "async_transport": httpx.MockTransport(self.handler)}

    def payloads(self, path: str) -> list[Any]:
        return [p for _, pth, p in self.requests if pth == path]


Handler = Callable[[Any], Any]
