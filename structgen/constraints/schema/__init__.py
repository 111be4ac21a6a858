"""JSON-schema work before an engine compiles a schema, one concept per module.

* :mod:`.prepare` -- :func:`prepare_schema`, the one entry point every schema goes through;
* :mod:`.metacheck` -- the fast structural meta-schema check (and size, plainness);
* :mod:`.check` -- jsonschema's meta-schema check and offline validators (final validation);
* :mod:`.normalize` -- the normaliser's walk, using :mod:`.refs` (local ``$ref`` s),
  :mod:`.merge` (``allOf`` / disjointness), :mod:`.negate` (``not``, ``if``/``then``/``else``),
  :mod:`.keywords` (keyword tables) and :mod:`.instance_types` (type reasoning);
* :mod:`.loosen` -- the wider schemas of the ladder's looser rungs.
"""

from __future__ import annotations

from structgen.constraints.schema.check import check_schema, error_path, schema_validator
from structgen.constraints.schema.normalize import Normalized, normalize, normalize_schema
from structgen.constraints.schema.prepare import PreparedSchema, prepare_schema

__all__ = [
    "Normalized",
    "PreparedSchema",
    "check_schema",
    "error_path",
    "normalize",
    "normalize_schema",
    "prepare_schema",
    "schema_validator",
]
