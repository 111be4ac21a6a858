"""Linear-time, incremental search for stop regexes in generated text.

A stop regex is searched in the output after every token. A backtracking engine (``re``,
``regex``) can take exponential time on a pattern like ``(a|aa)+b`` and would stall the
engine's loop; this module never backtracks. The pattern (Python ``re`` syntax, parsed
by ``re``'s own parser) becomes a Thompson NFA, simulated as a lazily built DFA whose
states are the live NFA states grouped by where their match started (earliest first).
Feeding text costs O(new characters) per call once states are cached, and at most the
NFA's size per character while they are built; nothing already fed is read again.

Semantics follow ``re.search`` for the leftmost match: the reported match is the one
that starts earliest among those complete in the text fed so far. Anchors ``^``, ``\\A``,
``$``, ``\\Z``, ``\\b``, ``\\B`` are supported (``$`` / ``\\b`` at the current end of the
text wait for the next character, or :meth:`StopRegex.finish`). Backreferences,
lookarounds, atomic groups and possessive repeats have no linear-time matcher and raise
:class:`ValueError` at construction.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# the re module's own parser (the syntax of stop_regex is exactly re's); private, so untyped
C: Any = importlib.import_module("re._constants")
_parser: Any = importlib.import_module("re._parser")

__all__ = ["StopRegex"]

_MAX_NFA_STATES = 4000
_MAX_DFA_STATES = 4096

_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)
# previous-character context bits, and the next character's stand-ins
_START, _NEWLINE, _WORD, _AWORD = 1, 2, 4, 8
_END = ""           # the text has ended
_UNKNOWN = None     # the text may go on: assertions on the next character fail for now


def _is_word(ch: str, ascii_only: bool) -> bool:
    if ascii_only:
        return ch.isascii() and (ch.isalnum() or ch == "_")
    return ch.isalnum() or ch == "_"


def _context(ch: str) -> int:
    bits = _NEWLINE if ch == "\n" else 0
    if _is_word(ch, False):
        bits |= _WORD
    if _is_word(ch, True):
        bits |= _AWORD
    return bits


class _NFA:
    """States as parallel lists: kind, payload (char test / assertion), out, out2."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.test: list[Any] = []
        self.out: list[int] = []
        self.out2: list[int] = []
        self.tests: dict[str, Callable[[str], bool]] = {}

    def add(self, kind: int, test: Any = None, out: int = -1, out2: int = -1) -> int:
        if len(self.kind) >= _MAX_NFA_STATES:
            raise ValueError(f"pattern too large for the linear-time matcher (> {_MAX_NFA_STATES} states)")
        self.kind.append(kind)
        self.test.append(test)
        self.out.append(out)
        self.out2.append(out2)
        return len(self.kind) - 1


def _char_test(node: tuple[Any, Any], flags: int,
               memo: dict[str, Callable[[str], bool]]) -> Callable[[str], bool]:
    """A one-character test with ``re``'s exact semantics (case folding, categories)."""
    key = f"{flags}:{node!r}"
    test = memo.get(key)
    if test is None:
        state = _parser.State()
        state.flags = flags
        one = re._compiler.compile(_parser.SubPattern(state, [node]), flags)  # type: ignore[attr-defined]
        match = one.match
        test = memo[key] = lambda ch: match(ch) is not None
    return test


_UNSUPPORTED = {C.GROUPREF: "backreferences", C.GROUPREF_EXISTS: "conditional groups",
                C.ASSERT: "lookarounds", C.ASSERT_NOT: "lookarounds"}
for _name, _what in (("ATOMIC_GROUP", "atomic groups"), ("POSSESSIVE_REPEAT", "possessive repeats")):
    if hasattr(C, _name):
        _UNSUPPORTED[getattr(C, _name)] = _what


