"""NDA key terms: the terms a reviewer checks first in a non-disclosure agreement."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class NdaParty(BaseModel):
    """A party to the agreement."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=120, description="Party's name as written")
    role: Literal["disclosing", "receiving", "both"] = Field(description="The party's role; both for mutual NDAs")


class NdaKeyTerms(BaseModel):
    """Key terms of one NDA."""

    model_config = ConfigDict(extra="forbid")

    parties: list[NdaParty] = Field(min_length=2, max_length=6, description="Every party")
    mutual: bool = Field(description="True when both sides disclose and receive")
    effective_date: date | None = Field(description="Effective date (YYYY-MM-DD), or null")
    term_months: int | None = Field(ge=0, le=600, description="How long the agreement runs, in months, or null")
    confidentiality_years: int | None = Field(ge=0, le=100,
                                              description="How long obligations survive, in years, or null")
    governing_law: str | None = Field(max_length=80, description="Jurisdiction whose law governs, or null")
    exclusions: list[Annotated[str, Field(max_length=100)]] = Field(
        max_length=8, description="What is not confidential, short phrases")
