"""Scientific paper metadata: the bibliographic record of a paper from its first page."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Author(BaseModel):
    """One author, in byline order."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=80, description="Full name as printed")
    affiliation: str | None = Field(max_length=150, description="First listed affiliation, or null")


class PaperMetadata(BaseModel):
    """Bibliographic metadata of one paper."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=250, description="Full title")
    authors: list[Author] = Field(min_length=1, max_length=20, description="Authors in order")
    year: int | None = Field(ge=1600, le=2100, description="Publication year, or null")
    venue: str | None = Field(max_length=150, description="Journal or conference, or null")
    doi: str | None = Field(pattern=r"^10\.[0-9]{4,9}/[^\s]{1,100}$", description="DOI without URL prefix, or null")
    keywords: list[Annotated[str, Field(max_length=40)]] = Field(
        max_length=10, description="Keywords as listed, or main topics")
