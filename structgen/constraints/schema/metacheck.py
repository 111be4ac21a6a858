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


#: a path in the schema as a chain ``(parent, key)`` (``()`` at the root): one small tuple
#: per step, made into a list only for an error message
_Path = tuple[Any, ...]


def _flat(path: _Path) -> list[Any]:
    out: list[Any] = []
    while path:
        path, key = path
        out.append(key)
    out.reverse()
    return out


class _Bad(Exception):
    def __init__(self, message: str, path: _Path):
        self.message = message
        self.path = _flat(path)


class Scan:
    """What one walk found: the first problem, every ``$ref``, and whether the schema is
    *plain* -- only keywords the engine enforces exactly with the validator's meaning, so
    normalisation can be skipped."""

    __slots__ = ("enum_values", "ids", "nodes", "plain", "problem", "refs", "sub_ids", "widest_optional")

    def __init__(self, draft: int) -> None:
        self.problem: tuple[str, list[Any]] | None = None
        self.refs: list[str] = []
        self.plain = draft >= 4
        self.sub_ids = False  # an $id below the root (it would move the base of $refs)
        self.ids = False  # an ``id`` anywhere (draft-04's $id; unknown to later drafts)
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
    "$id", "id", "patternProperties",
})
_PLAIN_FORMATS = ENGINE_FORMATS


def _meaningful() -> frozenset[str]:
    """Keywords some draft's validator or the engine gives a meaning; any other key
    (``x-...``, ``readonly``, ``_format``, ...) is ignored by both, so plainness holds."""
    neutral = {"readOnly", "writeOnly", "deprecated", "example", "markdownDescription", "enumDescriptions",
               "deprecationMessage", "definitions", "$defs"}  # (a $ref makes a schema not plain)
    return (frozenset(KNOWN) | ANNOTATIONS | {
        "$ref", "$dynamicRef", "$recursiveRef", "$vocabulary", "x-guidance", "additionalItems",
        "dependencies"}) - neutral - _PLAIN


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
        _check(schema, draft, (), 0, scan)
    except _Bad as bad:
        scan.problem = (bad.message, bad.path)
    except RecursionError:
        scan.problem = ("schema nested too deeply", [])
    if scan.refs and (scan.sub_ids or scan.ids):
        scan.plain = False  # an id moves the base $refs resolve against (without $refs, it means nothing)
    return scan


def meta_errors(schema: Any, draft: int) -> tuple[str, list[Any]] | None:
    """The first meta-schema violation in ``schema`` (draft 4, 6, 7, 2019 or 2020), or None."""
    return scan_schema(schema, draft).problem


def _optional(props: dict[str, Any], required: Any) -> int:
    """How many of ``props`` are optional."""
    if not isinstance(required, list):
        return len(props)
    return len(props) - sum(1 for r in set(map(str, required)) if r in props)


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


# each keyword's check (one branch of :func:`_check`, by code)
_STR, _TYPE, _MAP, _ONE, _LIST, _ITEMS, _PREFIX, _COUNT, _NUMBER, _EXCL, _MULT, _REQ, _ENUM, _UNIQ, \
    _DEPS, _DEPREQ, _ID = range(17)
_CODES: dict[str, int] = {
    **dict.fromkeys(_STRINGS, _STR), "type": _TYPE, **dict.fromkeys(_SCHEMA_MAPS, _MAP),
    **dict.fromkeys(_SCHEMA_ONE, _ONE), **dict.fromkeys(_SCHEMA_LISTS, _LIST), "items": _ITEMS,
    "prefixItems": _PREFIX, **dict.fromkeys(_COUNTS, _COUNT), **dict.fromkeys(_NUMBERS, _NUMBER),
    "exclusiveMaximum": _EXCL, "exclusiveMinimum": _EXCL, "multipleOf": _MULT, "required": _REQ,
    "enum": _ENUM, "uniqueItems": _UNIQ, "dependencies": _DEPS, "dependentRequired": _DEPREQ,
    "$id": _ID, "id": _ID,
}
# keys that make a schema not plain in a draft (a plain ``$ref`` is let through in _check)
_NOT_PLAIN = {d: ks | _MEANINGFUL | (frozenset({"exclusiveMinimum", "exclusiveMaximum"}) if d <= 4 else frozenset())
              for d, ks in _IGNORED.items()}


