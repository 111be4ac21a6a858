"""Invoice: the header, both parties, line items and totals of a commercial invoice."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field


class Party(BaseModel):
    """A company or person on the invoice."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=120, description="Legal or trading name as printed")
    address: str | None = Field(max_length=200, description="Postal address on one line, or null")


class LineItem(BaseModel):
    """One billed line."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(max_length=100, description="What was sold, as written")
    quantity: float = Field(ge=0, description="Units billed")
    unit_price: float = Field(description="Price per unit, without currency symbol")
    amount: float = Field(description="Line total (quantity x unit price), without currency symbol")


class Invoice(BaseModel):
    """A commercial invoice. Amounts are plain numbers; the currency is an ISO 4217 code."""

    model_config = ConfigDict(extra="forbid")

    invoice_number: str = Field(max_length=40, description="The invoice's number or reference")
    issue_date: date = Field(description="Date the invoice was issued (YYYY-MM-DD)")
    due_date: date | None = Field(description="Payment due date (YYYY-MM-DD), or null")
    vendor: Party = Field(description="Who issued the invoice")
    customer: Party = Field(description="Who is billed")
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code, e.g. EUR, USD")
    line_items: list[LineItem] = Field(max_length=20, description="Billed lines, in order")
    subtotal: float | None = Field(description="Sum before tax, or null")
    tax: float | None = Field(description="Tax amount, or null")
    total: float = Field(description="Amount due")
