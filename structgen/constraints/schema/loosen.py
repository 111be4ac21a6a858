"""Wider schemas for the ladder's looser rungs: each admits every value the input admits.

:func:`relax` drops hard keywords (patterns, formats, counts, ...), :func:`skeleton`
keeps only the shape (types, properties, items, enums), :func:`top_types` keeps only the
top-level type(s). :func:`walk` applies a rewrite to every subschema, bottom-up.
Widening is only sound in positive positions; normalisation leaves no ``not`` / ``if``
behind, and every rewrite reads ``oneOf`` as ``anyOf`` before loosening a branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from structgen.constraints.schema.instance_types import types_of

__all__ = ["fold_pattern_properties", "one_of_to_any_of", "relax", "skeleton", "top_types", "walk"]

# keywords dropped by the "relaxed" rung (each drop widens)
_RELAX_DROP = frozenset({
    "pattern", "format", "minLength", "maxLength", "minProperties", "maxProperties", "propertyNames",
    "contains", "minContains", "maxContains", "uniqueItems", "multipleOf", "unevaluatedProperties",
    "unevaluatedItems", "minItems", "maxItems",
})
_SKELETON_KEEP = frozenset({
    "type", "properties", "required", "items", "prefixItems", "additionalProperties", "enum", "const",
    "anyOf", "$ref", "$defs", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "contains", "propertyNames", "not", "if", "then",
               "else", "unevaluatedProperties", "unevaluatedItems")


def walk(s: Any, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
    """Apply ``fn`` to every schema object, bottom-up (schema positions only)."""
    if not isinstance(s, dict):
        return s
    out: dict[str, Any] = {}
    for k, v in s.items():
        if k in _SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {pk: walk(pv, fn) for pk, pv in v.items()}
        elif k in _SCHEMA_LISTS and isinstance(v, list):
            out[k] = [walk(x, fn) for x in v]
        elif k in _SCHEMA_ONE:
            out[k] = walk(v, fn)
        else:
            out[k] = v
    return fn(out)


def one_of_to_any_of(s: dict[str, Any]) -> dict[str, Any]:
    """``oneOf`` read as ``anyOf`` (wider: exclusivity dropped)."""
    if "oneOf" in s:
        s = dict(s)
        branches = s.pop("oneOf")
        if "anyOf" in s:
            s["allOf"] = list(s.get("allOf") or []) + [{"anyOf": branches}]
        else:
            s["anyOf"] = branches
    return s


def fold_pattern_properties(s: dict[str, Any]) -> dict[str, Any]:
    """``patternProperties`` folded into ``additionalProperties`` (wider): a key matching a
    pattern is checked against it, any other against ``additionalProperties``; their union
    admits both."""
    out = dict(s)
    pats = out.pop("patternProperties", None)
    if isinstance(pats, dict) and pats:
        extra = out.get("additionalProperties", True)
        if extra is not True and extra != {}:
            branches = list(pats.values()) + ([extra] if extra is not False else [])
            out["additionalProperties"] = {"anyOf": branches} if len(branches) > 1 else branches[0]
    return out


def _relax_node(s: dict[str, Any]) -> dict[str, Any]:
    s = one_of_to_any_of(s)
    out = fold_pattern_properties({k: v for k, v in s.items() if k not in _RELAX_DROP})
    for k in ("not", "if", "then", "else", "dependentSchemas", "dependentRequired"):
        out.pop(k, None)  # (normalisation removed these; here only for foreign input)
    return out


def relax(schema: Any) -> Any:
    """The ``relaxed`` rung: hard keywords dropped (admits every value ``schema`` admits)."""
    return walk(schema, _relax_node)


def _skeleton_node(s: dict[str, Any]) -> dict[str, Any]:
    s = _relax_node(s)
    out = {k: v for k, v in s.items() if k in _SKELETON_KEEP}  # allOf branches dropped: widening
    if out.get("additionalProperties") not in (None, True, False) and not isinstance(
            out.get("additionalProperties"), dict):
        out.pop("additionalProperties")
    return out


def skeleton(schema: Any) -> Any:
    """The ``skeleton`` rung: shape only (types, properties, items, enums)."""
    return walk(schema, _skeleton_node)


def top_types(schema: Any) -> Any:
    """The ``type`` rung: any JSON value of the schema's top-level type(s)."""
    ts = types_of(schema) if isinstance(schema, dict) else None
    if not ts:
        return {}
    if "number" in ts:
        ts = ts - {"integer"}
    out = sorted(ts)
    return {"type": out[0] if len(out) == 1 else out}