def _check(s: Any, draft: int, path: _Path, depth: int, scan: Scan) -> None:
    if depth > 500:
        raise _Bad("schema nested too deeply", path)
    if isinstance(s, bool):
        if draft < 6:
            raise _Bad(f"{s!r} is not of type 'object'", path)
        return
    if not isinstance(s, dict):
        raise _Bad(f"{_short(s)} is not of type 'object'" + ("" if draft < 6 else ", 'boolean'"), path)
    ignored = _IGNORED.get(draft, frozenset())
    not_plain = _NOT_PLAIN.get(draft, _MEANINGFUL)
    codes = _CODES
    scan.nodes += 1
    for k, v in s.items():
        if k in not_plain:
            if k in ignored:
                scan.plain = False  # the engine would read it, the draft's validator ignores it
                continue
            if scan.plain and not (k == "$ref" and _plain_ref(s, v, draft)):
                scan.plain = False  # the engine would read it otherwise than the draft's validator
        code = codes.get(k)
        if code is None:
            continue
        if code == _STR:
            if not isinstance(v, str):
                raise _Bad(f"{_short(v)} is not of type 'string'", (path, k))
            if k == "$ref":
                scan.refs.append(v)
            elif k == "format":
                if v not in _PLAIN_FORMATS:
                    scan.plain = False
            elif k == "pattern" and not _regex_ok(v):
                raise _Bad(f"{_short(v)} is not a 'regex'", (path, k))
        elif code == _TYPE:
            if isinstance(v, list):
                if len(set(map(repr, v))) != len(v):
                    raise _Bad(f"{_short(v)} has non-unique elements", (path, k))
                if not v and draft <= 4:
                    raise _Bad(f"{v!r} should be non-empty", (path, k))
                for n in v:
                    if not (isinstance(n, str) and n in _TYPE_NAMES):
                        raise _Bad(f"{_short(v)} is not valid under any of the given schemas", (path, k))
            elif not (isinstance(v, str) and v in _TYPE_NAMES):
                raise _Bad(f"{_short(v)} is not valid under any of the given schemas", (path, k))
        elif code == _MAP:
            if not isinstance(v, dict):
                raise _Bad(f"{_short(v)} is not of type 'object'", (path, k))
            if k == "properties" and len(v) > scan.widest_optional:
                scan.widest_optional = max(scan.widest_optional, _optional(v, s.get("required")))
            inner = (path, k)
            for pk, pv in v.items():
                _check(pv, draft, (inner, pk), depth + 1, scan)
        elif code == _ONE:
            if k in ("additionalProperties", "additionalItems") and isinstance(v, bool):
                continue
            _check(v, draft, (path, k), depth + 1, scan)
        elif code == _LIST:
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", (path, k))
            if not v:
                raise _Bad(f"{v!r} should be non-empty", (path, k))
            inner = (path, k)
            for i, x in enumerate(v):
                _check(x, draft, (inner, i), depth + 1, scan)
        elif code == _ITEMS:
            if isinstance(v, list) and draft < 2020:
                if draft <= 4 and not v:
                    raise _Bad(f"{v!r} should be non-empty", (path, k))
                inner = (path, k)
                for i, x in enumerate(v):
                    _check(x, draft, (inner, i), depth + 1, scan)
            else:
                _check(v, draft, (path, k), depth + 1, scan)
        elif code == _PREFIX:
            if draft >= 2020:
                if not isinstance(v, list) or not v:
                    raise _Bad(f"{_short(v)} is not a non-empty array", (path, k))
                inner = (path, k)
                for i, x in enumerate(v):
                    _check(x, draft, (inner, i), depth + 1, scan)
        elif code == _COUNT:
            if not _count(v):
                raise _Bad(f"{_short(v)} is not of type 'integer'" if not _num(v) else
                           f"{v!r} is less than the minimum of 0", (path, k))
        elif code == _NUMBER:
            if not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", (path, k))
        elif code == _EXCL:
            if draft <= 4:
                if not isinstance(v, bool):
                    raise _Bad(f"{_short(v)} is not of type 'boolean'", (path, k))
            elif not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", (path, k))
        elif code == _MULT:
            if not _num(v):
                raise _Bad(f"{_short(v)} is not of type 'number'", (path, k))
            if v <= 0:
                raise _Bad(f"{v!r} is less than or equal to the minimum of 0", (path, k))
        elif code == _REQ:
            if draft <= 3:
                continue
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", (path, k))
            if draft <= 4 and not v:
                raise _Bad(f"{v!r} should be non-empty", (path, k))
            for x in v:
                if not isinstance(x, str):
                    raise _Bad(f"{_short(x)} is not of type 'string'", (path, k))
            if len(set(v)) != len(v):
                raise _Bad(f"{_short(v)} has non-unique elements", (path, k))
        elif code == _ENUM:
            if not isinstance(v, list):
                raise _Bad(f"{_short(v)} is not of type 'array'", (path, k))
            scan.enum_values += len(v)
            if draft <= 4 and not v:
                raise _Bad(f"{v!r} should be non-empty", (path, k))
        elif code == _UNIQ:
            if not isinstance(v, bool):
                raise _Bad(f"{_short(v)} is not of type 'boolean'", (path, k))
        elif code == _DEPS:
            if not isinstance(v, dict):
                raise _Bad(f"{_short(v)} is not of type 'object'", (path, k))
            for dk, dv in v.items():
                if isinstance(dv, list):
                    if not all(isinstance(x, str) for x in dv):
                        raise _Bad(f"{_short(dv)} is not valid under any of the given schemas", ((path, k), dk))
                else:
                    _check(dv, draft, ((path, k), dk), depth + 1, scan)
        elif code == _DEPREQ:
            if draft >= 2019:
                if not isinstance(v, dict):
                    raise _Bad(f"{_short(v)} is not of type 'object'", (path, k))
                for dk, dv in v.items():
                    if not isinstance(dv, list) or not all(isinstance(x, str) for x in dv):
                        raise _Bad(f"{_short(dv)} is not of type 'array'", ((path, k), dk))
        else:  # _ID: an id moves the base of $refs (see scan_schema)
            if k == "$id":
                if depth:
                    scan.sub_ids = True
            else:
                scan.ids = True
            if (k == "$id" or draft <= 4) and not isinstance(v, str):
                raise _Bad(f"{_short(v)} is not of type 'string'", (path, k))
