"""The fake systems' own tables, in the engine's database but outside Railyard's schema.

They live in a `MetaData` of their own and every name starts with `fake_`, so
Alembic (which builds only `engine.store.schema.metadata`) never creates,
drops or compares them: the fakes create them on first use, the way an
external system would own its own tables.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, Text

metadata = MetaData()

customers = Table(
    "fake_customers",
    metadata,
    Column("customer_id", String(32), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("tier", String(16), nullable=False),
)

#: An order's refundable balance is `total - refunded`; the payments fake moves `refunded` when it pays.
orders = Table(
    "fake_orders",
    metadata,
    Column("order_id", String(32), primary_key=True),
    Column("customer_id", String(32), nullable=False),
    Column("currency", String(3), nullable=False),
    Column("total", Integer, nullable=False),
    Column("refunded", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=False),
)

evidence = Table(
    "fake_evidence",
    metadata,
    Column("evidence_id", String(32), primary_key=True),
    Column("order_id", String(32), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("note", String(300), nullable=False),
)

#: The payment provider's books: one row per idempotency key that moved money.
refunds = Table(
    "fake_refunds",
    metadata,
    Column("idempotency_key", String(64), primary_key=True),
    Column("refund_id", String(32), nullable=False, unique=True),
    Column("order_id", String(32), nullable=False),
    Column("amount", Integer, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("reason", String(300), nullable=False),
    Column("category", String(32), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

#: Every refund request the provider received, and what it did with it: what exactly-once is checked against.
payment_requests = Table(
    "fake_payment_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(64), nullable=False, index=True),
    Column("order_id", String(32), nullable=False),
    Column("amount", Integer, nullable=False),
    Column("balance_before", Integer, nullable=True),
    #: executed | replayed | declined | fault
    Column("result", String(16), nullable=False),
    Column("detail", String(64), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
)

#: Tickets hold personal data (phone, national id) and internal notes that a triage model must never see.
tickets = Table(
    "fake_tickets",
    metadata,
    Column("ticket_id", String(32), primary_key=True),
    Column("customer_id", String(32), nullable=False),
    Column("subject", String(200), nullable=False),
    Column("body", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("priority", String(16), nullable=False),
    Column("product", String(64), nullable=False),
    Column("opened_at", DateTime(timezone=True), nullable=False),
    Column("phone", String(32), nullable=False),
    Column("national_id", String(32), nullable=False),
    Column("internal_notes", Text, nullable=False),
)

#: Failures armed on demand (by a test or the demo), consumed one call at a time, visible to every process.
faults = Table(
    "fake_faults",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("operation", String(64), nullable=False),
    Column("fault", String(32), nullable=False),
    Column("remaining", Integer, nullable=False),
)

#: Child tables first: the order in which `reset` empties them.
ALL = (payment_requests, refunds, evidence, orders, customers, tickets, faults)