def _compile(nfa: _NFA, items: list[Any], nxt: int, flags: int) -> int:
    """States for ``items`` (a parsed sequence) continuing at ``nxt``; its first state."""
    for op, av in reversed(items):
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            nxt = nfa.add(_CHAR, _char_test((op, av), flags, nfa.tests), nxt)
        elif op is C.BRANCH:
            starts = [_compile(nfa, list(alt), nxt, flags) for alt in av[1]]
            first = starts[-1]
            for s in reversed(starts[:-1]):
                first = nfa.add(_SPLIT, None, s, first)
            nxt = first
        elif op is C.SUBPATTERN:
            _, add, drop, sub = av
            nxt = _compile(nfa, list(sub), nxt, (flags | add) & ~drop)
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            body = list(sub)
            if hi == C.MAXREPEAT:  # x* after lo copies: a loop back through a split
                loop = nfa.add(_SPLIT, None, -1, nxt)
                nfa.out[loop] = _compile(nfa, body, loop, flags)
                nxt = loop
            else:
                end = nxt
                for _ in range(hi - lo):  # (x(x(x)?)?)?
                    nxt = nfa.add(_SPLIT, None, _compile(nfa, body, nxt, flags), end)
            for _ in range(lo):
                nxt = _compile(nfa, body, nxt, flags)
        elif op is C.AT:
            nxt = nfa.add(_ASSERT, (av, flags), nxt)
        elif op in _UNSUPPORTED:
            raise ValueError(f"{_UNSUPPORTED[op]} have no linear-time matcher")
        else:
            raise ValueError(f"unsupported regex construct {op}")
    return nxt


def _assert_holds(at: Any, flags: int, prev: int, nxt: str | None) -> bool:
    multiline = bool(flags & re.MULTILINE)
    if at in (C.AT_BEGINNING, C.AT_BEGINNING_LINE):
        return bool(prev & _START) or ((multiline or at is C.AT_BEGINNING_LINE) and bool(prev & _NEWLINE))
    if at is C.AT_BEGINNING_STRING:
        return bool(prev & _START)
    if nxt is _UNKNOWN:  # the rest looks at the next character
        return False
    if at in (C.AT_END, C.AT_END_LINE):
        return nxt == _END or ((multiline or at is C.AT_END_LINE) and nxt == "\n")
    if at is C.AT_END_STRING:
        return nxt == _END
    if at in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY, C.AT_UNI_BOUNDARY, C.AT_UNI_NON_BOUNDARY):
        ascii_only = bool(flags & re.ASCII)
        before = bool(prev & (_AWORD if ascii_only else _WORD))
        after = bool(nxt) and _is_word(nxt, ascii_only)
        return (before != after) == (at in (C.AT_BOUNDARY, C.AT_UNI_BOUNDARY))
    raise ValueError(f"unsupported anchor {at}")


@dataclass
class _State:
    """A DFA state: live NFA states grouped by match start (earliest first), after
    some text whose last character's context is ``prev``."""

    groups: tuple[frozenset[int], ...]
    prev: int
    #: char -> (next state, origin of each next group: an index into groups + [a group
    #: starting here], index of the earliest group with a match ending before the char)
    trans: dict[str, tuple[_State, tuple[int, ...], int | None]] = field(default_factory=dict)
    #: earliest group with a match ending here, next character unknown / text ended
    now: dict[str | None, int | None] = field(default_factory=dict)


