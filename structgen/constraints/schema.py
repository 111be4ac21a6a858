"""JSON schemas: meta-schema checking and offline validators (jsonschema, no retrieval).

Used by the compiler (a malformed schema fails before any token) and by
:func:`structgen.constraints.validation.validate_output`. Remote ``$ref`` s are never fetched: the
``referencing`` registry has no retriever, so an unknown URI is an error, not a request.

:func:`prepare_schema` is the single step every schema goes through before an engine
sees it -- the place where schema normalisation plugs in.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing
import referencing.exceptions
import referencing.jsonschema

from structgen.errors import ConstraintError

__all__ = ["check_schema", "checked_schema", "error_path", "prepare_schema", "schema_validator"]


def _no_retrieval(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def _validator_class(schema: Any) -> type[Any]:
    """The jsonschema validator class for the schema's ``$schema`` draft (default 2020-12).

    An unknown ``$schema`` URI falls back to 2020-12 (jsonschema would only warn).
    """
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        raise ConstraintError("$schema must be a string", constraint=_dump(schema))
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


_ALL_FORMATS = jsonschema.FormatChecker()


def schema_validator(schema: Any) -> Any:
    """A jsonschema validator for ``schema`` with format checking on and no remote retrieval.

    The schema is checked against its draft's meta-schema first (:func:`check_schema`).
    """
    cls = check_schema(schema)
    registry: referencing.Registry[Any] = referencing.Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]
    # every format jsonschema can check, whatever the draft: a draft-04 schema that says
    # "format": "iri" means an IRI, though draft-04's own checker predates that format
    return cls(schema, registry=registry, format_checker=_ALL_FORMATS)


def check_schema(schema: Any) -> type[Any]:
    """Raise :class:`ConstraintError` unless ``schema`` is valid against its draft's meta-schema
    (draft-04 through 2020-12; 2020-12 when ``$schema`` is absent). Returns the validator class.
    """
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("a JSON schema must be an object or a boolean",
                              constraint=_dump(schema))
    cls = _validator_class(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ConstraintError(
            f"malformed JSON schema ({cls.__name__}): {exc.message} at {error_path(exc.path)}",
            constraint=_dump(schema)) from exc
    return cls


def prepare_schema(schema: Any) -> Any:
    """Check a schema and return the form engines compile. The one hook for normalisation.

    Every compile path calls this exactly once per schema; a schema normaliser
    (``structgen.constraints.normalize.normalize(schema) -> schema``) goes here.
    """
    from structgen.constraints.normalize import normalize

    return normalize(checked_schema(schema))


_DRAFT_NUMBERS = {
    jsonschema.Draft3Validator: 3, jsonschema.Draft4Validator: 4, jsonschema.Draft6Validator: 6,
    jsonschema.Draft7Validator: 7, jsonschema.Draft201909Validator: 2019,
}


def checked_schema(schema: Any) -> Any:
    """The compile path's check: the offline rule (no remote ``$ref``) and a fast structural
    meta-schema check (:mod:`structgen.constraints.metacheck`, microseconds where
    jsonschema's takes ~10 ms). Returns ``schema``; raises :class:`ConstraintError`."""
    scan_checked(schema)
    return schema


def scan_checked(schema: Any) -> Any:
    """:func:`checked_schema` returning the walk's :class:`~structgen.constraints.metacheck.Scan`
    (its ``plain`` says normalisation can be skipped)."""
    from structgen.constraints.metacheck import scan_schema

    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("a JSON schema must be an object or a boolean", constraint=_dump(schema))
    cls = _validator_class(schema)
    scan = scan_schema(schema, _DRAFT_NUMBERS.get(cls, 2020))
    if scan.problem is not None:
        message, path = scan.problem
        raise ConstraintError(f"malformed JSON schema ({cls.__name__}): {message} at {error_path(path)}",
                              constraint=_dump(schema))
    for ref in scan.refs:
        if not ref.startswith("#"):
            raise ConstraintError(
                f"$ref {ref!r} points outside the schema; remote references are never fetched "
                "(inline the referenced schema under $defs)", constraint=_dump(schema))
    return scan


def _reject_remote_refs(schema: Any) -> None:
    """Only in-document references (``#...``) can be compiled; nothing is ever fetched."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                raise ConstraintError(
                    f"$ref {ref!r} points outside the schema; remote references are never fetched "
                    "(inline the referenced schema under $defs)", constraint=_dump(schema))
            for key, value in node.items():
                if key not in ("const", "enum", "default", "examples"):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def error_path(path: Any) -> str:
    """A JSON path (``$.a[0].b``) for a jsonschema error's ``path`` deque."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}"
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _dump(schema: Any) -> str:
    try:
        return json.dumps(schema, sort_keys=True)[:300]
    except (TypeError, ValueError):
        return repr(schema)[:300]
