"""Product listing: an online shop or marketplace listing."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class ProductListing(BaseModel):
    """One product offer."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=150, description="Product name as listed")
    brand: str | None = Field(max_length=60, description="Manufacturer or brand, or null")
    price: float | None = Field(ge=0, description="Asking price without currency symbol, or null")
    currency: str | None = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, or null")
    condition: Literal["new", "used", "refurbished"] | None = Field(description="Item condition, or null")
    category: str | None = Field(max_length=60, description="Product category, or null")
    features: list[Annotated[str, Field(max_length=60)]] = Field(
        max_length=10, description="Key features, short phrases")
    in_stock: bool | None = Field(description="Whether it is available now, or null if not said")
