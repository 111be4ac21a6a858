"""Text side of decoding: incremental detokenization and stop-string / stop-regex matching.

Pure Python over a ``decode(ids) -> str`` function, so it is unit-testable without a model.

:class:`IncrementalDetokenizer` turns a growing list of token ids into text deltas that
never split a UTF-8 character (vLLM's prefix/read-offset scheme: a few context tokens
keep tokenizers that strip a leading space from a first token honest).

:class:`StopMatcher` follows SGLang semantics: the output ends where the first stop
string (or stop regex match) begins, and the match itself is excluded. It is incremental:
each call looks only at the text added since the last one (plus, for stop strings, the
few characters a match could straddle), and stop regexes run on the linear-time
:class:`~structgen.backends.embedded.stop_regex.StopRegex`, so no pattern can make a
step slow. While streaming it holds back any tail that could still grow into a stop
match, so the concatenated deltas always equal the final text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from structgen.backends.embedded.stop_regex import StopRegex

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
    """Finds the first stop string / stop regex match in a growing text (one per sequence).

    ``stop_regex`` patterns use Python ``re`` syntax without backreferences or
    lookarounds (:class:`ValueError` otherwise)."""

    def __init__(self, stop: Sequence[str] = (), stop_regex: Sequence[str] = ()):
        self.stop = tuple(s for s in stop if s)
        self.patterns = tuple(StopRegex(p) for p in stop_regex)
        self._longest = max((len(s) for s in self.stop), default=0)
        self._seen = 0  # characters of the text already searched
        self._ended = False
        #: ``(start, matched)`` of the earliest stop match found so far
        self.hit: tuple[int, str] | None = None

    def __bool__(self) -> bool:
        return bool(self.stop or self.patterns)

    def update(self, text: str, *, ended: bool = False) -> tuple[int, str] | None:
        """Search what ``text`` (the whole output so far; it only grows) added since the
        last call; ``ended``: the output is complete (end anchors may match). Returns the
        earliest stop match found so far, ``(start, matched)``, or None."""
        if self.hit is not None:
            return self.hit
        new, at = text[self._seen:], self._seen
        self._seen = len(text)
        found: list[tuple[int, str]] = []
        if self.stop and new:
            lo = max(0, at - self._longest + 1)  # a match may straddle the old end
            for s in self.stop:
                i = text.find(s, lo)
                if i >= 0:
                    found.append((i, s))
        for p in self.patterns:
            span = p.feed(new) if new else None
            if span is None and ended and not self._ended:
                span = p.finish()
            if span is not None:
                found.append((span[0], text[span[0]:span[1]]))
        self._ended = self._ended or ended
        if found:
            self.hit = min(found, key=lambda h: h[0])
        return self.hit

    def safe_len(self, text: str) -> int:
        """Length of the prefix of ``text`` (as last passed to :meth:`update`) that no
        future text can turn into a stop match."""
        safe = len(text)
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        for p in self.patterns:
            safe = min(safe, p.live_start())
        return safe
