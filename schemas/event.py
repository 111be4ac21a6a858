"""Event: a conference, concert, meetup or other dated happening."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field


class Event(BaseModel):
    """One event. Times are 24-hour HH:MM local time."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=120, description="The event's name")
    start_date: date = Field(description="First day (YYYY-MM-DD)")
    end_date: date | None = Field(description="Last day (YYYY-MM-DD), or null for one-day events")
    start_time: str | None = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="Start time HH:MM, or null")
    venue: str | None = Field(max_length=120, description="Venue name, or null")
    city: str | None = Field(max_length=60, description="City, or null")
    organizer: str | None = Field(max_length=100, description="Who organises it, or null")
    price: float | None = Field(ge=0, description="Ticket price (0 if free), or null if not said")
    url: str | None = Field(max_length=200, description="Registration or info link, or null")
