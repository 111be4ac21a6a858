"""Final validation of generated text against its constraint spec.

Constrained decoding makes invalid output unlikely, not impossible: a server may ignore
the constraint, ``max_tokens`` may cut the text short, or the spec was compiled leniently
(``CompiledConstraint.exact is False``). So every constrained result passes through
:func:`validate_output`, which parses and checks it and never evaluates model output.

    validate_output(json_schema_spec(Person), '{"name":"Ada","age":36}')  # -> Person(...)
    validate_output(regex_spec(r"\\d+"), "42")                           # -> "42"

A failure raises :class:`~structgen.errors.OutputValidationError` with the raw text, one
message per error (each JSON error prefixed by its JSON path, ``$.items[2].price``), and
``truncated``. A broken *schema* (malformed, or a ``$ref`` that cannot be resolved offline
-- remote references are never fetched) raises :class:`~structgen.errors.ConstraintError`.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn

import referencing.exceptions

from structgen.constraints.schema import error_path, schema_validator
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.errors import ConstraintError, OutputValidationError

__all__ = ["validate_output"]

_MAX_ERRORS = 20
_TRUNCATED = "output was cut short by max_tokens"


def validate_output(spec: ConstraintSpec, text: str, *, truncated: bool = False) -> Any:
    """Check ``text`` against ``spec`` and return its value.

    * :class:`JsonSchemaSpec`: the parsed JSON, validated (formats checked); an instance of
      ``spec.model`` when the spec came from a pydantic model.
    * :class:`RegexSpec`: ``text`` itself, which must ``re.fullmatch`` the pattern.
    * :class:`ChoiceSpec`: ``text`` itself, which must be one of the choices.
    * :class:`GrammarSpec`: ``text`` unchanged (grammars are enforced while decoding only).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    if isinstance(spec, JsonSchemaSpec):
        return _validate_json(spec, text, truncated)
    if isinstance(spec, RegexSpec):
        try:
            pattern = re.compile(spec.pattern)
        except re.error as exc:
            raise ConstraintError(f"malformed regex: {exc}", constraint=spec.pattern) from exc
        if pattern.fullmatch(text) is None:
            _fail(text, truncated, "output does not match the regex",
                  [f"text does not fully match regex {spec.pattern!r}"])
        return text
    if isinstance(spec, ChoiceSpec):
        if text not in spec.choices:
            _fail(text, truncated, "output is not one of the choices",
                  [f"expected one of {list(spec.choices)!r}"])
        return text
    if isinstance(spec, GrammarSpec):
        if truncated:
            _fail(text, truncated, "output does not complete the grammar", ["the grammar may not be complete"])
        return text
    raise ConstraintError(f"unknown constraint spec {type(spec).__name__}")


def _fail(text: str, truncated: bool, message: str, errors: list[str]) -> NoReturn:
    if truncated:
        message = f"{message} ({_TRUNCATED})"
    raise OutputValidationError(message, raw=text, errors=errors, truncated=truncated)


def _validate_json(spec: JsonSchemaSpec, text: str, truncated: bool) -> Any:
    try:
        schema = json.loads(spec.schema)
    except ValueError as exc:
        raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=spec.schema) from exc
    validator = schema_validator(schema)  # ConstraintError if the schema itself is malformed
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        where = f"line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        _fail(text, truncated, "output is not valid JSON", [f"$: {reason} ({where})" if where else f"$: {reason}"])
    try:
        found = sorted(validator.iter_errors(value), key=lambda e: (list(map(str, e.path)), e.message))
    except referencing.exceptions.Unresolvable as exc:
        raise ConstraintError(f"JSON schema $ref cannot be resolved offline (never fetched): {exc}",
                              constraint=spec.schema) from exc
    if found:
        errors = [f"{error_path(e.path)}: {e.message}" for e in found[:_MAX_ERRORS]]
        if len(found) > _MAX_ERRORS:
            errors.append(f"... and {len(found) - _MAX_ERRORS} more")
        _fail(text, truncated, "output does not match the JSON schema", errors)
    if spec.model is None:
        return value
    return _validate_model(spec.model, text, truncated)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _validate_model(model: Any, text: str, truncated: bool) -> Any:
    try:
        return model.model_validate_json(text)
    except ValueError as exc:  # pydantic.ValidationError subclasses ValueError
        details = getattr(exc, "errors", None)
        errors: list[str] = []
        if callable(details):
            for item in details()[:_MAX_ERRORS]:
                errors.append(f"{error_path(item.get('loc', ()))}: {item.get('msg', 'invalid')}")
        _fail(text, truncated, f"output does not validate as {getattr(model, '__name__', 'the model')}",
              errors or [str(exc)])

