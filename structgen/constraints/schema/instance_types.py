"""Reasoning about the instance types a schema admits (sound over-estimates).

JSON equality as JSON Schema defines it, the type of a value, the set of types a schema
can accept, and dropping keywords that cannot apply to any of them.
"""

from __future__ import annotations

from typing import Any

from structgen.constraints.schema.keywords import KW_TYPE, TYPES

__all__ = ["drop_inapplicable", "is_number", "json_eq", "schema_size", "type_of", "types_of", "with_type"]


def is_number(x: Any) -> bool:
    """A JSON number (``bool`` is not one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def json_eq(a: Any, b: Any) -> bool:
    """Equality as JSON schema defines it (1 == 1.0, True != 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_eq(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def type_of(v: Any) -> str:
    """The JSON-schema type of a value (an integral float is an ``integer``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def types_of(s: Any) -> set[str] | None:
    """The instance types ``s`` can accept, or None for any (coarse, sound over-estimate)."""
    if s is False:
        return set()
    if not isinstance(s, dict):
        return None
    out: set[str] | None = None
    t = s.get("type")
    if isinstance(t, str):
        t = [t]
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        out = set(t)
        if "number" in out:
            out.add("integer")
    vals = None
    if "const" in s:
        vals = [s["const"]]
    elif isinstance(s.get("enum"), list):
        vals = s["enum"]
    if vals is not None:
        vt = set()
        for v in vals:
            vt.add(type_of(v))
            if type_of(v) == "integer":
                vt.add("number")
        out = vt if out is None else out & vt
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            u: set[str] = set()
            for b in s[key]:
                bt = types_of(b)
                if bt is None:
                    u = set(TYPES)
                    break
                u |= bt
            out = u if out is None else out & u
    return out


def with_type(s: dict[str, Any], types: set[str]) -> dict[str, Any]:
    """A copy of ``s`` whose ``type`` is ``types`` (``integer`` folded into ``number``)."""
    s = dict(s)
    if "integer" in types and "number" in types:
        types = types - {"integer"}
    ts = sorted(types)
    s["type"] = ts[0] if len(ts) == 1 else ts
    return s


def schema_size(s: Any, limit: int = 1 << 30) -> int:
    """Nodes (objects, lists, scalars) in ``s``, counting stops at ``limit``."""
    n, stack = 0, [s]
    while stack and n < limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


_ONE_TYPE = {t: frozenset({t, "integer"} if t == "number" else {t}) for t in TYPES}


def drop_inapplicable(s: dict[str, Any]) -> Any:
    """Drop keywords for types ``s`` cannot have (in place); False if no type is possible."""
    ts: Any
    if "enum" in s or "const" in s:
        ts = types_of({k: s[k] for k in ("type", "enum", "const") if k in s})
    else:
        t = s.get("type")
        if t is None:
            return s
        ts = _ONE_TYPE.get(t) if isinstance(t, str) else None
        if ts is None:
            ts = types_of({"type": t})
    if ts is not None:
        if not ts:
            return False
        for kw in list(s):
            t = KW_TYPE.get(kw)
            if t and not (t in ts or (t == "number" and "integer" in ts)):
                del s[kw]
    return s
