"""The progress bar of ``run_batch(..., progress_bar=True)`` (rich, on stderr).

It advances as items finish (in any order) and shows finished / total, failed items,
items per second, elapsed time and the estimated time left. rich is imported only when
a bar is asked for.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from structgen.errors import ProgramError

__all__ = ["BatchProgress"]


class BatchProgress:
    """A live bar for ``total`` items of program ``name``; :meth:`done` is a future callback."""

    def __init__(self, total: int, name: str):
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
        except ImportError as exc:
            raise ProgramError("run_batch(progress_bar=True) needs the rich package: pip install rich") from exc
        self._lock = threading.Lock()
        self._failed = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TaskProgressColumn(), TextColumn("{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("eta"),
            TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self._task = self._progress.add_task(name, total=total, failed=0, rate="")
        self._progress.start()

    def done(self, future: Future[Any]) -> None:
        """One item finished (its future is done)."""
        failed = future.cancelled() or future.exception() is not None or not future.result().finished
        with self._lock:
            self._failed += failed
            task = self._progress.tasks[0]
            speed = task.finished_speed or task.speed
            self._progress.update(self._task, advance=1, failed=self._failed,
                                  rate=f"{speed:.1f} items/s" if speed else "")

    def close(self) -> None:
        self._progress.stop()
