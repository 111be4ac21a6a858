"""Contact card: who someone is and how to reach them (email signatures, business cards)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ContactCard(BaseModel):
    """One person's contact details. Fields the text does not give are null."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=80, description="The person's full name")
    title: str | None = Field(max_length=80, description="Job title, or null")
    organization: str | None = Field(max_length=100, description="Company or institution, or null")
    email: str | None = Field(max_length=100, pattern=r"^[^@\s]+@[^@\s]+\.[a-zA-Z]{2,}$",
                              description="Email address, or null")
    phone: str | None = Field(max_length=30, pattern=r"^\+?[0-9 ()./-]{6,30}$",
                              description="Phone number as written, or null")
    city: str | None = Field(max_length=60, description="City, or null")
