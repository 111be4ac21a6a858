"""Final validation of generated text against its constraint spec.

Constrained decoding makes invalid output unlikely, not impossible: a server may ignore
the constraint, ``max_tokens`` may cut the text short, or the spec was compiled leniently
(``CompiledConstraint.exact is False``). So every constrained result passes through
:func:`validate_output`, which dispatches to the validator its kind declares
(:mod:`structgen.constraints.kind`), parses and checks, and never evaluates model output.

    validate_output(json_schema_spec(Person), '{"name":"Ada","age":36}')  # -> Person(...)
    validate_output(regex_spec(r"\\d+"), "42")                           # -> "42"

Model output is untrusted input, so every check here is bounded: regexes run on the
engine's automaton and JSON-schema ``pattern`` s on RE2 (linear time, never a
backtracking engine); JSON is parsed strictly -- no duplicate keys, no number outside a
double's range, no lone surrogate, at most :data:`MAX_OUTPUT_DEPTH` levels deep.

A failure raises :class:`~structgen.errors.OutputValidationError` with the raw text, one
message per error (each JSON error prefixed by its JSON path, ``$.items[2].price``), and
``truncated``. A broken *schema* (malformed, self-recursive without end, or a ``$ref``
that cannot be resolved offline -- remote references are never fetched) raises
:class:`~structgen.errors.ConstraintError`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import TYPE_CHECKING, Any

import referencing.exceptions

from structgen.constraints.json_patterns import PatternTimeout, linear_validator_class
from structgen.constraints.kind import kind_of, output_failed
from structgen.constraints.schema import check_schema, error_path
from structgen.errors import ConstraintError

if TYPE_CHECKING:
    from structgen.constraints.kinds.json_schema import JsonSchemaSpec

__all__ = ["MAX_OUTPUT_DEPTH", "parse_json_strict", "validate_json", "validate_output"]

_MAX_ERRORS = 20
#: deepest JSON nesting accepted in model output (arrays and objects)
MAX_OUTPUT_DEPTH = 64


def validate_output(spec: Any, text: str, *, truncated: bool = False) -> Any:
    """Check ``text`` against ``spec`` and return its value.

    * JSON schema: the parsed JSON, validated (formats checked); an instance of
      ``spec.model`` when the spec came from a pydantic model.
    * regex: ``text`` itself, which the pattern must match in full.
    * choice: ``text`` itself, which must be one of the choices.
    * grammar: ``text`` unchanged (grammars are enforced while decoding only).
    * any other kind: what its registered validator returns.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    return kind_of(spec).validate(spec, text, truncated)


# -- JSON ---------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range for a double")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return out


def _checked_value(value: Any) -> str | None:
    """Why a parsed value is not acceptable JSON data (too deep, a lone surrogate), or None."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return f"string {node[:40]!r} holds a lone surrogate (not Unicode text)"
        elif isinstance(node, (dict, list)):
            if depth >= MAX_OUTPUT_DEPTH:
                return f"value is nested deeper than {MAX_OUTPUT_DEPTH} levels"
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, item in items:
                if isinstance(key, str):
                    stack.append((key, depth))
                stack.append((item, depth + 1))
    return None


def parse_json_strict(text: str) -> Any:
    """Parse ``text`` as JSON data, rejecting what ``json.loads`` lets through.

    Raises ``ValueError`` (``json.JSONDecodeError`` for syntax) for: duplicate keys,
    ``NaN``/``Infinity``, numbers beyond a double (``1e400``), lone surrogates, nesting
    deeper than :data:`MAX_OUTPUT_DEPTH`.
    """
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite,
                           object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError(f"value is nested deeper than {MAX_OUTPUT_DEPTH} levels") from None
    problem = _checked_value(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _format_checker() -> Any:
    import jsonschema

    checker = jsonschema.FormatChecker()  # every format jsonschema can check, whatever the draft

    def is_regex(instance: object) -> bool:  # model output: a parser error is "not a regex"
        if not isinstance(instance, str):
            return True
        try:
            re.compile(instance)
        except (re.error, RecursionError, OverflowError, MemoryError):
            return False
        return True

    checker.checks("regex")(is_regex)
    return checker


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    """The (cached) offline jsonschema validator for a schema, pattern searches on RE2."""
    try:
        schema = json.loads(schema_text, parse_constant=_reject_constant)
    except RecursionError:
        raise ConstraintError("json_schema is nested too deeply", constraint=schema_text) from None
    except ValueError as exc:
        raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=schema_text) from exc
    import referencing

    draft: Any = check_schema(schema)  # ConstraintError if the schema is malformed
    cls = linear_validator_class(draft)

    def no_retrieval(uri: str) -> Any:
        raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]

    registry: Any = referencing.Registry(retrieve=no_retrieval)  # type: ignore[call-arg]
    return cls(schema, registry=registry, format_checker=_format_checker())


def validate_json(spec: JsonSchemaSpec, text: str, truncated: bool) -> Any:
    """Parse ``text`` strictly and validate it against ``spec.schema`` (then ``spec.model``)."""
    validator = _validator(spec.schema)
    try:
        value = parse_json_strict(text)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            error = f"$: {exc.msg} (line {exc.lineno} column {exc.colno})"
        else:
            error = f"$: {exc}"
        output_failed(text, truncated, "output is not valid JSON", [error])
    try:
        found = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.path)), e.message))
    except referencing.exceptions.Unresolvable as exc:
        raise ConstraintError(f"JSON schema $ref cannot be resolved offline (never fetched): {exc}",
                              constraint=spec.schema) from exc
    except RecursionError:  # the value is at most MAX_OUTPUT_DEPTH deep: the schema loops
        raise ConstraintError("JSON schema refers to itself without end ($ref / $recursiveRef / "
                              "$dynamicRef cycle that never reaches a keyword)", constraint=spec.schema) from None
    except PatternTimeout as exc:
        output_failed(text, truncated, "output could not be checked against the JSON schema", [str(exc)])
    if found:
        errors = [f"{error_path(e.path)}: {e.message}" for e in found[:_MAX_ERRORS]]
        if len(found) > _MAX_ERRORS:
            errors.append(f"... and {len(found) - _MAX_ERRORS} more")
        output_failed(text, truncated, "output does not match the JSON schema", errors)
    if spec.model is None:
        return value
    return _validate_model(spec.model, text, truncated)


def _validate_model(model: Any, text: str, truncated: bool) -> Any:
    try:
        return model.model_validate_json(text)
    except ValueError as exc:  # pydantic.ValidationError subclasses ValueError
        details = getattr(exc, "errors", None)
        errors: list[str] = []
        if callable(details):
            for item in details()[:_MAX_ERRORS]:
                errors.append(f"{error_path(item.get('loc', ()))}: {item.get('msg', 'invalid')}")
        output_failed(text, truncated, f"output does not validate as {getattr(model, '__name__', 'the model')}",
                      errors or [str(exc)])
