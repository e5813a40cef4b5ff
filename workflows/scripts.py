"""Scripted model answers that walk the reference workflows' showcase paths against the seed data.

Each is a scripted-model document (see docs/providers.md): pass it to
`ScriptedModel(...)`, or write it to a file for `--model scripted:PATH`. They
are keyed by state (`by_state`), so one script serves whichever process runs
the task's next turn; a ScriptedModel consumes its turns, so use a fresh one
per task.
"""

from __future__ import annotations

from typing import Any

from engine import scripted_call as call

#: Start `refund` with `REFUND_DAMAGED_ORDER_INPUT` and answer with `refund_damaged_order(version)`. The model
#: looks O-1001 up, finds it eligible, proposes 150.00 EUR (the guard refuses: only 129.99 is refundable), then
#: repairs to 129.99.
REFUND_DAMAGED_ORDER_INPUT: dict[str, Any] = {
    "customer_id": "C-100",
    "message": "My laptop arrived with a cracked screen. I want my money back.",
    "order_id": "O-1001",
}


def refund_damaged_order(version: int = 2) -> dict[str, Any]:
    """The script for refund@`version`: refund@2's proposals state their category (the whole order is refunded)."""
    extra = {"category": "damaged"} if version >= 2 else {}
    proposal = {
        "order_id": "O-1001",
        "currency": "EUR",
        "reason": "Screen cracked in transit.",
        "evidence_ids": ["EV-1", "EV-2"],
        **extra,
    }
    return {
        "profile": "anthropic",
        "model": "scripted-clerk",
        "by_state": {
            "collecting_information": [
                call("query_order", order_id="O-1001"),
                call(
                    "assess_eligibility", order_id="O-1001", finding="Delivered damaged: photo EV-1, courier note EV-2."
                ),
            ],
            "eligible": [
                call("propose_refund", amount=15_000, **proposal),
                call("propose_refund", amount=12_999, **proposal),
            ],
        },
    }


#: Start `ticket_triage` with `TICKET_DOUBLE_CHARGE_INPUT`. The model reads T-5001, answers in prose (not a
#: decision: the forcing ladder feeds NO_ACTION back), then decides ESCALATE: the ticket goes to the human queue.
TICKET_DOUBLE_CHARGE_INPUT: dict[str, Any] = {"ticket_id": "T-5001"}
TICKET_DOUBLE_CHARGE: dict[str, Any] = {
    "profile": "anthropic",
    "model": "scripted-triage",
    "by_state": {
        "reading": [call("query_ticket", ticket_id="T-5001")],
        "deciding": [
            {"text": "The customer was charged twice for order O-1001. Billing should refund the duplicate."},
            call(
                "decide",
                ticket_id="T-5001",
                decision="ESCALATE",
                reason="Duplicate card charge: billing must reverse one of them.",
            ),
        ],
    },
}


#: Start `refund` with `REFUND_WRONG_ITEM_INPUT` and answer with `refund_wrong_item(version)`: O-1002 arrived in
#: the wrong colour; the model refunds its whole remaining balance (25.00 EUR of 45.00, so refund@2 wants a
#: category) at the first try. The demo's crash scenario pays it.
REFUND_WRONG_ITEM_INPUT: dict[str, Any] = {
    "customer_id": "C-100",
    "message": "You sent the blue one, I ordered black. Refund what is left, please.",
    "order_id": "O-1002",
}


def refund_wrong_item(version: int = 2) -> dict[str, Any]:
    extra = {"category": "wrong_item"} if version >= 2 else {}
    return {
        "profile": "anthropic",
        "model": "scripted-clerk",
        "by_state": {
            "collecting_information": [
                call("query_order", order_id="O-1002"),
                call("assess_eligibility", order_id="O-1002", finding="Wrong colour delivered: photo EV-3."),
            ],
            "eligible": [
                call(
                    "propose_refund",
                    order_id="O-1002",
                    amount=2_500,
                    currency="EUR",
                    reason="Wrong item delivered.",
                    evidence_ids=["EV-3"],
                    **extra,
                )
            ],
        },
    }


#: Start `ticket_triage@2` with `TICKET_REFUND_INPUT` and answer with `TICKET_REFUND` (one script for the ticket and
#: the refund task it starts: their states differ). The model reads T-5003 (order O-1003 never arrived) and decides
#: REFUND; the ticket starts a refund@1 task for C-100's order O-1003, whose model proposes 300.00 USD; once a
#: refund approver approved it and it paid, the ticket's model answers the customer from the refund's outcome.
TICKET_REFUND_INPUT: dict[str, Any] = {"ticket_id": "T-5003", "customer_id": "C-100", "order_id": "O-1003"}
TICKET_REFUND: dict[str, Any] = {
    "profile": "anthropic",
    "model": "scripted-triage",
    "by_state": {
        "reading": [call("query_ticket", ticket_id="T-5003")],
        "deciding": [
            call("decide", ticket_id="T-5003", decision="REFUND", reason="The parcel never arrived: refund it."),
        ],
        "collecting_information": [
            call("query_order", order_id="O-1003"),
            call("assess_eligibility", order_id="O-1003", finding="Shipped, never delivered; tracking stalled."),
        ],
        "eligible": [
            call(
                "propose_refund",
                order_id="O-1003",
                amount=30_000,
                currency="USD",
                reason="The parcel never arrived.",
                evidence_ids=[],
            )
        ],
        "answering": [
            call(
                "reply", message="Your parcel never arrived: we refunded 300.00 USD; it reaches your card in 3-5 days."
            ),
        ],
    },
}
