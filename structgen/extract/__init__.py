"""Batch JSON extraction: documents in, one validated record (or a typed error) out per
document, resumable, with progress, per-field confidence, and Ray Data past one machine.

``structgen.extract(inputs, schema=...)`` is the Python entry point (it yields
:class:`ExtractResult` objects): this package is callable, so ``structgen.extract`` is
both the package (``structgen.extract.read_records``...) and the function
(``structgen.extract.extract``, the same thing with its signature for type checkers).
``structgen extract`` is the command line (:mod:`structgen.cli`). Nothing here imports
torch or an engine until a backend is made.
"""

import sys
import types
from typing import Any

from structgen.extract.api import JobOptions, extract, make_backend, run_job
from structgen.extract.extractor import ExtractConfig, Extractor
from structgen.extract.inputs import Fields, read_records
from structgen.extract.records import ExtractResult, InputRecord, RecordError, Usage
from structgen.extract.schemas import Schema, bundled_names, resolve_schema

__all__ = [
    "ExtractConfig",
    "ExtractResult",
    "Extractor",
    "Fields",
    "InputRecord",
    "JobOptions",
    "RecordError",
    "Schema",
    "Usage",
    "bundled_names",
    "extract",
    "make_backend",
    "read_records",
    "resolve_schema",
    "run_job",
]


class _CallableModule(types.ModuleType):
    """``structgen.extract(...)`` calls :func:`extract`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return extract(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
