"""Local HTTP stub servers that speak an engine's protocol (no engine behind them).

SGLang has no CPU build here, so :class:`SGLangStub` answers SGLang's native routes
(``/get_server_info``, ``/generate`` incl. the prompt-logprob calls of ``select``,
``/flush_cache``) with canned, protocol-correct bodies: one character is one "token";
a regex constraint is answered from a table the test gives. :class:`OpenAIStub` answers
``/v1/models`` and ``/v1/chat/completions``. Both record every request (path, headers, body).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server:
    """A threaded HTTP server on 127.0.0.1 (a free port) dispatching to ``self.route``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.requests.append((method, self.path, dict(self.headers), body))
                status, payload = stub.route(method, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        raise NotImplementedError

    def bodies(self, path: str) -> list[Any]:
        return [b for _, p, _, b in self.requests if p == path]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SGLangStub(_Server):
    """SGLang's native API. ``answers(sampling_params, text) -> str`` decides generations;
    ``select`` prefers the choice whose characters appear in ``preferred``."""

    def __init__(self, answers: Callable[[dict[str, Any], str], str], *, tokenizer_path: str | None = None,
                 preferred: str = ""):
        self.answers = answers
        self.tokenizer_path = tokenizer_path
        self.preferred = preferred
        self.flushed = 0
        super().__init__()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/get_server_info":
            return 200, {"version": "0.5.6-stub", "grammar_backend": "llguidance", "model_path": "stub-model",
                         "tokenizer_path": self.tokenizer_path}
        if path == "/flush_cache":
            self.flushed += 1
            return 200, {}
        if path != "/generate":
            return 404, {"detail": "Not Found"}
        sp = body.get("sampling_params") or {}
        text = body["text"]
        if isinstance(text, list):  # select: prompt logprobs of each text
            start = body.get("logprob_start_len", 0)
            return 200, [{"text": "", "meta_info": {"prompt_tokens": len(t), "input_token_logprobs": [
                [None if i == 0 else (-0.1 if ch in self.preferred else -2.0), ord(ch), None]
                for i, ch in enumerate(t) if i >= start]}} for t in text]
        if sp.get("max_new_tokens") == 0:  # prompt length / prefix warm-up
            return 200, {"text": "", "meta_info": {"prompt_tokens": len(text), "completion_tokens": 0}}
        out = self.answers(sp, text)
        for stop in sp.get("stop") or []:
            out = out.split(stop)[0]
        return 200, {"text": out, "meta_info": {"prompt_tokens": len(text), "completion_tokens": len(out),
                                                 "finish_reason": {"type": "stop"}}}


class OpenAIStub(_Server):
    """An OpenAI-compatible chat server answering every completion with ``answer(body)``."""

    def __init__(self, answer: Callable[[dict[str, Any]], str], *, model: str = "stub-chat"):
        self.answer = answer
        self.model = model
        super().__init__()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": self.model, "root": self.model}]}
        if path == "/v1/chat/completions":
            content = self.answer(body)
            return 200, {"choices": [{"message": {"role": "assistant", "content": content},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": len(content)}}
        return 404, {"error": {"message": "not found"}}
