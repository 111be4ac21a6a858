"""Clinical note de-identification: the protected health information (PHI) in a note.

Each PHI span is returned with its HIPAA-style category and its exact text, so a caller
can redact it (replace every occurrence of ``text`` by ``[CATEGORY]``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PhiCategory = Literal["NAME", "DATE", "AGE", "PHONE", "EMAIL", "ADDRESS", "MEDICAL_RECORD_NUMBER",
                      "ID", "ORGANIZATION", "LOCATION"]


class PhiSpan(BaseModel):
    """One piece of protected health information."""

    model_config = ConfigDict(extra="forbid")

    category: PhiCategory = Field(description="Kind of identifier")
    text: str = Field(max_length=60, description="The exact text as it appears in the note")


class ClinicalNoteDeid(BaseModel):
    """All PHI found in one clinical note, in order of appearance."""

    model_config = ConfigDict(extra="forbid")

    phi: list[PhiSpan] = Field(max_length=20, description="Every identifier, in order of appearance")
