"""JSON schemas as llama.cpp GBNF grammars, built from the normalised schema.

llama.cpp's own JSON-schema conversion ignores ``minimum``/``maximum`` and lets control
characters into strings, so structgen sends its own grammar: :func:`json_schema_to_gbnf`
writes compact JSON (no whitespace) from the *normalised* schema
(:func:`structgen.constraints.schema.prepare_schema`: checked, local ``$ref`` s inlined or
hoisted into ``$defs``, ``allOf`` merged, ``not`` / ``if`` rewritten). Keywords a grammar
cannot express exactly (numeric bounds, ``format``, ``uniqueItems``, an ``allOf`` the
normaliser could not merge...) are loosened, and the adapter validates the output against
the original schema afterwards.
"""

from __future__ import annotations

import json
from typing import Any

from structgen.backends.llamacpp.gbnf import MAXREPEAT, Rules, gbnf_literal, regex_body, repeat
from structgen.constraints.schema import prepare_schema
from structgen.constraints.schema.merge import conj
from structgen.constraints.schema.refs import HOISTED_PREFIX
from structgen.errors import ConstraintError

__all__ = ["json_schema_to_gbnf"]


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
        self.rules = Rules()
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
            body = regex_body(pattern.removeprefix("^").removesuffix("$"))
            if not pattern.startswith("^"):
                body = f"{self.prim('jchar')}* {body}"
            if not pattern.endswith("$"):
                body = f"{body} {self.prim('jchar')}*"
            return f'"\\"" {body} "\\""'
        lo = int(s.get("minLength", 0))
        hi = s.get("maxLength")
        char = self.prim("jchar")
        return f'"\\"" {repeat(char, lo, int(hi) if hi is not None else MAXREPEAT)} "\\""'

    def array(self, s: dict[str, Any]) -> str:
        prefix = [self.rules.add(self.node(p), "item") for p in s.get("prefixItems", [])]
        rest = s.get("items", True)
        item = None if rest is False else self.rules.add(self.node(rest), "item")
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi_i = int(hi) if hi is not None else MAXREPEAT
        if prefix:
            return self.tuple_array(prefix, item, lo, hi_i)
        if hi_i == 0 or item is None:
            return '"[" "]"'
        rest_rule = repeat(f'("," {item})', max(lo - 1, 0), hi_i - 1 if hi_i != MAXREPEAT else MAXREPEAT)
        inner = f"{item} {rest_rule}"
        return f'"[" {inner} "]"' if lo >= 1 else f'"[" ({inner})? "]"'

    def tuple_array(self, prefix: list[str], item: str | None, lo: int, hi: int) -> str:
        """``prefixItems`` in order (the first ``minItems`` required), then ``items``."""
        n = min(len(prefix), hi)
        tail = ""
        if item is not None and hi > n:
            more_hi = hi - n if hi != MAXREPEAT else MAXREPEAT
            tail = repeat(f'("," {item})', max(lo - n, 0), more_hi)
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
