"""Compiles with a wall-clock limit: run on a daemon thread, abandon it when time is up.

Both engines release the GIL while they build a grammar, so a compile can run on its own
thread while the caller waits at most ``timeout_s``. A compile that times out cannot be
stopped; it is *abandoned* (it finishes on its own and its result is dropped). At most
``max_abandoned`` may still be running; beyond that :class:`Abandonable` refuses at once,
so runaway compiles cannot pile up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from structgen.constraints.base import EngineRefusal

__all__ = ["MAX_ABANDONED", "Abandonable"]

#: abandoned compiles per engine that may still run before compiles under a deadline are refused
MAX_ABANDONED = 2

T = TypeVar("T")


class Abandonable:
    """Runs compiles under a deadline, counting the abandoned ones (thread safe)."""

    def __init__(self, name: str, max_abandoned: int):
        self.name = name
        self.max_abandoned = max_abandoned
        self._lock = threading.Lock()
        self._abandoned = 0

    @property
    def abandoned(self) -> int:
        """Timed-out compiles still running."""
        with self._lock:
            return self._abandoned

    def run(self, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()``'s result, or :class:`EngineRefusal` when it does not finish within
        ``timeout_s`` (or too many abandoned compiles are still running). An exception
        ``fn`` raises is raised here."""
        with self._lock:
            if self._abandoned >= self.max_abandoned:
                raise EngineRefusal(f"skipped: {self._abandoned} timed-out compiles are still running")
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the waiting caller
                box["error"] = exc
            finally:
                with self._lock:
                    if box.get("abandoned"):
                        self._abandoned -= 1
                    done.set()

        threading.Thread(target=target, name=f"structgen-{self.name}-compile", daemon=True).start()
        if not done.wait(max(0.0, timeout_s)):
            with self._lock:
                if not done.is_set():
                    box["abandoned"] = True
                    self._abandoned += 1
                    raise EngineRefusal(f"compile timed out after {timeout_s:.3g} s", timed_out=True)
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]
