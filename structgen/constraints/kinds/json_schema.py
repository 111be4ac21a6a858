"""The JSON-schema constraint kind: the output must be JSON valid against a schema.

:func:`json_schema_spec` is the boundary every schema crosses (``gen(json_schema=...)``):
it turns a JSON string, a dict or a pydantic model class into canonical JSON text, checks
it at once (JSON-expressible values, nesting depth, the draft's meta-schema rules, no
remote ``$ref``) and, unless ``strict=False``, *closes* its objects (:func:`close_schema`)
so generation cannot invent keys. Final validation is
:func:`structgen.constraints.validation.validate_json`, against the same (closed) schema.
"""

from __future__ import annotations

import functools
import json
import reprlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from structgen.constraints.kind import ConstraintKind, ConstraintSpec, register_kind
from structgen.errors import ConstraintError

__all__ = ["MAX_SCHEMA_DEPTH", "JsonSchemaSpec", "close_schema", "json_schema_spec"]

#: deepest nesting of JSON values a schema may have (a schema is data: 128 levels is far
#: beyond any real one, and well inside what the checks and engines can walk)
MAX_SCHEMA_DEPTH = 128


@dataclass(frozen=True)
class JsonSchemaSpec(ConstraintSpec):
    """The output must be JSON valid against ``schema`` (canonical JSON text).

    ``model`` is the pydantic class the schema came from, if any (typed results).
    ``whitespace``: ``"compact"`` (default; no whitespace between tokens) or ``"flexible"``.
    """

    schema: str
    model: Any = field(default=None, compare=False, hash=False)
    whitespace: Literal["compact", "flexible"] = "compact"
    kind: Literal["json_schema"] = "json_schema"

    @property
    def schema_dict(self) -> Any:
        return json.loads(self.schema)

    def describe(self) -> str:
        title = ""
        if self.model is not None:
            title = getattr(self.model, "__name__", "")
        return f"json_schema {title or self.schema[:80]}"


def _is_pydantic_model(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, "model_json_schema") and hasattr(obj, "model_validate")


# -- closing objects ----------------------------------------------------------------------

#: keywords beside ``properties`` that can admit keys declared elsewhere: an object with
#: one of them is left open (closing it would reject keys the other schema declares)
_MERGING = ("allOf", "anyOf", "oneOf", "$ref", "$dynamicRef", "$recursiveRef", "if", "then", "else",
            "dependentSchemas", "dependencies", "additionalProperties", "unevaluatedProperties",
            "patternProperties")
_OBJECT_WORDS = ("properties", "required", "patternProperties", "additionalProperties",
                 "dependentRequired", "dependencies", "propertyNames", "minProperties", "maxProperties")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_ONE = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems", "unevaluatedItems",
        "contains", "propertyNames", "not", "if", "then", "else", "contentSchema")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def _shared_refs(schema: Any) -> set[str]:
    """``$ref`` targets whose object is merged with another schema: they stay open."""
    out: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        own_words = any(k in node for k in _OBJECT_WORDS)
        ref = node.get("$ref")
        if isinstance(ref, str) and (own_words or "allOf" in node):
            out.add(ref)
        for word in ("allOf", "anyOf", "oneOf"):
            branches = node.get(word)
            if isinstance(branches, list) and (own_words or (word == "allOf" and len(branches) > 1)):
                out.update(b["$ref"] for b in branches if isinstance(b, dict) and isinstance(b.get("$ref"), str))
        for key, value in node.items():
            if key not in ("const", "enum", "default", "examples"):
                stack.append(value)
    return out


def close_schema(schema: Any) -> Any:
    """``schema`` with ``"additionalProperties": false`` added to each object schema that
    declares ``properties`` and says nothing about other keys -- unless the object is
    merged with another schema (``allOf`` branches and their neighbours, ``$ref`` beside
    object keywords, ``anyOf``/``oneOf`` branches under an object with its own keywords,
    ``if``/``then``/``else``), where closing would reject keys declared elsewhere.
    Returns a new value; the input is not changed."""
    shared = _shared_refs(schema)

    def walk(node: Any, pointer: str, may_close: bool) -> Any:
        if isinstance(node, list):
            return node
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        own_words = any(k in node for k in _OBJECT_WORDS)
        for key, value in node.items():
            if key in _MAPS and isinstance(value, dict):
                out[key] = {k: walk(v, f"{pointer}/{key}/{_escape(k)}", True) for k, v in value.items()}
            elif key in _LISTS and isinstance(value, list):
                # anyOf / oneOf branches are the whole object only where their holder is:
                # under an allOf branch (may_close false) they meet the other branches' keys
                closable = key in ("prefixItems", "items") or (key != "allOf" and not own_words and may_close)
                out[key] = [walk(v, f"{pointer}/{key}/{i}", closable) for i, v in enumerate(value)]
            elif key in _ONE:
                out[key] = walk(value, f"{pointer}/{key}", key not in ("if", "then", "else", "not"))
            else:
                out[key] = value
        if (may_close and isinstance(node.get("properties"), dict) and not any(k in node for k in _MERGING)
                and pointer not in shared and _closable(node)):
            out["additionalProperties"] = False
        return out

    return walk(schema, "#", True)


