"""Fixtures of the extraction tests: a recording wrapper around the session's real
embedded backend (it forwards every call and keeps what was asked)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from structgen.contract.backend import Backend, GenerateRequest, GenerateResult, TextCallback
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import StructgenError


class Recording(Backend):
    """Forwards to ``inner`` (the real model) and records requests and continuations."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.tokenizer = inner.tokenizer
        self.model_path = inner.model_path
        self.requests: list[GenerateRequest] = []
        self.continued: list[tuple[GenerateRequest, str]] = []
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        with self._lock:
            self.requests.extend(requests)
        return self.inner.generate(requests, on_text=on_text)  # type: ignore[no-any-return]

    def continue_generate(self, requests: Sequence[GenerateRequest],
                          prefixes: Sequence[str]) -> list[GenerateResult | StructgenError]:
        with self._lock:
            self.continued.extend(zip(requests, prefixes, strict=True))
        return self.inner.continue_generate(requests, prefixes)  # type: ignore[no-any-return]

    def chat_template(self) -> ChatTemplate | None:
        return self.inner.chat_template()  # type: ignore[no-any-return]

    def warm(self, prefix: str) -> None:
        self.inner.warm(prefix)

    def stats(self) -> Mapping[str, Any]:
        return self.inner.stats()  # type: ignore[no-any-return]


@pytest.fixture()
def recording(embedded_backend: Any) -> Recording:
    return Recording(embedded_backend)
