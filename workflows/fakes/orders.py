"""The fake order system: orders with their refundable balance and the evidence attached to them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select

from engine.core.canonical import utc
from workflows.fakes.backend import Backend
from workflows.fakes.errors import NotFound
from workflows.fakes.faults import strike_after, strike_before, take
from workflows.fakes.schema import evidence, orders


@dataclass(frozen=True)
class Order:
    order_id: str
    customer_id: str
    currency: str
    total: int
    refunded: int
    status: str
    placed_at: datetime
    evidence_ids: tuple[str, ...]

    @property
    def refundable(self) -> int:
        """What may still be refunded, in minor units: the total less what the payments system paid back."""
        return self.total - self.refunded


class Orders:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def get(self, order_id: str, *, timeout: float = 10.0) -> Order:
        """The order as it stands now (refunds paid so far included), or `NotFound`."""
        fault = take(self.backend, "orders.get")
        strike_before(fault, timeout)
        with self.backend.read() as conn:
            row = conn.execute(select(orders).where(orders.c.order_id == order_id)).first()
            proofs = (
                conn.execute(
                    select(evidence.c.evidence_id)
                    .where(evidence.c.order_id == order_id)
                    .order_by(evidence.c.evidence_id)
                )
                .scalars()
                .all()
            )
        if row is None:
            raise NotFound(f"order {order_id}")
        strike_after(fault)
        return Order(
            row.order_id,
            row.customer_id,
            row.currency,
            row.total,
            row.refunded,
            row.status,
            utc(row.placed_at),
            tuple(proofs),
        )

    def add_evidence(self, evidence_id: str, order_id: str, kind: str, note: str) -> None:
        """What a customer portal does when the customer uploads a photo or a document."""
        with self.backend.write() as conn:
            conn.execute(insert(evidence).values(evidence_id=evidence_id, order_id=order_id, kind=kind, note=note))
