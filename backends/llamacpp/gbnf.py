"""Translate structgen constraints into llama.cpp GBNF grammars.

llama.cpp has no regex field, and its own JSON-schema conversion ignores
``minimum``/``maximum`` and lets control characters into strings. So structgen sends its
own grammar: :func:`regex_to_gbnf` walks Python's regex parse tree; :func:`json_schema_to_gbnf`
writes compact JSON (no whitespace) from the *normalised* schema
(:func:`structgen.constraints.schema.prepare_schema`: checked, local ``$ref`` s inlined or
hoisted into ``$defs``, ``allOf`` merged, ``not`` / ``if`` rewritten). Keywords a grammar
cannot express exactly (numeric bounds, ``format``, ``uniqueItems``, an ``allOf`` the
normaliser could not merge...) are loosened, and the adapter validates the output against
the original schema afterwards.

Unsupported regex features (look-arounds, back-references) raise
:class:`~structgen.errors.ConstraintError` before anything is sent.
"""

from __future__ import annotations

import json
from typing import Any

try:  # Python 3.11+
    import re._constants as sre_c  # type: ignore[import-not-found]
    import re._parser as sre_parse  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from structgen.constraints.schema import prepare_schema
from structgen.constraints.schema.merge import conj
from structgen.constraints.schema.refs import HOISTED_PREFIX
from structgen.errors import ConstraintError

__all__ = ["choices_to_gbnf", "json_schema_to_gbnf", "regex_to_gbnf"]

_MAXREPEAT = int(sre_c.MAXREPEAT)


def gbnf_literal(text: str) -> str:
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


class _Rules:
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


def _repeat(item: str, lo: int, hi: int) -> str:
    if lo == 0 and hi == _MAXREPEAT:
        return f"{item}*"
    if lo == 1 and hi == _MAXREPEAT:
        return f"{item}+"
    if lo == 0 and hi == 1:
        return f"{item}?"
    if hi == _MAXREPEAT:
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
        return _repeat("(" + _regex_seq(sub, pattern) + ")", lo, hi)
    if op is sre_c.AT:
        if av in (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING, sre_c.AT_END, sre_c.AT_END_STRING):
            return ""  # the whole output is matched anyway
        raise ConstraintError("word-boundary anchors are not supported for llama.cpp", constraint=pattern)
    raise ConstraintError(f"regex feature {op} (look-around, back-reference...) is not supported "
                          "for llama.cpp grammars", constraint=pattern)


def _regex_body(pattern: str) -> str:
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
    return f"root ::= {_regex_body(pattern)}\n"


def choices_to_gbnf(choices: tuple[str, ...] | list[str]) -> str:
    return "root ::= " + " | ".join(gbnf_literal(c) for c in choices) + "\n"


# -- JSON schema ----------------------------------------------------------------------------
_JSON_PRIMS = {
    "jchar": r'[^"\\\x00-\x1F\x7F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "jstring": r'"\"" jchar* "\""',
    "jint": r'"-"? ("0" | [1-9] [0-9]{0,15})',
    "jnumber": r'jint ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?',
    "jbool": r'"true" | "false"',
    "jnull": r'"null"',
    "jvalue": r'jobject | jarray | jstring | jnumber | jbool | jnull',
    "jobject": r'"{" (jstring ":" jvalue ("," jstring ":" jvalue)*)? "}"',
    "jarray": r'"[" (jvalue ("," jvalue)*)? "]"',
}


