"""A fast structural check of a JSON schema against its draft's meta-schema rules.

jsonschema's own meta-schema validation resolves ``$dynamicRef`` s and costs more than
compiling the grammar; this module checks the same keyword-value rules (draft-04 ..
2020-12) in one walk: types of keyword values, known type names, non-negative counts,
positive ``multipleOf``, unique string ``required`` lists, non-empty ``allOf`` /
``anyOf`` / ``oneOf``, subschemas that are objects or booleans. ``format`` values are
not checked (the meta-schemas do not check them either). The same walk collects every
``$ref``, whether the schema is *plain* (see :class:`Scan`) and its size.

:func:`scan_schema` returns the :class:`Scan`; :func:`meta_errors` only its first problem.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from structgen.constraints.schema.keywords import ANNOTATIONS, ENGINE_FORMATS, KNOWN, NEWER

__all__ = ["Scan", "meta_errors", "scan_schema"]

_TYPE_NAMES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems", "additionalItems", "contentSchema")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_COUNTS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties",
           "minContains", "maxContains")
_NUMBERS = ("maximum", "minimum")
_STRINGS = ("pattern", "format", "$ref", "$schema", "$comment", "title", "description", "$anchor",
            "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "contentEncoding", "contentMediaType")


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _count(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, float):
        return x.is_integer() and x >= 0
    return isinstance(x, int) and x >= 0


def _ignored() -> dict[int, frozenset[str]]:
    old = ("$defs", "dependentSchemas", "dependentRequired", "prefixItems")
    return {d: frozenset(ks) | (frozenset(old) if d < 2019 else frozenset()) for d, ks in NEWER.items()}


_IGNORED = _ignored()
_regex_cache: dict[str, bool] = {}


def _regex_ok(pattern: str) -> bool:
    """What the meta-schema's ``format: regex`` check says (jsonschema uses ``re.compile``)."""
    ok = _regex_cache.get(pattern)
    if ok is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                re.compile(pattern)
            ok = True
        except (re.error, RecursionError, OverflowError, ValueError):
            ok = False
        if len(_regex_cache) < 4096:
            _regex_cache[pattern] = ok
    return ok


class _Bad(Exception):
    def __init__(self, message: str, path: list[Any]):
        self.message = message
        self.path = path


class Scan:
    """What one walk found: the first problem, every ``$ref``, and whether the schema is
    *plain* -- only keywords the engine enforces exactly with the validator's meaning, so
    normalisation can be skipped."""

    __slots__ = ("enum_values", "nodes", "plain", "problem", "refs", "sub_ids", "widest_optional")

    def __init__(self, draft: int) -> None:
        self.problem: tuple[str, list[Any]] | None = None
        self.refs: list[str] = []
        self.plain = draft >= 4
        self.sub_ids = False  # an $id below the root (it would move the base of $refs)
        # size: what compile time grows with (the ladder's limits read these)
        self.nodes = 0  # schema objects
        self.widest_optional = 0  # the most optional properties of one object
        self.enum_values = 0  # enum values, all enums together


# keywords llguidance enforces exactly, with the same meaning in drafts 4 .. 2020-12
# (draft-04's boolean exclusive bounds and its unknown `const` are excluded above)
_PLAIN = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "anyOf", "format", "title", "description", "default", "examples", "$schema", "$comment",
    "$id", "patternProperties",
})
_PLAIN_FORMATS = ENGINE_FORMATS


def _meaningful() -> frozenset[str]:
    """Keywords some draft's validator or the engine gives a meaning; any other key
    (``x-...``, ``readonly``, ``_format``, ...) is ignored by both, so plainness holds."""
    neutral = {"readOnly", "writeOnly", "deprecated", "example", "markdownDescription", "enumDescriptions",
               "deprecationMessage", "definitions", "$defs"}  # (a $ref makes a schema not plain)
    return (frozenset(KNOWN) | ANNOTATIONS | {
        "$ref", "$dynamicRef", "$recursiveRef", "$vocabulary", "x-guidance", "additionalItems",
        "dependencies", "id"}) - neutral - _PLAIN


