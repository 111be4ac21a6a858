"""Support ticket: triage fields of a customer's support message."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SupportTicket(BaseModel):
    """Triage of one customer message."""

    model_config = ConfigDict(extra="forbid")

    customer_name: str | None = Field(max_length=80, description="Who wrote, or null")
    product: str | None = Field(max_length=80, description="Product or service concerned, or null")
    category: Literal["billing", "bug", "account", "shipping", "feature_request", "other"] = Field(
        description="What the message is about")
    priority: Literal["low", "medium", "high", "urgent"] = Field(
        description="urgent: service down or money lost now; high: blocked; medium: degraded; low: questions")
    sentiment: Literal["negative", "neutral", "positive"] = Field(description="The writer's tone")
    order_id: str | None = Field(max_length=40, description="Order, invoice or account reference, or null")
    summary: str = Field(max_length=200, description="One sentence: the problem and what the customer wants")
