"""Shared pieces of the server tests: skipping with a reason, timing, suite import."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from structgen.backends.embedded.model_cache import cache_root
from tests.servers import engines

#: engine servers' logs (a failed start shows the log's tail and its path)
LOG_DIR = Path(os.environ.get("STRUCTGEN_SERVER_LOGS") or cache_root() / "server-logs")


def require_engine(name: str) -> None:
    """Skip, saying which engine is missing where and how to install it."""
    if not engines.installed(name):
        pytest.skip(engines.skip_reason(name))


def require_server(available: bool, what: str) -> None:
    if not available:
        pytest.skip(f"{what} is not installed here (see its LAUNCH.md for the install recipe)")