_MEANINGFUL = _meaningful()


# a plain $ref: a JSON pointer into the document, no escapes (the engine then resolves
# it as the validator does); before 2019-09 only with siblings both ignore
_PLAIN_REF = re.compile(r"#(/[A-Za-z0-9_.:$@+-]+)*")
_REF_SIBLINGS = frozenset({"$ref", "title", "description", "$comment", "default", "examples"})


def _plain_ref(s: dict[str, Any], ref: Any, draft: int) -> bool:
    if not isinstance(ref, str) or _PLAIN_REF.fullmatch(ref) is None:
        return False
    return draft >= 2019 or all(k in _REF_SIBLINGS or (k not in _MEANINGFUL and k not in _PLAIN) for k in s)


def scan_schema(schema: Any, draft: int) -> Scan:
    """One walk: meta-schema problems (first one), ``$ref`` s, plainness."""
    scan = Scan(draft)
    try:
        _check(schema, draft, [], 0, scan)
    except _Bad as bad:
        scan.problem = (bad.message, bad.path)
    except RecursionError:
        scan.problem = ("schema nested too deeply", [])
    if scan.refs and scan.sub_ids:
        scan.plain = False
    return scan


def meta_errors(schema: Any, draft: int) -> tuple[str, list[Any]] | None:
    """The first meta-schema violation in ``schema`` (draft 4, 6, 7, 2019 or 2020), or None."""
    return scan_schema(schema, draft).problem


def _schema(s: Any, draft: int, path: list[Any], depth: int, scan: Scan) -> None:
    if isinstance(s, bool) and draft >= 6:
        return
    if not isinstance(s, dict):
        raise _Bad(f"{_short(s)} is not of type 'object'" + ("" if draft < 6 else ", 'boolean'"), path)
    _check(s, draft, path, depth + 1, scan)


