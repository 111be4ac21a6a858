"""Where each value sits in generated JSON text: leaf spans by JSON path.

:func:`scan` walks JSON text -- complete, or cut short by ``max_tokens`` -- and returns
every value's path (``$.items[2].price``, the same form as validation errors) with its
character span. Per-field confidence maps token log-probabilities onto leaf spans;
retries cut a rejected output back to the start of the failing value (the last valid
prefix) and continue from there. It never evaluates the text.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

__all__ = ["Span", "leaf_spans", "path_of", "resume_point", "scan"]


@dataclass(frozen=True)
class Span:
    path: str
    start: int
    end: int  # exclusive; for a value cut short, the end of the text
    leaf: bool
    complete: bool


def path_of(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier():
        return f"{parent}.{key}"
    return f"{parent}[{json.dumps(key)}]"


class _Cut(Exception):
    """The text ended inside a value."""


class _Scanner:
    def __init__(self, text: str):
        self.t = text
        self.i = 0
        self.spans: list[Span] = []

    def ws(self) -> None:
        t = self.t
        while self.i < len(t) and t[self.i] in " \t\r\n":
            self.i += 1
        if self.i >= len(t):
            raise _Cut

    def value(self, path: str) -> None:
        self.ws()
        start = self.i
        c = self.t[start]
        try:
            if c == "{":
                self.obj(path)
            elif c == "[":
                self.arr(path)
            elif c == '"':
                self.string()
            else:
                self.scalar()
        except _Cut:
            self.spans.append(Span(path, start, len(self.t), c not in "{[", False))
            raise
        self.spans.append(Span(path, start, self.i, c not in "{[", True))

    def string(self) -> None:
        t, i = self.t, self.i + 1
        while i < len(t):
            if t[i] == "\\":
                i += 2
                continue
            if t[i] == '"':
                self.i = i + 1
                return
            i += 1
        self.i = len(t)
        raise _Cut

    def scalar(self) -> None:
        t, i = self.t, self.i
        while i < len(t) and t[i] not in ",]} \t\r\n":
            i += 1
        if i == self.i:
            raise ValueError(f"unexpected {t[i]!r} at {i}")
        self.i = i
        if i >= len(t):
            raise _Cut

    def obj(self, path: str) -> None:
        self.i += 1
        self.ws()
        if self.t[self.i] == "}":
            self.i += 1
            return
        while True:
            self.ws()
            if self.t[self.i] != '"':
                raise ValueError(f"expected a key at {self.i}")
            k0 = self.i
            self.string()
            try:
                key = json.loads(self.t[k0:self.i])
            except ValueError as exc:
                raise ValueError(f"bad key at {k0}") from exc
            self.ws()
            if self.t[self.i] != ":":
                raise ValueError(f"expected ':' at {self.i}")
            self.i += 1
            self.value(path_of(path, key))
            self.ws()
            c = self.t[self.i]
            self.i += 1
            if c == "}":
                return
            if c != ",":
                raise ValueError(f"expected ',' or '}}' at {self.i - 1}")

    def arr(self, path: str) -> None:
        self.i += 1
        self.ws()
        if self.t[self.i] == "]":
            self.i += 1
            return
        n = 0
        while True:
            self.value(path_of(path, n))
            n += 1
            self.ws()
            c = self.t[self.i]
            self.i += 1
            if c == "]":
                return
            if c != ",":
                raise ValueError(f"expected ',' or ']' at {self.i - 1}")


def scan(text: str) -> list[Span]:
    """Every value's span, children before their parent (a post-order walk). Text cut
    short yields the values seen so far plus the open ones (``complete=False``). Text that
    is not JSON up to where it stops yields what was read before the fault."""
    s = _Scanner(text)
    with contextlib.suppress(_Cut, ValueError, IndexError):
        s.value("$")
    return s.spans


def leaf_spans(text: str) -> list[Span]:
    """The leaves (strings, numbers, booleans, null) in text order."""
    return sorted((sp for sp in scan(text) if sp.leaf), key=lambda sp: sp.start)


def resume_point(text: str, path: str | None, *, truncated: bool = False) -> int:
    """Where to cut a rejected output so that what stays is valid and complete up to the
    failing value. A value that failed validation (``path`` other than the root): its
    start. Text cut short by ``max_tokens``: the start of the value that was open, else
    the end of the last complete value (the cut fell inside a key or punctuation).
    Otherwise 0: nothing is worth keeping."""
    spans = scan(text)
    if path not in (None, "$"):
        for sp in spans:
            if sp.path == path:
                return sp.start
    if truncated:
        open_leaves = [sp for sp in spans if not sp.complete and sp.leaf]
        if open_leaves:
            return open_leaves[0].start
        done = [sp.end for sp in spans if sp.complete and sp.path != "$"]
        if done:
            return max(done)
    return 0
