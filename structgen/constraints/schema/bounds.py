"""Bounds on the parts of a JSON value that could run away, so that its text fits a budget.

:func:`bounded_schema` gives a schema's free lengths a bound ``cap`` -- strings a
``maxLength``, arrays a ``maxItems`` (:func:`items_cap`), open objects a ``maxProperties``
-- never below what the schema requires (``minLength``, ``minItems``) and never above its
own bounds, so the bounded schema accepts a subset of what the original accepts: a value
valid by construction stays valid against the original. :func:`json_chars` is the longest
JSON text (compact) a bounded schema allows, and :func:`fit_cap` the largest ``cap`` whose
longest text fits a character budget.

Used by tool calls (:mod:`structgen.tools.budget`: a call closes within ``max_tokens``) and
by extraction (:mod:`structgen.extract.extractor`: a runaway string cannot eat the record's
budget). Integers are bounded too: at most :data:`INTEGER_BOUND` in size (``minimum`` /
``maximum``, the schema's own if tighter; left as they are where the schema requires
larger), so they take at most :data:`NUMBER_CHARS` characters: a small model that starts
``10000000...`` is stopped after eleven digits, where before it could run until
``max_tokens`` cut its call (BFCL's ``irrelevance_44``, an ``evolution_duration`` in years).
An open object's values (``additionalProperties`` absent or true) are any JSON, bounded
as a string like any untyped value (BFCL's ``irrelevance_69``: a ``dict`` argument whose
value ran on as a string until ``max_tokens``). Its keys are counted at ``cap`` but not
held to it: llguidance 1.9 does not implement ``propertyNames``.
The counts are a plan where a schema gives nothing to bound: other numbers are counted
at :data:`NUMBER_CHARS` characters (a JSON schema cannot bound a fraction's digits without
forbidding values such as ``1e-9``), a schema without a type (any JSON) as a bounded string,
a recursive schema past :data:`MAX_DEPTH` levels as one bounded string; strings with a
``pattern`` or ``format`` and whatever sits under ``not``, ``if`` or ``oneOf`` (where
narrowing is not monotone) are left as the schema gives them but counted at ``cap``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from structgen.constraints.schema.keywords import ANNOTATIONS
from structgen.constraints.schema.refs import Pointers

__all__ = ["INTEGER_BOUND", "MAX_DEPTH", "NUMBER_CHARS", "bounded_schema", "fit_cap", "items_cap", "json_chars"]

#: characters counted for a JSON number: an integer's longest bounded text (sign and
#: eleven digits); a plan for other numbers (their digits cannot be bounded by a schema)
NUMBER_CHARS = 12
#: the largest size of a bounded integer: eleven digits, ``NUMBER_CHARS`` with the sign
INTEGER_BOUND = 10 ** (NUMBER_CHARS - 1) - 1
#: deeper (recursive) schemas are counted as one bounded string
MAX_DEPTH = 12
#: where the walk descends, by the role of the subschema: a *value* (it describes a whole
#: value: bounded, and an untyped one becomes a bounded string) or a *branch* (AND-ed with
#: or chosen beside its parent: its strings and arrays bounded, nothing else added). Only
#: monotone places: narrowing them narrows the whole schema. ``not``, ``if`` and ``oneOf``
#: are not monotone (narrowing a ``not`` widens it; narrowing one ``oneOf`` branch can make
#: a value match exactly one branch that matched two), so they are left as they are.
_VALUE_ONE = frozenset({"items", "additionalItems", "additionalProperties", "contains",
                        "unevaluatedItems", "unevaluatedProperties"})
_VALUE_LIST = frozenset({"prefixItems", "items"})
_VALUE_MAP = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_BRANCH_ONE = frozenset({"then", "else"})
_BRANCH_LIST = frozenset({"anyOf", "allOf"})
_BRANCH_MAP = frozenset({"dependentSchemas", "dependencies"})


def items_cap(cap: int) -> int:
    """The bound on an array's items (and an open object's extra keys) for string bound ``cap``."""
    return max(2, cap // 6)


def _int(node: dict[str, Any], key: str, default: int) -> int:
    value = node.get(key, default)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _resolve(node: Any, pointers: Pointers) -> Any:
    """``node``'s local ``$ref`` target (``{}`` when it names nothing), else ``node``."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    ptr = pointers.local_pointer(ref) if isinstance(ref, str) else None
    if ptr is None:
        return node
    try:
        return pointers.resolve(ptr)
    except KeyError:
        return {}


def _string_max(node: dict[str, Any], cap: int) -> int:
    return max(min(cap, _int(node, "maxLength", cap)), _int(node, "minLength", 0))


def _items_max(node: dict[str, Any], cap: int) -> int:
    n = items_cap(cap)
    return max(min(n, _int(node, "maxItems", n)), _int(node, "minItems", 0))


def json_chars(node: Any, root: dict[str, Any], cap: int, *, separators: tuple[str, str] = (",", ":")) -> float:
    """The longest JSON text ``node`` (a part of ``root``) allows once bounded with ``cap``,
    written with ``separators`` (item, key) and no other whitespace."""
    return _chars(node, Pointers(root), cap, 0, len(separators[0]), len(separators[1]))


