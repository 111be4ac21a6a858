"""Shared pieces of the server tests: skipping with a reason, timing, suite import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

LOG_DIR = Path(os.environ.get("STRUCTGEN_SERVER_LOGS", "/tmp/structgen-server-logs"))


def suite_cases() -> dict[str, Any]:
    """The shared program suite (tests/program_suite.py), or {} when it is not there."""
    try:
        from tests.program_suite import CASES
    except ImportError:
        return {}
    return dict(CASES)


def require_server(available: bool, what: str) -> None:
    if not available:
        pytest.skip(f"{what} is not installed here (see its LAUNCH.md for the install recipe)")
