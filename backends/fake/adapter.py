"""FakeBackend: scripted outputs, recorded requests, no model.

``responder(request) -> str | GenerateResult | Exception`` decides each generation (by
default the next item of ``outputs``); ``selector(request) -> list[list[float]] | int``
decides each select (per-choice token log-probabilities, or a chosen index). Every
request and every batch is recorded so tests can assert what the interpreter sent.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from structgen.contract.backend import (
    Backend,
    Capabilities,
    GenerateRequest,
    GenerateResult,
    SelectRequest,
    SelectResult,
    TextCallback,
)
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import BackendError, StructgenError

__all__ = ["FakeBackend"]

_ALL_SAMPLING = frozenset({
    "max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "temperature",
    "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "seed"})


def _chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in messages)


class FakeBackend(Backend):
    name = "fake"
    version = "0"

    def __init__(self, outputs: Iterable[str] = (), *,
                 responder: Callable[[GenerateRequest], Any] | None = None,
                 selector: Callable[[SelectRequest], Any] | None = None,
                 capabilities: Capabilities | None = None,
                 render: Callable[[list[dict[str, str]]], str] | None = _chatml):
        self._outputs: deque[str] = deque(outputs)
        self._responder = responder
        self._selector = selector
        self.capabilities = capabilities or Capabilities(
            regex=True, json_schema=True, grammar=True, choices=True, select="logprobs", tools=True,
            streaming=True, sampling=_ALL_SAMPLING)
        self._template = ChatTemplate(render, name="fake-chatml") if render else None
        self.requests: list[GenerateRequest | SelectRequest] = []
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def chat_template(self) -> ChatTemplate | None:
        return self._template

    def _respond(self, req: GenerateRequest) -> GenerateResult | StructgenError:
        if self._responder is not None:
            out = self._responder(req)
        elif self._outputs:
            out = self._outputs.popleft()
        else:
            return BackendError("script exhausted", backend=self.name)
        if isinstance(out, StructgenError):
            return out
        if isinstance(out, BaseException):
            raise out
        if isinstance(out, GenerateResult):
            return out
        text = str(out)
        for stop in req.params.stop:
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        return GenerateResult(text=text, finish_reason="stop",
                              meta={"prompt_tokens": len(req.prompt), "completion_tokens": len(text)})

    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        with self._lock:
            self.requests.extend(requests)
            self.batches.append(len(requests))
            results = [self._respond(r) for r in requests]
        if on_text is not None:
            for i, res in enumerate(results):
                if isinstance(res, GenerateResult):
                    third = max(1, len(res.text) // 3)
                    for k in range(0, len(res.text), third):
                        on_text(i, res.text[k:k + third])
        return results

    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        out: list[SelectResult | StructgenError] = []
        with self._lock:
            self.requests.extend(requests)
            self.batches.append(len(requests))
        for req in requests:
            got = self._selector(req) if self._selector else [[-1.0] * max(1, len(c)) for c in req.choices]
            if isinstance(got, StructgenError):
                out.append(got)
            elif isinstance(got, int):
                out.append(SelectResult(index=got))
            else:
                uncond = [[-0.5] * len(lp) for lp in got] if req.need_unconditional else None
                out.append(SelectResult(input_token_logprobs=got, unconditional_token_logprobs=uncond))
        return out