class _SchemaConverter:
    """GBNF rules for one normalised schema; ``defs`` are its hoisted ``$defs``."""

    def __init__(self, defs: dict[str, Any]):
        self.defs = defs
        self.rules = _Rules()
        self.refs: dict[str, str] = {}
        self.prims: set[str] = set()

    def prim(self, name: str) -> str:
        deps = {"jstring": ["jchar"], "jnumber": ["jint"],
                "jvalue": ["jobject", "jarray", "jstring", "jnumber", "jbool", "jnull"],
                "jobject": ["jstring", "jvalue"], "jarray": ["jvalue"]}
        if name not in self.prims:
            self.prims.add(name)
            for d in deps.get(name, []):
                self.prim(d)
        return name

    def target(self, ref: Any) -> Any:
        """The hoisted definition a normalised ``$ref`` names."""
        name = ref[len(HOISTED_PREFIX):] if isinstance(ref, str) and ref.startswith(HOISTED_PREFIX) else None
        if name is None or name not in self.defs:
            raise ConstraintError(f"unresolvable $ref {ref!r}", constraint=str(ref))
        return self.defs[name]

    def ref(self, ref: str) -> str:
        if ref in self.refs:
            return self.refs[ref]
        target = self.target(ref)
        self.rules.n += 1
        name = f"ref{self.rules.n}"
        self.refs[ref] = name
        self.rules.rules[name] = "PENDING"
        self.rules.rules[name] = self.node(target)
        return name

    def node(self, s: Any) -> str:
        if s is True or s == {}:
            return self.prim("jvalue")
        if s is False:
            raise ConstraintError("schema `false` admits no value")
        if not isinstance(s, dict):
            raise ConstraintError(f"not a schema: {s!r}")
        if "$ref" in s:
            return self.ref(s["$ref"])
        if "const" in s:
            return gbnf_literal(json.dumps(s["const"], separators=(",", ":")))
        if "enum" in s:
            return "(" + " | ".join(gbnf_literal(json.dumps(v, separators=(",", ":"))) for v in s["enum"]) + ")"
        if "allOf" in s:
            return self.node(self.all_of(s))
        for key in ("anyOf", "oneOf"):  # a oneOf the normaliser left: read as anyOf (wider)
            if key in s:
                rest = {k: v for k, v in s.items() if k != key}
                branches = [self.all_of({"allOf": [rest, sub]}) for sub in s[key]]
                alts = [self.rules.add(self.node(b), "alt") for b in branches if b is not False]
                if not alts:
                    raise ConstraintError("no branch of anyOf admits a value")
                return "(" + " | ".join(alts) + ")"
        t = s.get("type")
        if isinstance(t, list):
            return "(" + " | ".join(self.rules.add(self.node({**s, "type": one}), "t") for one in t) + ")"
        if t is None:
            if "properties" in s:
                t = "object"
            elif "items" in s or "prefixItems" in s:
                t = "array"
            else:
                return self.prim("jvalue")
        if t == "string":
            return self.string(s)
        if t == "integer":
            lo, hi = s.get("minimum"), s.get("maximum")
            if isinstance(lo, (int, float)) and lo >= 0:
                digits = len(str(int(hi))) - 1 if isinstance(hi, (int, float)) and hi >= 0 else 15
                return f'("0" | [1-9] [0-9]{{0,{digits}}})' if digits else '[0-9]'
            return self.prim("jint")
        if t == "number":
            return self.prim("jnumber")
        if t == "boolean":
            return self.prim("jbool")
        if t == "null":
            return self.prim("jnull")
        if t == "array":
            return self.array(s)
        if t == "object":
            return self.object(s)
        raise ConstraintError(f"unsupported JSON schema type {t!r}")

    def all_of(self, s: dict[str, Any]) -> Any:
        """One schema for ``s`` and its ``allOf``: the normaliser's exact merge
        (:func:`~structgen.constraints.schema.merge.conj`), with hoisted references
        inlined and without llguidance's property-order rule (the grammar lists
        properties itself); what still cannot be merged is dropped (wider: the adapter
        validates the output)."""
        parts = [self.target(p["$ref"]) if isinstance(p, dict) and set(p) == {"$ref"} else p
                 for p in s.get("allOf", [])]
        rest = {k: v for k, v in s.items() if k != "allOf"}
        merged = conj([rest, *parts], keep_order=False)
        if isinstance(merged, dict) and "allOf" in merged:
            merged = {k: v for k, v in merged.items() if k != "allOf"} or merged["allOf"][0]
        return merged

    def string(self, s: dict[str, Any]) -> str:
        if "pattern" in s:
            pattern = s["pattern"]
            body = _regex_body(pattern.removeprefix("^").removesuffix("$"))
            if not pattern.startswith("^"):
                body = f"{self.prim('jchar')}* {body}"
            if not pattern.endswith("$"):
                body = f"{body} {self.prim('jchar')}*"
            return f'"\\"" {body} "\\""'
        lo = int(s.get("minLength", 0))
        hi = s.get("maxLength")
        char = self.prim("jchar")
        return f'"\\"" {_repeat(char, lo, int(hi) if hi is not None else _MAXREPEAT)} "\\""'

    def array(self, s: dict[str, Any]) -> str:
        prefix = [self.rules.add(self.node(p), "item") for p in s.get("prefixItems", [])]
        rest = s.get("items", True)
        item = None if rest is False else self.rules.add(self.node(rest), "item")
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi_i = int(hi) if hi is not None else _MAXREPEAT
        if prefix:
            return self.tuple_array(prefix, item, lo, hi_i)
        if hi_i == 0 or item is None:
            return '"[" "]"'
        rest_rule = _repeat(f'("," {item})', max(lo - 1, 0), hi_i - 1 if hi_i != _MAXREPEAT else _MAXREPEAT)
        inner = f"{item} {rest_rule}"
        return f'"[" {inner} "]"' if lo >= 1 else f'"[" ({inner})? "]"'

    def tuple_array(self, prefix: list[str], item: str | None, lo: int, hi: int) -> str:
        """``prefixItems`` in order (the first ``minItems`` required), then ``items``."""
        n = min(len(prefix), hi)
        tail = ""
        if item is not None and hi > n:
            more_hi = hi - n if hi != _MAXREPEAT else _MAXREPEAT
            tail = _repeat(f'("," {item})', max(lo - n, 0), more_hi)
        seq = tail
        for i in range(n - 1, 0, -1):
            body = f'"," {prefix[i]} {seq}'.rstrip()
            seq = body if i < lo else f"({body})?"
        first = f"{prefix[0]} {seq}".rstrip() if n else ""
        if not first:
            return '"[" "]"'
        return f'"[" {first} "]"' if lo >= 1 else f'"[" ({first})? "]"'

    def object(self, s: dict[str, Any]) -> str:
        props: dict[str, Any] = s.get("properties", {})
        required = [k for k in props if k in set(s.get("required", []))]
        optional = [k for k in props if k not in set(required)]
        missing = [k for k in s.get("required", []) if k not in props]
        if missing:  # required names with no property schema: any value
            required += missing
        if not props and not missing:
            return self.prim("jobject") if s.get("additionalProperties", True) is not False else '"{" "}"'

        def kv(k: str) -> str:
            return f"{gbnf_literal(json.dumps(k))} \":\" {self.rules.add(self.node(props.get(k, True)), 'v')}"

        parts = [kv(k) for k in required]
        head = ' "," '.join(parts)
        if not optional:
            return f'"{{" {head} "}}"'
        # R_i ::= kv_i ("," R_{i+1})? | R_{i+1}  (optional members, in order, any subset)
        names: list[str] = [""] * len(optional)
        for i in range(len(optional) - 1, -1, -1):
            body = kv(optional[i])
            if i + 1 < len(optional):
                body = f'{body} ("," {names[i + 1]})? | {names[i + 1]}'
            self.rules.n += 1
            names[i] = f"opt{self.rules.n}"
            self.rules.rules[names[i]] = body
        if head:
            return f'"{{" {head} ("," {names[0]})? "}}"'
        return f'"{{" {names[0]}? "}}"'

    def render(self, root: str) -> str:
        out = self.rules.render(root)
        for name in sorted(self.prims):
            out += f"{name} ::= {_JSON_PRIMS[name]}\n"
        return out


def json_schema_to_gbnf(schema: Any) -> str:
    """Compact-JSON GBNF grammar for ``schema`` (a dict / bool / JSON text), built from its
    normalised form; :class:`ConstraintError` for a malformed schema."""
    norm = prepare_schema(schema).normalized.schema
    defs = norm.get("$defs", {}) if isinstance(norm, dict) else {}
    if isinstance(norm, dict) and "$defs" in norm:
        norm = {k: v for k, v in norm.items() if k != "$defs"}
    conv = _SchemaConverter(defs)
    return conv.render(conv.node(norm))