def _optional(props: dict[str, Any], required: Any) -> int:
    """How many of ``props`` are optional."""
    if not isinstance(required, list):
        return len(props)
    return len(props) - sum(1 for r in set(map(str, required)) if r in props)


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def _check(s: Any, draft: int, path: list[Any], depth: int, scan: Scan) -> None:
    if depth > 500:
        raise _Bad("schema nested too deeply", path)
    if isinstance(s, bool):
        if draft < 6:
            raise _Bad(f"{s!r} is not of type 'object'", path)
        return
    if not isinstance(s, dict):
        raise _Bad(f"{_short(s)} is not of type 'object', 'boolean'", path)
    ignored = _IGNORED.get(draft, ())
    scan.nodes += 1
    for k, v in s.items():
        if scan.plain and (k in ignored or k in _MEANINGFUL or (k == "format" and v not in _PLAIN_FORMATS)
                           or (draft <= 4 and k in ("exclusiveMinimum", "exclusiveMaximum"))) \
                and not (k == "$ref" and _plain_ref(s, v, draft)):
            scan.plain = False  # the engine would read it otherwise than the draft's validator
        if k == "$id" and depth:
            scan.sub_ids = True
        if k in ignored:
            continue
        if k == "$ref" and isinstance(v, str):
            scan.refs.append(v)
        if k == "type":
            names = v if isinstance(v, list) else [v]
            if isinstance(v, list) and len(set(map(repr, v))) != len(v):
                raise _Bad(f"{_short(v)} has non-unique elements", path + [k])
            if isinstance(v, list) and not v and draft <= 4:
                raise _Bad(f"{v!r} should be non-empty", path + [k])
            for n in names:
                if not (isinstance(n, str) and n in _TYPE_NAMES):
                    raise _Bad(f"{_short(v)} is not valid under any of the given schemas", path + [k])
        elif k in _SCHEMA_MAPS:
            if not isinstance(v, dict):
                raise _Bad(f"{_short(v)} is not of type 'object'", path + [k])
            if k == "properties" and len(v) > scan.widest_optional:
                scan.widest_optional = max(scan.widest_optional, _optional(v, s.get("required")))
            for pk, pv in v.items():
                _schema(pv, draft, path + [k, pk], depth, scan)
        elif k in _SCHEMA_ONE:
            if k in ("additionalProperties", "additionalItems") and isinstance(v, bool):
                continue
            _schema(v, draft, path + [k], depth, scan)
        elif k in _SCHEMA_LISTS:
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", path + [k])
            if not v:
                raise _Bad(f"{v!r} should be non-empty", path + [k])
            for i, x in enumerate(v):
                _schema(x, draft, path + [k, i], depth, scan)
        elif k == "items":
            if isinstance(v, list) and draft < 2020:
                if draft <= 4 and not v:
                    raise _Bad(f"{v!r} should be non-empty", path + [k])
                for i, x in enumerate(v):
                    _schema(x, draft, path + [k, i], depth, scan)
            else:
                _schema(v, draft, path + [k], depth, scan)
        elif k == "prefixItems" and draft >= 2020:
            if not isinstance(v, list) or not v:
                raise _Bad(f"{_short(v)} is not a non-empty array", path + [k])
            for i, x in enumerate(v):
                _schema(x, draft, path + [k, i], depth, scan)
        elif k in _COUNTS:
            if not _count(v):
                raise _Bad(f"{_short(v)} is not of type 'integer'" if not _num(v) else
                           f"{v!r} is less than the minimum of 0", path + [k])
        elif k in _NUMBERS:
            if not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", path + [k])
        elif k in ("exclusiveMaximum", "exclusiveMinimum"):
            if draft <= 4:
                if not isinstance(v, bool):
                    raise _Bad(f"{_short(v)} is not of type 'boolean'", path + [k])
            elif not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", path + [k])
        elif k == "multipleOf":
            if not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", path + [k])
            if v <= 0:
                raise _Bad(f"{v!r} is less than or equal to the minimum of 0", path + [k])
        elif k == "required":
            if draft <= 3:
                continue
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", path + [k])
            if draft <= 4 and not v:
                raise _Bad(f"{v!r} should be non-empty", path + [k])
            for x in v:
                if not isinstance(x, str):
                    raise _Bad(f"{_short(x)} is not of type 'string'", path + [k])
            if len(set(v)) != len(v):
                raise _Bad(f"{_short(v)} has non-unique elements", path + [k])
        elif k == "enum":
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", path + [k])
            scan.enum_values += len(v)
            if draft <= 4 and not v:
                raise _Bad(f"{v!r} should be non-empty", path + [k])
        elif k == "uniqueItems":
            if not isinstance(v, bool):
                raise _Bad(f"{_short(v)} is not of type 'boolean'", path + [k])
        elif k in _STRINGS:
            if not isinstance(v, str):
                raise _Bad(f"{_short(v)} is not of type 'string'", path + [k])
            if k == "pattern" and not _regex_ok(v):
                raise _Bad(f"{_short(v)} is not a 'regex'", path + [k])
        elif k in ("dependencies",):
            if not isinstance(v, dict):
                raise _Bad(f"{_short(v)} is not of type 'object'", path + [k])
            for dk, dv in v.items():
                if isinstance(dv, list):
                    if not all(isinstance(x, str) for x in dv):
                        raise _Bad(f"{_short(dv)} is not valid under any of the given schemas", path + [k, dk])
                else:
                    _schema(dv, draft, path + [k, dk], depth, scan)
        elif k == "dependentRequired" and draft >= 2019:
            if not isinstance(v, dict):
                raise _Bad(f"{_short(v)} is not of type 'object'", path + [k])
            for dk, dv in v.items():
                if not isinstance(dv, list) or not all(isinstance(x, str) for x in dv):
                    raise _Bad(f"{_short(dv)} is not of type 'array'", path + [k, dk])
        elif k in ("$id", "id") and (k == "$id" or draft <= 4) and not isinstance(v, str):
            raise _Bad(f"{_short(v)} is not of type 'string'", path + [k])
