"""Finding the schema of an extraction: a bundled name, a JSON Schema file, a pydantic
model (``pkg.module:Model``), a dict or a model class.

:func:`resolve_schema` turns any of those into a :class:`Schema`: the constraint spec the
backends compile (compiled once per tokenizer and cached there, so records that name the
same schema share it), the pydantic model when there is one (typed results), and a digest
of the canonical schema text (part of each record's progress key).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structgen.constraints.spec import JsonSchemaSpec, json_schema_spec
from structgen.errors import ConstraintError, InputError

__all__ = ["Schema", "bundled_names", "resolve_schema"]


@dataclass(frozen=True)
class Schema:
    name: str
    spec: JsonSchemaSpec
    model: Any = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.spec.schema.encode()).hexdigest()[:16]

    @property
    def dict(self) -> Any:
        return self.spec.schema_dict


def bundled_names() -> list[str]:
    from structgen import schemas

    return schemas.names()


_cache: dict[str, Schema] = {}
_lock = threading.Lock()


def resolve_schema(ref: Any, *, base: Path | None = None) -> Schema:
    """A :class:`Schema` from ``ref``: a :class:`Schema`, a pydantic model class, a JSON
    schema dict, or a string -- a bundled name (``invoice``), a ``.json`` file (relative
    to ``base``, default the working directory) or ``pkg.module:Model``.

    Raises :class:`InputError` for a name or file that does not exist and
    :class:`ConstraintError` for something that is not a schema.
    """
    if isinstance(ref, Schema):
        return ref
    if isinstance(ref, (dict, bool)):
        spec = json_schema_spec(ref)
        title = ref.get("title") if isinstance(ref, dict) else None
        return Schema(str(title or "schema"), spec)
    if isinstance(ref, type):
        spec = json_schema_spec(ref)
        return Schema(ref.__name__, spec, model=ref)
    if not isinstance(ref, str) or not ref:
        raise ConstraintError(f"a schema is a name, a .json file, pkg.module:Model, a dict or a model class, "
                              f"not {type(ref).__name__}")
    key = f"{base}|{ref}"
    with _lock:
        hit = _cache.get(key)
    if hit is None:
        hit = _resolve_string(ref, base)
        with _lock:
            if len(_cache) > 1024:
                _cache.clear()
            _cache[key] = hit
    return hit


def _resolve_string(ref: str, base: Path | None) -> Schema:
    from structgen import schemas

    if ref in schemas.BUNDLED:
        model = schemas.model(ref)
        return Schema(ref, json_schema_spec(model), model=model)
    path = Path(ref) if base is None or Path(ref).is_absolute() else base / ref
    if ref.endswith(".json") or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read schema file: {exc.strerror or exc}", source=ref) from exc
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise InputError(f"schema file is not JSON: {exc}", source=ref) from exc
        return Schema(path.stem, json_schema_spec(obj))
    if ":" in ref:
        module_name, _, attr = ref.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise InputError(f"cannot import {module_name!r} for schema {ref!r}: {exc}") from exc
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise InputError(f"module {module_name!r} has no {attr!r} (schema {ref!r})")
        if isinstance(obj, type):
            return Schema(obj.__name__, json_schema_spec(obj), model=obj)
        if isinstance(obj, dict):
            return Schema(attr, json_schema_spec(obj))
        raise ConstraintError(f"{ref!r} is a {type(obj).__name__}, not a pydantic model or a schema dict")
    raise InputError(f"unknown schema {ref!r}: not a bundled name ({', '.join(schemas.names())}), "
                     "not a .json file, not pkg.module:Model")
