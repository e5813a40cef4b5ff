"""Argument types that normalise what a model sends into one unambiguous form before a tool sees it.

A model writes "12.50", 12.5 or 1250 for the same refund, and "tomorrow 9am"
or a naive timestamp for an instant. A tool that moves money must not guess:
these types refuse every ambiguous form (the model gets TOOL_ARGUMENT_INVALID
and repairs), so the prepared call an approver sees is exactly what runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    StringConstraints,
)

from engine.core.canonical import format_instant

#: The largest integer every JSON reader (JavaScript included) represents exactly.
MAX_SAFE_INTEGER = 2**53 - 1

#: Money as an integer count of the currency's minor unit (cents). Strict: 12.5, 12.0, "1250" and true are refused,
#: because a float cannot hold money exactly and a string invites "12.50" meaning 1250 or 12.
MinorUnits = Annotated[
    int,
    Strict(),
    Field(
        ge=0,
        le=MAX_SAFE_INTEGER,
        description="An amount of money in minor units of its currency (cents): a non-negative integer.",
    ),
]

#: An ISO 4217 code as three uppercase letters ("EUR"); "eur" and "Euro" are refused rather than guessed.
CurrencyCode = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=r"^[A-Z]{3}$"),
    Field(description="An ISO 4217 currency code: three uppercase letters, e.g. EUR."),
]


def _text_or_datetime(value: Any) -> Any:
    # Refuse epoch numbers: a model writing 20260101 means a date, pydantic would read seconds since 1970.
    if isinstance(value, str | datetime):
        return value
    raise ValueError("expected an ISO 8601 timestamp with a time zone, e.g. 2026-01-31T09:00:00+01:00")


def _to_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


#: An instant that carried its own time zone (naive timestamps are refused), normalised to UTC and written in
#: the engine's one textual form of an instant (`2026-01-31T08:00:00.000000Z`), so equal instants digest equally.
UtcTimestamp = Annotated[
    AwareDatetime,
    Field(description="An ISO 8601 timestamp with a time zone offset or Z, e.g. 2026-01-31T09:00:00+01:00."),
    BeforeValidator(_text_or_datetime),
    AfterValidator(_to_utc),
    PlainSerializer(format_instant, return_type=str, when_used="json"),
]


class Money(BaseModel):
    """An amount with its currency: the two travel together so an amount is never read in the wrong unit."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    amount: MinorUnits
    currency: CurrencyCode
