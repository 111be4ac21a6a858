"""Run a test body under a deadline, so a regression that hangs fails instead of hanging CI."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()`` in a daemon thread; pytest.fail if it is still running after ``seconds``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="deadline")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]
