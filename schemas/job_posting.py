"""Job posting: a vacancy announcement."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class JobPosting(BaseModel):
    """One open position. Salaries are yearly amounts as plain numbers."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=100, description="Position title")
    company: str = Field(max_length=100, description="Hiring company")
    location: str | None = Field(max_length=100, description="City / country, or null")
    workplace: Literal["onsite", "hybrid", "remote"] | None = Field(description="Where the work happens, or null")
    employment_type: Literal["full_time", "part_time", "contract", "internship"] | None = Field(
        description="Kind of contract, or null")
    salary_min: float | None = Field(ge=0, description="Lower end of the yearly salary, or null")
    salary_max: float | None = Field(ge=0, description="Upper end of the yearly salary, or null")
    currency: str | None = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code of the salary, or null")
    skills: list[Annotated[str, Field(max_length=40)]] = Field(
        max_length=15, description="Required skills or technologies")
    experience_years: int | None = Field(ge=0, le=50, description="Minimum years of experience, or null")
