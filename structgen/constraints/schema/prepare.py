"""The one entry point every JSON schema goes through before an engine sees it.

:func:`prepare_schema` parses the schema (JSON text or data), runs the fast meta-schema
check (:mod:`~structgen.constraints.schema.metacheck`), refuses references outside the
document (remote ``$ref`` s are never fetched) and schemas that provably admit no value
(``false``, ``$ref`` cycles no finite value ends: :mod:`~structgen.constraints.schema.satisfiable`).
It returns a :class:`PreparedSchema`: the schema, whether it is *plain* (compiled as
given, no normalisation needed), its size, and its normalised form, computed on first
use only.

The ladder (:mod:`structgen.constraints.ladder`) and the llama.cpp GBNF translation
both start here, and so does the check when a ``gen`` is built (``json_schema_spec``).
Preparing is pure, so a schema given as JSON text is prepared once: the result is kept
in a small LRU keyed by the text, and the compile after the check finds it there.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from structgen.constraints.schema.check import DRAFT_NUMBERS, dump_schema, error_path, validator_class
from structgen.constraints.schema.metacheck import Scan, scan_schema
from structgen.constraints.schema.normalize import Normalized, normalize_schema
from structgen.constraints.schema.satisfiable import unsatisfiable_refs
from structgen.errors import ConstraintError

__all__ = ["PreparedSchema", "prepare_schema"]

#: prepared schemas kept by their JSON text
CACHE_SIZE = 256
_UNSET: Any = object()


class PreparedSchema:
    """A checked schema, ready to compile. Its normalised form is computed once, on demand."""

    def __init__(self, schema: Any, text: str | None, draft: int, scan: Scan):
        #: the parsed schema, or ``None`` until first read when the text was given (a plain
        #: schema goes to the engine as its text: it is never parsed twice)
        self._schema = schema
        #: the schema's JSON text when it came as text (engines parse it faster than a dict)
        self.text = text
        self.draft = draft
        #: only keywords the engine enforces exactly with the validator's meaning: the
        #: schema may be compiled as it is, without normalising
        self.plain = scan.plain and (schema is None or isinstance(schema, dict))
        self.nodes = scan.nodes
        self.widest_optional = scan.widest_optional
        self.enum_values = scan.enum_values
        self._normalized: Normalized | None = None
        self._lock = threading.Lock()

    @property
    def schema(self) -> Any:
        """The schema (parsed from :attr:`text` on first use when it came as text)."""
        if self._schema is None:
            assert self.text is not None
            self._schema = json.loads(self.text)
        return self._schema

    @property
    def normalized(self) -> Normalized:
        """The normalised schema (:func:`~structgen.constraints.schema.normalize.normalize_schema`).

        Raises :class:`ConstraintError` when it shows that the schema admits no value
        (normalisation only widens, so a normalised ``false`` proves it)."""
        with self._lock:
            if self._normalized is None:
                norm = normalize_schema(self.schema)
                if norm.unsatisfiable:
                    raise ConstraintError("the JSON schema admits no value (its keywords contradict each other)",
                                          constraint=dump_schema(self.schema))
                self._normalized = norm
            return self._normalized


def prepare_schema(schema: Any, *, parsed: Any = _UNSET) -> PreparedSchema:
    """Check ``schema`` (JSON text, a dict or a bool) and return it prepared for compiling.

    Raises :class:`ConstraintError` for text that is not JSON, a value that is not a
    schema, a meta-schema violation (with its JSON path), a ``$ref`` outside the document,
    or a schema that provably admits no value. JSON text is prepared once (an LRU keyed
    by the text; a failure is not kept).

    ``parsed``: with text, the value the text was dumped from (``json.dumps(parsed) ==
    schema``), checked in place of parsing the text again; it is only read during the
    call, never kept.
    """
    if isinstance(schema, bytes):
        schema = schema.decode("utf-8", "surrogatepass")
    if not isinstance(schema, str):
        return _prepare(schema, None)
    with _cache_lock:
        hit = _cache.get(schema)
        if hit is not None:
            _cache.move_to_end(schema)
            return hit
    prepared = None if parsed is _UNSET else _prepare_given(parsed, schema)
    if prepared is None:
        try:
            parsed = json.loads(schema)
        except ValueError as exc:
            raise ConstraintError(f"json_schema is not valid JSON: {exc}", constraint=schema[:300]) from exc
        prepared = _prepare(parsed, schema)
    with _cache_lock:
        _cache[schema] = prepared
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return prepared


_cache: OrderedDict[str, PreparedSchema] = OrderedDict()
_cache_lock = threading.Lock()


def _prepare_given(value: Any, text: str) -> PreparedSchema | None:
    """``value`` (what ``text`` was dumped from) prepared without parsing ``text`` first.

    The meta-schema walk reads ``value``: a value JSON text holds otherwise (a tuple, a
    key that is not a string) fails it (``None``: the caller parses the text and checks
    that) or only changes what a ``$ref`` resolves to -- so ``$ref`` s are checked on the
    text's own parse."""
    if not isinstance(value, dict):
        return None
    cls = validator_class(value)
    draft = DRAFT_NUMBERS.get(cls, 2020)
    scan = scan_schema(value, draft)
    if scan.problem is not None:
        return None
    if not scan.refs:
        return PreparedSchema(None, text, draft, scan)  # parsed from the text if ever needed
    schema = json.loads(text)
    _check_refs(schema, draft, scan)
    return PreparedSchema(schema, text, draft, scan)


def _prepare(schema: Any, text: str | None) -> PreparedSchema:
    if not isinstance(schema, (dict, bool)):
        raise ConstraintError("a JSON schema must be an object or a boolean", constraint=dump_schema(schema))
    if schema is False:
        raise ConstraintError("the JSON schema false admits no value", constraint="false")
    cls = validator_class(schema)
    draft = DRAFT_NUMBERS.get(cls, 2020)
    scan = scan_schema(schema, draft)
    if scan.problem is not None:
        message, path = scan.problem
        raise ConstraintError(f"malformed JSON schema ({cls.__name__}): {message} at {error_path(path)}",
                              constraint=dump_schema(schema))
    _check_refs(schema, draft, scan)
    return PreparedSchema(schema, text, draft, scan)


def _check_refs(schema: Any, draft: int, scan: Scan) -> None:
    """Only references inside the document, and no cycle that no finite value ends."""
    for ref in scan.refs:
        if not ref.startswith("#"):
            raise ConstraintError(
                f"$ref {ref!r} points outside the schema; remote references are never fetched "
                "(inline the referenced schema under $defs)", constraint=dump_schema(schema))
    if scan.refs and unsatisfiable_refs(schema, draft):
        raise ConstraintError("the JSON schema admits no value: its $refs form a cycle that no finite "
                              'value ends (like {"$ref": "#"})', constraint=dump_schema(schema))
