"""The text events of a streaming run, readable while the program runs.

A streaming run (``f.run(..., stream=True)``) appends ``(delta, variable)`` events here
as text is produced: prompt text (variable ``None``) and generated text. The stream
never shows text that is later taken back: a ``gen`` with ``retries`` is held back until
an attempt validates, so the streamed text always equals the state's text (and a
variable's streamed text equals ``s[name]``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

__all__ = ["TextStream"]


class TextStream:
    """Append-only text events with blocking readers."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.cond = threading.Condition()
        self.done = False

    def emit(self, delta: str, var: str | None) -> None:
        with self.cond:
            self.events.append((delta, var))
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def iter(self, var: str | None) -> Iterator[str]:
        """Every delta (of ``var`` only, if given), blocking until the run closes the stream."""
        i = 0
        while True:
            with self.cond:
                while i >= len(self.events) and not self.done:
                    self.cond.wait()
                if i >= len(self.events):
                    return
                batch = self.events[i:]
                i = len(self.events)
            for delta, v in batch:
                if var is None or v == var:
                    yield delta
