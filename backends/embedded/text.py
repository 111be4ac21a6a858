"""Text side of decoding: incremental detokenization and stop-string / stop-regex matching.

Pure Python over a ``decode(ids) -> str`` function, so it is unit-testable without a model.

:class:`IncrementalDetokenizer` turns a growing list of token ids into text deltas that
never split a UTF-8 character (vLLM's prefix/read-offset scheme: a few context tokens
keep tokenizers that strip a leading space from a first token honest).

:class:`StopMatcher` follows SGLang semantics: the output ends where the first stop
string (or stop regex match) begins, and the match itself is excluded. While streaming it
holds back any tail that could still grow into a stop match, so the concatenated deltas
always equal the final text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import regex

__all__ = ["IncrementalDetokenizer", "StopMatcher"]

Decode = Callable[[Sequence[int]], str]

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Decode generated ids incrementally; ``context`` = the last prompt ids (not emitted)."""

    def __init__(self, decode: Decode, context: Sequence[int] = ()):
        self._decode = decode
        self._ids: list[int] = list(context[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the newly complete text (may be empty)."""
        self._ids.append(token_id)
        return self._advance(final=False)

    def flush(self) -> str:
        """Emit whatever is pending, even an incomplete character (end of output)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read >= len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        delta = after.removeprefix(before)
        self._prefix = self._read
        self._read = len(self._ids)
        self.text += delta
        return delta


class StopMatcher:
    """Finds the first stop string / stop regex match in generated text."""

    def __init__(self, stop: Sequence[str] = (), stop_regex: Sequence[str] = ()):
        self.stop = tuple(s for s in stop if s)
        self.patterns = tuple(regex.compile(p) for p in stop_regex)

    def __bool__(self) -> bool:
        return bool(self.stop or self.patterns)

    def find(self, text: str) -> tuple[int, str] | None:
        """``(start, matched)`` of the earliest complete stop match in ``text``, or None."""
        best: tuple[int, str] | None = None
        for s in self.stop:
            at = text.find(s)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        for p in self.patterns:
            m = p.search(text)
            if m is not None and (best is None or m.start() < best[0]):
                best = (m.start(), m.group(0))
        return best

    def safe_len(self, text: str) -> int:
        """Length of the prefix of ``text`` that no future text can turn into a stop match."""
        safe = len(text)
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        for p in self.patterns:
            m = p.search(text, partial=True)
            if m is not None and m.partial:
                safe = min(safe, m.start())
        return safe
