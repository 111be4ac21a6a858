"""JSON-schema checking against the draft's meta-schema, and offline validators.

:func:`check_schema` is jsonschema's full meta-schema check (what final validation
uses); the compile path uses the faster structural check in
:mod:`~structgen.constraints.schema.metacheck` through
:func:`~structgen.constraints.schema.prepare.prepare_schema`. Remote ``$ref`` s are never
fetched: the ``referencing`` registry has no retriever, so an unknown URI is an error,
not a request.
"""

from __future__ import annotations

import json
from typing import Any

from structgen.constraints.schema.lazy_iri import install as _defer_iri_parsers

_defer_iri_parsers()  # before jsonschema: its IRI checkers' parsers are built on first use

import jsonschema  # noqa: E402
import jsonschema.exceptions  # noqa: E402
import jsonschema.validators  # noqa: E402
import referencing  # noqa: E402
import referencing.exceptions  # noqa: E402
import referencing.jsonschema  # noqa: E402

from structgen.errors import ConstraintError  # noqa: E402

__all__ = ["DRAFT_NUMBERS", "check_schema", "dump_schema", "error_path", "schema_validator", "validator_class"]


def _no_retrieval(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def validator_class(schema: Any) -> type[Any]:
    """The jsonschema validator class for the schema's ``$schema`` draft (default 2020-12).

    An unknown ``$schema`` URI falls back to 2020-12 (jsonschema would only warn).
    """
    uri = schema.get("$schema", "") if isinstance(schema, dict) else ""
    if not isinstance(uri, str):
        raise ConstraintError("$schema must be a string", constraint=dump_schema(schema))
    cls = _validator_classes.get(uri)
    if cls is None:  # jsonschema's lookup is pure but not cheap: once per URI
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        if len(_validator_classes) < 256:
            _validator_classes[uri] = cls
    return cls


#: ``$schema`` URI ("" when absent) -> validator class
_validator_classes: dict[str, type[Any]] = {}


#: validator class -> draft number (2020 for 2020-12 and anything newer)
DRAFT_NUMBERS = {
    jsonschema.Draft3Validator: 3, jsonschema.Draft4Validator: 4, jsonschema.Draft6Validator: 6,
    jsonschema.Draft7Validator: 7, jsonschema.Draft201909Validator: 2019,
}

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
                              constraint=dump_schema(schema))
    cls = validator_class(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        raise ConstraintError(
            f"malformed JSON schema ({cls.__name__}): {exc.message} at {error_path(exc.path)}",
            constraint=dump_schema(schema)) from exc
    return cls


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


def dump_schema(schema: Any) -> str:
    """The start of ``schema`` as JSON, for error messages."""
    try:
        return json.dumps(schema, sort_keys=True)[:300]
    except (TypeError, ValueError):
        return repr(schema)[:300]