def _closable(node: dict[str, Any]) -> bool:
    """Closing keeps some value valid: every required key is declared, and ``minProperties``
    does not ask for more keys than are declared (else closing would empty the schema)."""
    props = node["properties"]
    required = node.get("required")
    if isinstance(required, list) and any(r not in props for r in required if isinstance(r, str)):
        return False
    least = node.get("minProperties")
    return not (isinstance(least, int) and least > len(props))


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# -- the boundary -------------------------------------------------------------------------


def _depth(value: Any) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_SCHEMA_DEPTH:
                return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def json_schema_spec(schema: Any, *, whitespace: Literal["compact", "flexible"] = "compact",
                     strict: bool = True) -> JsonSchemaSpec:
    """Build a :class:`JsonSchemaSpec` from a JSON string, a dict, or a pydantic model class.

    ``strict`` (default): objects that declare ``properties`` and say nothing about other
    keys are closed (:func:`close_schema`), so generation -- and final validation -- allow
    only the declared keys; ``strict=False`` keeps JSON Schema's open default.
    Raises :class:`ConstraintError` at once for text that is not JSON, a value JSON cannot
    express (a set, NaN), nesting deeper than :data:`MAX_SCHEMA_DEPTH`, a schema its
    draft's meta-schema rejects, or a remote ``$ref``.
    """
    if not isinstance(whitespace, str) or whitespace not in ("compact", "flexible"):
        raise ConstraintError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
    if not isinstance(strict, bool):
        raise ConstraintError(f"strict must be True or False, not {strict!r}")
    if _is_pydantic_model(schema):
        return _model_spec(schema, whitespace, strict)
    return _build(schema, None, whitespace, strict)


@functools.lru_cache(maxsize=256)
def _model_spec(model: Any, whitespace: Literal["compact", "flexible"], strict: bool) -> JsonSchemaSpec:
    """A pydantic model's spec, built once per (model, options): a program body runs per call."""
    return _build(model, model, whitespace, strict)


def _build(schema: Any, model: Any, whitespace: Literal["compact", "flexible"], strict: bool) -> JsonSchemaSpec:
    if model is not None:
        try:
            schema_obj: Any = schema.model_json_schema()
        except Exception as exc:  # pydantic raises its own errors for unschematisable types
            raise ConstraintError(f"cannot build a JSON schema from {schema.__name__}: {exc}") from exc
    elif isinstance(schema, (str, bytes)):
        try:
            schema_obj = json.loads(schema, parse_constant=_reject_constant)
        except RecursionError:
            raise ConstraintError(f"json_schema is nested deeper than {MAX_SCHEMA_DEPTH} levels",
                                  constraint=str(schema)[:200]) from None
        except ValueError as exc:
            raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=str(schema)) from exc
    elif isinstance(schema, (dict, bool)):
        schema_obj = schema
    else:
        raise ConstraintError(
            f"json_schema must be a JSON string, a dict or a pydantic model class, not {type(schema).__name__}")
    if not isinstance(schema_obj, (dict, bool)):
        raise ConstraintError("a JSON schema must be an object or a boolean", constraint=_shown(schema_obj))
    try:
        # Key order is kept, not sorted: the order of "properties" is the order in which
        # constrained decoding generates the fields (e.g. "reasoning" before "answer").
        text = json.dumps(schema_obj, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise ConstraintError(f"json_schema is nested deeper than {MAX_SCHEMA_DEPTH} levels",
                              constraint=_shown(schema_obj)) from None
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"json_schema holds a value JSON cannot express: {exc}",
                              constraint=_shown(schema_obj)) from None
    cached = _checked.get((text, strict))
    if cached is not None:  # the same schema again (a program body runs once per call)
        return JsonSchemaSpec(schema=cached, model=model, whitespace=whitespace)
    # fewer brackets than the limit cannot nest deeper than it: walk only the others
    if text.count("{") + text.count("[") > MAX_SCHEMA_DEPTH and _depth(schema_obj) > MAX_SCHEMA_DEPTH:
        raise ConstraintError(f"json_schema is nested deeper than {MAX_SCHEMA_DEPTH} levels",
                              constraint=_shown(schema_obj))
    from structgen.constraints.schema.prepare import prepare_schema

    try:
        # the draft's meta-schema rules and the offline rule (kept for the compile)
        prepare_schema(text, parsed=schema_obj)
    except RecursionError:
        raise ConstraintError("json_schema is nested too deeply to check", constraint=_shown(schema_obj)) from None
    key = (text, strict)
    if strict:
        closed = close_schema(schema_obj)
        if closed != schema_obj:
            text = json.dumps(closed, separators=(",", ":"), allow_nan=False)
            prepare_schema(text, parsed=closed)  # what the compile prepares: ready for it
    with _checked_lock:
        _checked[key] = text
        while len(_checked) > 512:
            _checked.popitem(last=False)
    return JsonSchemaSpec(schema=text, model=model, whitespace=whitespace)


#: (schema text as given, strict) -> the checked (and closed) text, most recent last
_checked: OrderedDict[tuple[str, bool], str] = OrderedDict()
_checked_lock = threading.Lock()


def _shown(value: Any) -> str:
    """A short, depth-bounded rendering of a schema for an error message."""
    return reprlib.repr(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _validate(spec: JsonSchemaSpec, text: str, truncated: bool) -> Any:
    from structgen.constraints.validation import validate_json

    return validate_json(spec, text, truncated)


JSON_SCHEMA = register_kind(ConstraintKind(name="json_schema", spec_type=JsonSchemaSpec, feature="json_schema",
                                           description="JSON schema constraints", validate=_validate))