def _chars(node: Any, pointers: Pointers, cap: int, depth: int, item: int, key: int) -> float:
    def sub(child: Any) -> float:
        return _chars(child, pointers, cap, depth + 1, item, key)

    if depth > MAX_DEPTH:
        return cap + 2.0
    node = _resolve(node, pointers)
    if not isinstance(node, dict) or not node:
        return cap + 2.0  # any JSON: bounded as a string by bounded_schema
    if "const" in node:
        return float(len(json.dumps(node["const"], ensure_ascii=False)))
    if "enum" in node:
        return float(max((len(json.dumps(v, ensure_ascii=False)) for v in node["enum"]), default=0))
    alts = node.get("anyOf") or node.get("oneOf")
    if isinstance(alts, list) and alts:
        return max(sub(a) for a in alts)
    kind = node.get("type")
    if isinstance(kind, list):
        return max((sub({**node, "type": k}) for k in kind), default=0.0)
    if kind == "string":
        return 2.0 + _string_max(node, cap)
    if kind in ("number", "integer"):
        return float(NUMBER_CHARS)
    if kind == "boolean":
        return 5.0
    if kind == "null":
        return 4.0
    if kind == "array":
        n = _items_max(node, cap)
        prefix = node.get("prefixItems") or []
        parts = [sub(p) for p in prefix[:n]]
        items = node.get("items", {})
        if items is not False:
            parts += [sub(items)] * (n - len(parts))
        return 2.0 + sum(parts) + item * max(len(parts) - 1, 0)
    if kind == "object" or "properties" in node:
        props = node.get("properties") or {}
        members = [len(json.dumps(k, ensure_ascii=False)) + key + sub(v) for k, v in props.items()]
        extra = node.get("additionalProperties", True)
        if extra is not False:
            n = min(items_cap(cap), _int(node, "maxProperties", items_cap(cap)))
            value = extra if isinstance(extra, dict) else {}
            members += [cap + 2 + key + sub(value)] * n
        return 2.0 + sum(members) + item * max(len(members) - 1, 0)
    return cap + 2.0


def _bound(node: Any, cap: int, branch: bool = False) -> Any:
    if not isinstance(node, dict):
        return node  # a boolean schema
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in _VALUE_LIST and isinstance(v, list):
            out[k] = [_bound(s, cap) for s in v]
        elif k in _BRANCH_LIST and isinstance(v, list):
            out[k] = [_bound(s, cap, branch=True) for s in v]
        elif k in _VALUE_ONE:
            out[k] = _bound(v, cap)
        elif k in _BRANCH_ONE:
            out[k] = _bound(v, cap, branch=True)
        elif k in _VALUE_MAP and isinstance(v, dict):
            out[k] = {n: _bound(s, cap) for n, s in v.items()}
        elif k in _BRANCH_MAP and isinstance(v, dict):
            out[k] = {n: _bound(s, cap, branch=True) for n, s in v.items()}  # a dependencies list stays one
        else:
            out[k] = v
    if "enum" in out or "const" in out or "$ref" in out:
        return out
    kind = out.get("type")
    if kind is None and not branch and not set(out) - ANNOTATIONS:
        out["type"] = kind = "string"  # any JSON: a bounded string
    kinds: list[Any] = kind if isinstance(kind, list) else [kind]
    if "string" in kinds and "pattern" not in out and "format" not in out:
        out["maxLength"] = _string_max(out, cap)
    if "array" in kinds:
        out["maxItems"] = _items_max(out, cap)
    if "integer" in kinds and "number" not in kinds:
        _bound_integer(out)
    if not branch and "object" in kinds:
        if out.get("additionalProperties", True) is True:
            out["additionalProperties"] = _bound({}, cap)  # any JSON: a bounded string, as counted
        if out["additionalProperties"] is not False:
            out["maxProperties"] = max(len(out.get("properties") or {}) + min(
                items_cap(cap), _int(out, "maxProperties", items_cap(cap))), _int(out, "minProperties", 0))
    return out


def _number(node: dict[str, Any], key: str) -> float | None:
    value = node.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bound_integer(node: dict[str, Any]) -> None:
    """``maximum`` / ``minimum`` of at most :data:`INTEGER_BOUND` in size, unless the
    schema's own are tighter or its other side requires values beyond the bound."""
    lo, hi = _number(node, "minimum"), _number(node, "maximum")
    lo_x, hi_x = _number(node, "exclusiveMinimum"), _number(node, "exclusiveMaximum")
    floor = max((v for v in (lo, lo_x) if v is not None), default=None)
    ceiling = min((v for v in (hi, hi_x) if v is not None), default=None)
    if (hi is None or hi > INTEGER_BOUND) and (floor is None or floor < INTEGER_BOUND):
        node["maximum"] = INTEGER_BOUND
    if (lo is None or lo < -INTEGER_BOUND) and (ceiling is None or ceiling > -INTEGER_BOUND):
        node["minimum"] = -INTEGER_BOUND


def bounded_schema(schema: dict[str, Any], cap: int) -> dict[str, Any]:
    """``schema`` with strings at most ``cap`` characters, arrays :func:`items_cap` items and
    integers at most :data:`INTEGER_BOUND` in size, each never below the schema's own
    minimum (a copy; ``$defs`` bounded too)."""
    return dict(_bound(copy.deepcopy(schema), cap))


def fit_cap(schema: dict[str, Any], budget: float, *, floor: int = 1,
            separators: tuple[str, str] = (",", ":")) -> int:
    """The largest ``cap`` (at least ``floor``, at most ``budget``) with which the longest
    text of ``schema`` is at most ``budget`` characters; ``floor`` when even that does not
    fit (a plan: the caller serves it best effort)."""
    lo, hi = 0, max(int(budget), 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if json_chars(schema, schema, mid, separators=separators) <= budget else (lo, mid - 1)
    return max(lo, floor)
