"""Bundled extraction schemas: realistic document types, each as a pydantic model
(``<name>.py``), the same schema as a JSON Schema file (``<name>.json``) and sample inputs
(``samples/<name>.jsonl``: one ``{"id", "text"}`` document per line).

The folder lives at the project's top level and is installed as the package
``structgen.schemas`` (through the link ``structgen/schemas -> ../schemas``), so
``structgen schemas`` and ``--schema invoice`` work from a wheel as from a checkout.
The JSON files are written from the models (``python -m structgen.schemas``) and a test
keeps them identical.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

__all__ = ["BUNDLED", "json_path", "model", "names", "sample_path", "write_json_files"]

HERE = Path(__file__).resolve().parent

#: schema name -> the model's class name in the module of that name
BUNDLED: dict[str, str] = {
    "invoice": "Invoice",
    "receipt": "Receipt",
    "contact_card": "ContactCard",
    "product_listing": "ProductListing",
    "job_posting": "JobPosting",
    "event": "Event",
    "support_ticket": "SupportTicket",
    "nda_key_terms": "NdaKeyTerms",
    "paper_metadata": "PaperMetadata",
    "clinical_note_deid": "ClinicalNoteDeid",
}


def names() -> list[str]:
    return list(BUNDLED)


def model(name: str) -> Any:
    """The pydantic model class of bundled schema ``name`` (KeyError if unknown)."""
    cls_name = BUNDLED[name]
    return getattr(importlib.import_module(f"{__name__}.{name}"), cls_name)


def json_path(name: str) -> Path:
    BUNDLED[name]
    return HERE / f"{name}.json"


def sample_path(name: str) -> Path:
    BUNDLED[name]
    return HERE / "samples" / f"{name}.jsonl"


def schema_text(name: str) -> str:
    """The JSON Schema file's text as :func:`write_json_files` writes it."""
    return json.dumps(model(name).model_json_schema(), indent=2, ensure_ascii=False) + "\n"


def write_json_files() -> None:
    """(Re)write every ``<name>.json`` from its model."""
    for name in BUNDLED:
        json_path(name).write_text(schema_text(name), encoding="utf-8")

