"""The data every fresh database of fakes starts with: fixed ids, so scripts, tests and the demo can name them.

Customer C-100 has three orders: one untouched with evidence, one partly
refunded already (its refundable balance is below its total) and one in USD.
C-200 owns O-2001, so a refund of it for C-100 is another customer's order.
Ticket T-5001 carries a phone number, a national id and internal notes: the
triage tool must never hand them to a model.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert

from workflows.fakes.schema import customers, evidence, orders, tickets

CUSTOMERS: list[dict[str, Any]] = [
    {"customer_id": "C-100", "name": "Ada Byron", "tier": "gold"},
    {"customer_id": "C-200", "name": "Brook Taylor", "tier": "standard"},
]

ORDERS: list[dict[str, Any]] = [
    {
        "order_id": "O-1001",
        "customer_id": "C-100",
        "currency": "EUR",
        "total": 12_999,
        "refunded": 0,
        "status": "delivered",
        "placed_at": datetime(2026, 10, 2, 9, 30, tzinfo=UTC),
    },
    {
        "order_id": "O-1002",
        "customer_id": "C-100",
        "currency": "EUR",
        "total": 4_500,
        "refunded": 2_000,
        "status": "delivered",
        "placed_at": datetime(2026, 9, 14, 16, 5, tzinfo=UTC),
    },
    {
        "order_id": "O-1003",
        "customer_id": "C-100",
        "currency": "USD",
        "total": 30_000,
        "refunded": 0,
        "status": "shipped",
        "placed_at": datetime(2026, 11, 20, 11, 0, tzinfo=UTC),
    },
    {
        "order_id": "O-2001",
        "customer_id": "C-200",
        "currency": "GBP",
        "total": 8_000,
        "refunded": 0,
        "status": "delivered",
        "placed_at": datetime(2026, 11, 1, 8, 45, tzinfo=UTC),
    },
]

EVIDENCE: list[dict[str, Any]] = [
    {"evidence_id": "EV-1", "order_id": "O-1001", "kind": "photo", "note": "Crushed box, cracked screen."},
    {"evidence_id": "EV-2", "order_id": "O-1001", "kind": "courier_note", "note": "Delivered damaged, signed."},
    {"evidence_id": "EV-3", "order_id": "O-1002", "kind": "photo", "note": "Wrong colour received."},
    {"evidence_id": "EV-4", "order_id": "O-2001", "kind": "photo", "note": "Torn packaging."},
]

TICKETS: list[dict[str, Any]] = [
    {
        "ticket_id": "T-5001",
        "customer_id": "C-100",
        "subject": "Charged twice for one order",
        "body": "My card statement shows two charges of 129.99 EUR for order O-1001. Please fix this.",
        "status": "open",
        "priority": "high",
        "product": "checkout",
        "opened_at": datetime(2026, 11, 28, 8, 12, tzinfo=UTC),
        "phone": "+44 20 7946 0958",
        "national_id": "QQ123456C",
        "internal_notes": "Chargeback filed in 2025; handle with care.",
    },
    {
        "ticket_id": "T-5002",
        "customer_id": "C-200",
        "subject": "Where do I change my delivery address?",
        "body": "I moved last week. Where can I update the address for future orders?",
        "status": "open",
        "priority": "low",
        "product": "account",
        "opened_at": datetime(2026, 11, 27, 19, 40, tzinfo=UTC),
        "phone": "+44 161 496 0000",
        "national_id": "AB987654D",
        "internal_notes": "Asked the same question in October.",
    },
    {
        "ticket_id": "T-5003",
        "customer_id": "C-100",
        "subject": "Parcel not arrived",
        "body": "Order O-1003 was due three days ago and tracking has not moved.",
        "status": "open",
        "priority": "normal",
        "product": "delivery",
        "opened_at": datetime(2026, 11, 29, 7, 3, tzinfo=UTC),
        "phone": "+44 20 7946 0123",
        "national_id": "QQ123456C",
        "internal_notes": "Courier depot flagged a backlog.",
    },
]


def seed(conn: Connection) -> None:
    """Insert the seed rows; the caller's transaction decides whether they land."""
    for table, rows in ((customers, CUSTOMERS), (orders, ORDERS), (evidence, EVIDENCE), (tickets, TICKETS)):
        conn.execute(insert(table), rows)
