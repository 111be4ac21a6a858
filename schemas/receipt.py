"""Receipt: a point-of-sale receipt (shop, restaurant, fuel station)."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ReceiptItem(BaseModel):
    """One purchased item."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=60, description="Item as printed")
    price: float = Field(description="Price paid for the item (all units)")


class Receipt(BaseModel):
    """A till receipt. Amounts are plain numbers in the receipt's currency."""

    model_config = ConfigDict(extra="forbid")

    merchant: str = Field(max_length=100, description="Shop or restaurant name")
    purchase_date: date | None = Field(description="Date of purchase (YYYY-MM-DD), or null")
    items: list[ReceiptItem] = Field(max_length=25, description="Purchased items, in order")
    total: float = Field(description="Total paid")
    currency: str | None = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, or null if not shown")
    payment_method: Literal["cash", "card", "mobile", "other"] | None = Field(
        description="How it was paid, or null if not shown")
