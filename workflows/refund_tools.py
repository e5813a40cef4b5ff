"""The tools of the refund workflows: reading an order, and paying a refund through the payment provider.

The adapters turn the fakes' answers into what the engine understands: a
clear refusal from the remote is `ToolFailed` (nothing happened, the model or
a human may try again); anything else a write raises stays uncertain, and the
engine records it as `unknown`. The refund carries the action id as its
idempotency key, and `lookup_refund` answers what became of an action id, so
a worker that died mid-call settles it by asking, never by paying again.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from engine import (
    SETTLE_MARGIN_SECONDS,
    CurrencyCode,
    MinorUnits,
    Reconciled,
    ToolCatalog,
    ToolDef,
    ToolFailed,
    ToolInvocation,
    ToolKind,
)
from workflows import fakes

ORDER_ID = r"^O-\d{4}$"
EVIDENCE_ID = r"^EV-\d{1,6}$"
#: Seconds the engine waits for the payment provider; a stranded refund is reconciled this long (plus the
#: engine's margin) after its intent was recorded.
PAYMENTS_TIMEOUT = 2.0
SETTLE_SECONDS = PAYMENTS_TIMEOUT + SETTLE_MARGIN_SECONDS
READ_TIMEOUT = 2.0

EvidenceId = Annotated[str, StringConstraints(pattern=EVIDENCE_ID)]


class OrderQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(pattern=ORDER_ID, description="The order to look up, e.g. O-1001.")


class OrderSnapshot(BaseModel):
    """What the model may know of an order: no payment details, no address."""

    order_id: str
    customer_id: str
    currency: str
    total: int = Field(description="The order total in minor units.")
    refunded: int = Field(description="Refunded so far, in minor units.")
    refundable: int = Field(description="What may still be refunded, in minor units.")
    status: str
    evidence_ids: list[str]


class RefundRequest(BaseModel):
    """`propose_refund`'s arguments, and exactly what `payments_refund` is prepared with."""

    model_config = ConfigDict(extra="forbid")
    order_id: str = Field(pattern=ORDER_ID)
    amount: MinorUnits = Field(description="The refund in minor units of the order's currency (1299 = 12.99).")
    currency: CurrencyCode
    reason: str = Field(min_length=1, max_length=300, description="Why, in a sentence the customer could read.")
    evidence_ids: list[EvidenceId] = Field(
        default_factory=list, max_length=10, description="Ids of the order's evidence that support the refund."
    )


class Category(StrEnum):
    DAMAGED = "damaged"
    NOT_DELIVERED = "not_delivered"
    WRONG_ITEM = "wrong_item"
    GOODWILL = "goodwill"


class CategorisedRefundRequest(RefundRequest):
    """refund@2: the same request with a reason category, which large refunds must state."""

    category: Category | None = Field(default=None, description="damaged, not_delivered, wrong_item or goodwill.")


class RefundReceipt(BaseModel):
    refund_id: str
    order_id: str
    amount: int
    currency: str


def _declined(refusal: fakes.Declined) -> ToolFailed:
    return ToolFailed(refusal.message)


def query_order(call: ToolInvocation) -> OrderSnapshot:
    query = call.parse(OrderQuery)
    try:
        order = fakes.systems().orders.get(query.order_id, timeout=call.timeout)
    except fakes.Declined as refusal:
        raise _declined(refusal) from None
    return OrderSnapshot(
        order_id=order.order_id,
        customer_id=order.customer_id,
        currency=order.currency,
        total=order.total,
        refunded=order.refunded,
        refundable=order.refundable,
        status=order.status,
        evidence_ids=list(order.evidence_ids),
    )


def refund(call: ToolInvocation) -> RefundReceipt:
    # Both versions' requests read as the wider model: refund@1's simply have no category.
    request = call.parse(CategorisedRefundRequest)
    try:
        paid = fakes.systems().payments.refund(
            call.idempotency_key,
            order_id=request.order_id,
            amount=request.amount,
            currency=request.currency,
            reason=request.reason,
            category=request.category.value if request.category else None,
            timeout=call.timeout,
        )
    except fakes.Declined as refusal:
        raise _declined(refusal) from None
    return RefundReceipt(refund_id=paid.refund_id, order_id=paid.order_id, amount=paid.amount, currency=paid.currency)


def lookup_refund(action_id: str) -> Reconciled:
    """What became of the refund requested under `action_id`: paid (with its receipt), or never made."""
    paid = fakes.systems().payments.lookup(action_id, timeout=PAYMENTS_TIMEOUT)
    if paid is None:
        return Reconciled.not_found()
    return Reconciled.succeeded(
        RefundReceipt(refund_id=paid.refund_id, order_id=paid.order_id, amount=paid.amount, currency=paid.currency)
    )


QUERY_ORDER = ToolDef(
    "query_order",
    OrderQuery,
    OrderSnapshot,
    ToolKind.READ,
    query_order,
    timeout=READ_TIMEOUT,
    description="Look an order up: its customer, currency, total, refundable balance and evidence ids.",
)


def _payments_refund(args: type[RefundRequest]) -> ToolDef:
    return ToolDef(
        "payments_refund",
        args,
        RefundReceipt,
        ToolKind.WRITE,
        refund,
        timeout=PAYMENTS_TIMEOUT,
        idempotent_remote=True,
        reconcile=lookup_refund,
        description="Refund part or all of an order through the payment provider, idempotent by action id.",
    )


REFUND_TOOLS_V1 = ToolCatalog("refund-tools", 1, [QUERY_ORDER, _payments_refund(RefundRequest)])
REFUND_TOOLS_V2 = ToolCatalog("refund-tools", 2, [QUERY_ORDER, _payments_refund(CategorisedRefundRequest)])
