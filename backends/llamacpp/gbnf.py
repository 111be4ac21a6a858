"""Translate structgen constraints into llama.cpp GBNF grammars: regexes and choices.

llama.cpp has no regex field, so structgen sends its own grammar: :func:`regex_to_gbnf`
walks Python's regex parse tree; :func:`choices_to_gbnf` is an alternation of literals.
JSON schemas: :mod:`structgen.backends.llamacpp.gbnf_schema`, built on the literals, rules
and repetitions below.

Unsupported regex features (look-arounds, back-references) raise
:class:`~structgen.errors.ConstraintError` before anything is sent.
"""

from __future__ import annotations

from typing import Any

try:  # Python 3.11+
    import re._constants as sre_c  # type: ignore[import-not-found, unused-ignore]
    import re._parser as sre_parse  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef, unused-ignore]
    import sre_parse  # type: ignore[no-redef, unused-ignore]

from structgen.errors import ConstraintError

__all__ = ["MAXREPEAT", "Rules", "choices_to_gbnf", "gbnf_literal", "regex_body", "regex_to_gbnf", "repeat"]

MAXREPEAT = int(sre_c.MAXREPEAT)


def gbnf_literal(text: str) -> str:
    """A GBNF string literal for ``text`` (quotes, backslashes and control characters escaped)."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _class_char(code: int) -> str:
    """One character inside ``[...]``. llama.cpp knows only a few escapes (backslash,
    quote, brackets, tab, CR, LF, hex, unicode), so ``-`` and ``^`` are written in hex."""
    ch = chr(code)
    if ch in "]\\[":
        return "\\" + ch
    if ch in "-^" or code < 0x20 or code == 0x7F:
        return f"\\x{code:02X}"
    return ch


_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: (False, "0-9"),
    sre_c.CATEGORY_NOT_DIGIT: (True, "0-9"),
    sre_c.CATEGORY_WORD: (False, "a-zA-Z0-9_"),
    sre_c.CATEGORY_NOT_WORD: (True, "a-zA-Z0-9_"),
    sre_c.CATEGORY_SPACE: (False, " \\t\\n\\r\\x0B\\x0C"),
    sre_c.CATEGORY_NOT_SPACE: (True, " \\t\\n\\r\\x0B\\x0C"),
}


class Rules:
    """Named GBNF rules; an identical body is added once."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.n = 0

    def add(self, body: str, hint: str = "r") -> str:
        for name, existing in self.rules.items():
            if existing == body:
                return name
        self.n += 1
        name = f"{hint}{self.n}"
        self.rules[name] = body
        return name

    def render(self, root: str) -> str:
        lines = [f"root ::= {root}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n"


def repeat(item: str, lo: int, hi: int) -> str:
    """``item`` repeated ``lo`` .. ``hi`` times (``hi`` = :data:`MAXREPEAT`: unbounded)."""
    if lo == 0 and hi == MAXREPEAT:
        return f"{item}*"
    if lo == 1 and hi == MAXREPEAT:
        return f"{item}+"
    if lo == 0 and hi == 1:
        return f"{item}?"
    if hi == MAXREPEAT:
        return f"{item}{{{lo},}}"
    if lo == hi:
        return f"{item}{{{lo}}}"
    return f"{item}{{{lo},{hi}}}"


def _regex_seq(items: Any, pattern: str) -> str:
    parts: list[str] = []
    run = ""
    for op, av in items:
        if op is sre_c.LITERAL:
            run += chr(av)
            continue
        if run:
            parts.append(gbnf_literal(run))
            run = ""
        parts.append(_regex_item(op, av, pattern))
    if run:
        parts.append(gbnf_literal(run))
    parts = [p for p in parts if p]
    return " ".join(parts) if parts else '""'


def _regex_item(op: Any, av: Any, pattern: str) -> str:
    if op is sre_c.LITERAL:
        return gbnf_literal(chr(av))
    if op is sre_c.NOT_LITERAL:
        return f"[^{_class_char(av)}]"
    if op is sre_c.ANY:
        return "[^\\n]"
    if op is sre_c.IN:
        negate = False
        parts: list[str] = []
        negated_cats: list[str] = []
        for iop, iav in av:
            if iop is sre_c.NEGATE:
                negate = True
            elif iop is sre_c.LITERAL:
                parts.append(_class_char(iav))
            elif iop is sre_c.RANGE:
                parts.append(f"{_class_char(iav[0])}-{_class_char(iav[1])}")
            elif iop is sre_c.CATEGORY:
                neg, text = _CATEGORIES[iav]
                (negated_cats if neg else parts).append(text)
            else:
                raise ConstraintError(f"regex feature {iop} in a character class is not supported",
                                      constraint=pattern)
        if negated_cats:
            if negate or parts or len(negated_cats) > 1:
                raise ConstraintError("negated categories inside a class are not supported for llama.cpp",
                                      constraint=pattern)
            return f"[^{negated_cats[0]}]"
        return f"[{'^' if negate else ''}{''.join(parts)}]"
    if op is sre_c.CATEGORY:
        neg, text = _CATEGORIES[av]
        return f"[{'^' if neg else ''}{text}]"
    if op is sre_c.BRANCH:
        return "(" + " | ".join(_regex_seq(b, pattern) for b in av[1]) + ")"
    if op is sre_c.SUBPATTERN:
        _group, add_flags, del_flags, sub = av
        if add_flags or del_flags:
            raise ConstraintError("inline regex flags are not supported for llama.cpp", constraint=pattern)
        return "(" + _regex_seq(sub, pattern) + ")"
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, getattr(sre_c, "POSSESSIVE_REPEAT", None)):
        lo, hi, sub = av
        return repeat("(" + _regex_seq(sub, pattern) + ")", lo, hi)
    if op is sre_c.AT:
        if av in (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING, sre_c.AT_END, sre_c.AT_END_STRING):
            return ""  # the whole output is matched anyway
        raise ConstraintError("word-boundary anchors are not supported for llama.cpp", constraint=pattern)
    raise ConstraintError(f"regex feature {op} (look-around, back-reference...) is not supported "
                          "for llama.cpp grammars", constraint=pattern)


def regex_body(pattern: str) -> str:
    """The GBNF expression for the full matches of ``pattern`` (no rule name)."""
    try:
        tree = sre_parse.parse(pattern)
    except Exception as exc:
        raise ConstraintError(f"malformed regex: {exc}", constraint=pattern) from exc
    flags = tree.state.flags
    if flags & (sre_c.SRE_FLAG_IGNORECASE | sre_c.SRE_FLAG_DOTALL | sre_c.SRE_FLAG_LOCALE):
        raise ConstraintError("regex flags (?i) / (?s) / (?L) are not supported for llama.cpp grammars",
                              constraint=pattern)
    return _regex_seq(list(tree), pattern)


def regex_to_gbnf(pattern: str) -> str:
    """A GBNF grammar whose language is the full matches of ``pattern``."""
    return f"root ::= {regex_body(pattern)}\n"


def choices_to_gbnf(choices: tuple[str, ...] | list[str]) -> str:
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices) + "\n"