class StopRegex:
    """Incremental search for one pattern: :meth:`feed` text as it is generated."""

    def __init__(self, pattern: str) -> None:
        try:
            parsed = _parser.parse(pattern, 0)
        except re.error as exc:
            raise ValueError(f"invalid regex: {exc}") from None
        except RecursionError:
            raise ValueError("regex nested too deeply") from None
        self.pattern = pattern
        self._nfa = _NFA()
        match = self._nfa.add(_MATCH)
        try:
            self._start = _compile(self._nfa, list(parsed.data), match, parsed.state.flags)
        except RecursionError:
            raise ValueError("regex nested too deeply") from None
        self._states: dict[tuple[tuple[frozenset[int], ...], int], _State] = {}
        self._state = _State((), _START)
        self._states[((), _START)] = self._state
        self._starts: list[int] = []  # text position where each group's matches start
        self._pos = 0

    # -- public ----------------------------------------------------------------------
    def feed(self, text: str) -> tuple[int, int] | None:
        """Add ``text``; ``(start, end)`` of the earliest-starting match completed in it
        (positions in all text fed), or None. A match that ended before this text was
        already reported by an earlier call."""
        found: list[tuple[int, int]] = []
        for ch in text:
            st = self._state
            step = st.trans.get(ch)
            if step is None:
                step = self._transition(st, ch)
            nxt, origin, hit = step
            starts = self._starts + [self._pos]
            if hit is not None:
                found.append((starts[hit], self._pos))
            self._starts = [starts[j] for j in origin]
            self._state = nxt
            self._pos += 1
        hit = self._accepting(self._state, _UNKNOWN)
        if hit is not None:
            found.append(((self._starts + [self._pos])[hit], self._pos))
        return _earliest(found)

    def finish(self) -> tuple[int, int] | None:
        """The text has ended: a match ending at its end (``$``, ``\\b``), if any."""
        hit = self._accepting(self._state, _END)
        return None if hit is None else ((self._starts + [self._pos])[hit], self._pos)

    def live_start(self) -> int:
        """Where the earliest match that could still complete would start (the text's
        end when none can): text before it can never become part of a match."""
        return self._starts[0] if self._starts else self._pos

    # -- the lazy DFA ----------------------------------------------------------------
    def _intern(self, groups: tuple[frozenset[int], ...], prev: int) -> _State:
        key = (groups, prev)
        st = self._states.get(key)
        if st is None:
            if len(self._states) >= _MAX_DFA_STATES:  # bound memory: forget, rebuild lazily
                cur = self._state
                cur.trans, cur.now = {}, {}
                self._states = {(cur.groups, cur.prev): cur}
            st = self._states[key] = _State(groups, prev)
        return st

    def _closure(self, kernel: frozenset[int], prev: int, nxt: str | None) -> list[int]:
        nfa = self._nfa
        seen: set[int] = set()
        out: list[int] = []
        stack = list(kernel)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            kind = nfa.kind[s]
            if kind == _SPLIT:
                stack.append(nfa.out2[s])
                stack.append(nfa.out[s])
            elif kind == _ASSERT:
                at, flags = nfa.test[s]
                if _assert_holds(at, flags, prev, nxt):
                    stack.append(nfa.out[s])
            else:
                out.append(s)
        return out

    def _accepting(self, st: _State, nxt: str | None) -> int | None:
        if nxt in st.now:
            return st.now[nxt]
        hit = None
        for j, group in enumerate((*st.groups, frozenset((self._start,)))):
            if any(self._nfa.kind[s] == _MATCH for s in self._closure(group, st.prev, nxt)):
                hit = j
                break
        st.now[nxt] = hit
        return hit

    def _transition(self, st: _State, ch: str) -> tuple[_State, tuple[int, ...], int | None]:
        nfa = self._nfa
        seen: set[int] = set()
        groups: list[frozenset[int]] = []
        origin: list[int] = []
        hit = None
        for j, group in enumerate((*st.groups, frozenset((self._start,)))):
            kernel = set()
            for s in self._closure(group, st.prev, ch):
                if nfa.kind[s] == _MATCH:
                    if hit is None:
                        hit = j
                elif nfa.test[s](ch) and nfa.out[s] not in seen:
                    kernel.add(nfa.out[s])
            if kernel:
                seen |= kernel
                groups.append(frozenset(kernel))
                origin.append(j)
        step = (self._intern(tuple(groups), _context(ch)), tuple(origin), hit)
        st.trans[ch] = step
        return step


def _earliest(found: list[tuple[int, int]]) -> tuple[int, int] | None:
    if not found:
        return None
    start = min(s for s, _ in found)
    return start, max(e for s, e in found if s == start)
