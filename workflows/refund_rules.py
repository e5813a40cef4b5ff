"""The domain guards of the refund workflows: pure checks of a proposal against what the task knows.

A guard reads the newest `query_order` result the task recorded (the order as
the model saw it) and the customer the task was started for (its trusted
input), never the model's word. Each refusal names what is wrong in terms the
model can act on, because it is fed back as DOMAIN_INVALID and the model
repairs its proposal. The payment provider checks the balance again when it
pays: a snapshot can be overtaken by another refund of the same order.
"""

from __future__ import annotations

from typing import Any

from engine import GuardContext
from workflows.refund_tools import CategorisedRefundRequest, Category, RefundRequest

#: refund@2: a refund above this share of the order total must name a category other than goodwill.
LARGE_SHARE = 0.5


def _order_id(ctx: GuardContext) -> str:
    return str(getattr(ctx.args, "order_id", ""))


def _snapshot(ctx: GuardContext) -> dict[str, Any] | None:
    """The looked-up order the proposal is about, or None if the task never looked that order up."""
    order = ctx.task.facts.get("tool:query_order")
    return order if isinstance(order, dict) and order.get("order_id") == _order_id(ctx) else None


def _request(ctx: GuardContext) -> RefundRequest:
    assert isinstance(ctx.args, RefundRequest)
    return ctx.args


def order_was_looked_up(ctx: GuardContext) -> str | None:
    if _snapshot(ctx) is None:
        return f"order {_order_id(ctx)} was not looked up: use query_order on it first"
    return None


def order_belongs_to_customer(ctx: GuardContext) -> str | None:
    order = _snapshot(ctx)
    if order is not None and order["customer_id"] != ctx.task.input["customer_id"]:
        return f"order {order['order_id']} belongs to another customer"
    return None


def amount_is_positive(ctx: GuardContext) -> str | None:
    if _request(ctx).amount < 1:
        return "the amount must be at least 1 minor unit"
    return None


def within_refundable_balance(ctx: GuardContext) -> str | None:
    order, amount = _snapshot(ctx), _request(ctx).amount
    if order is not None and amount > order["refundable"]:
        return (
            f"amount {amount} exceeds the refundable balance of order {order['order_id']}: "
            f"{order['refundable']} {order['currency']} (minor units)"
        )
    return None


def currency_matches(ctx: GuardContext) -> str | None:
    order, currency = _snapshot(ctx), _request(ctx).currency
    if order is not None and currency != order["currency"]:
        return f"order {order['order_id']} was paid in {order['currency']}, not {currency}"
    return None


def evidence_exists(ctx: GuardContext) -> str | None:
    order = _snapshot(ctx)
    if order is None:
        return None
    unknown = [e for e in _request(ctx).evidence_ids if e not in order["evidence_ids"]]
    if unknown:
        return f"no evidence {', '.join(unknown)} on order {order['order_id']}; it has {order['evidence_ids']}"
    return None


def large_refunds_name_a_category(ctx: GuardContext) -> str | None:
    """refund@2's partial-refund rule: more than half of an order back needs a reason category, not goodwill."""
    order, request = _snapshot(ctx), ctx.args
    assert isinstance(request, CategorisedRefundRequest)
    if order is None or request.amount <= order["total"] * LARGE_SHARE:
        return None
    if request.category is None or request.category is Category.GOODWILL:
        return (
            f"a refund above {LARGE_SHARE:.0%} of the order total ({order['total']}) needs a category: "
            "damaged, not_delivered or wrong_item"
        )
    return None


def no_payment_attempted(ctx: GuardContext) -> str | None:
    """Reopening starts a new proposal; after a payment attempt its outcome is for a human to settle first."""
    if "tool:payments_refund" in ctx.task.facts or "tool_error:payments_refund" in ctx.task.facts:
        return "a refund was already attempted on this task: settle it with the payment provider and close it"
    return None


#: Every guard of propose_refund in refund@1, in the order their reasons are reported.
PROPOSAL_GUARDS = (
    order_was_looked_up,
    order_belongs_to_customer,
    amount_is_positive,
    within_refundable_balance,
    currency_matches,
    evidence_exists,
)
ASSESSMENT_GUARDS = (order_was_looked_up, order_belongs_to_customer)
