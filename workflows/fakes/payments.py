"""The fake payment provider: refunds deduplicated by idempotency key, and books that prove exactly-once.

Like a real provider it refuses what it must (an unknown order, another
currency, more than the order's refundable balance) and answers a repeated
idempotency key with the refund it already made instead of paying again.
Every request it receives is written down with what it did, in the same
transaction as its effect, so `executions` (money moved, per key) and
`requests` are what tests check "exactly once" against; `lookup` is what a
worker asks when it does not know whether its request was carried out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from engine.core.canonical import now, utc
from workflows.fakes.backend import Backend
from workflows.fakes.errors import Declined
from workflows.fakes.faults import hold, strike_after, strike_before, take
from workflows.fakes.schema import orders, payment_requests, refunds


@dataclass(frozen=True)
class Refund:
    refund_id: str
    idempotency_key: str
    order_id: str
    amount: int
    currency: str
    category: str | None
    created_at: datetime
    #: True when the key had already been paid and this answer is that earlier refund.
    replayed: bool = False


class Payments:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def refund(
        self,
        idempotency_key: str,
        *,
        order_id: str,
        amount: int,
        currency: str,
        reason: str,
        category: str | None = None,
        timeout: float = 10.0,
    ) -> Refund:
        """Pay `amount` back on `order_id` once per `idempotency_key`; `Declined` if the provider refuses."""
        fault = take(self.backend, "payments.refund")
        if fault == "remote_error":
            self._record_only(idempotency_key, order_id, amount, "declined", "remote_error")
        strike_before(fault, timeout)
        if fault == "hold_before":
            hold(self.backend, "payments.refund", timeout)
        declined: Declined | None = None
        result: Refund | None = None
        with self.backend.write() as conn:
            order = conn.execute(select(orders).where(orders.c.order_id == order_id).with_for_update()).first()
            existing = conn.execute(select(refunds).where(refunds.c.idempotency_key == idempotency_key)).first()
            balance = order.total - order.refunded if order is not None else None
            if existing is not None:
                if (existing.order_id, existing.amount, existing.currency) != (order_id, amount, currency):
                    declined = Declined("key_reused", "idempotency key reused with other parameters")
                else:
                    _record(conn, idempotency_key, order_id, amount, balance, "replayed", "same key")
                    result = _refund(existing, replayed=True)
            elif order is None:
                declined = Declined("no_order", f"no order {order_id}")
            elif currency != order.currency:
                declined = Declined("currency", f"order {order_id} was paid in {order.currency}")
            elif amount < 1:
                declined = Declined("amount", "a refund must be at least 1 minor unit")
            elif balance is not None and amount > balance:
                declined = Declined("over_balance", f"only {balance} of order {order_id} is refundable")
            else:
                result = _pay(conn, idempotency_key, order_id, amount, currency, reason, category, balance)
            if declined is not None:
                _record(conn, idempotency_key, order_id, amount, balance, "declined", declined.code)
        if declined is not None:
            raise declined
        assert result is not None
        if fault == "hold_after":
            hold(self.backend, "payments.refund", timeout)
        strike_after(fault)
        return result

    def lookup(self, idempotency_key: str, *, timeout: float = 10.0) -> Refund | None:
        """The refund made under `idempotency_key`, or None if none was (reconciliation asks this)."""
        fault = take(self.backend, "payments.lookup")
        strike_before(fault, timeout)
        with self.backend.read() as conn:
            row = conn.execute(select(refunds).where(refunds.c.idempotency_key == idempotency_key)).first()
        strike_after(fault)
        return _refund(row) if row is not None else None

    # -- the books, for tests and the demo ---------------------------------------------------------------
    def executions(self) -> dict[str, int]:
        """How many times money moved for each idempotency key (exactly-once means every value is 1)."""
        with self.backend.read() as conn:
            rows = conn.execute(
                select(payment_requests.c.idempotency_key, func.count())
                .where(payment_requests.c.result == "executed")
                .group_by(payment_requests.c.idempotency_key)
            ).all()
        return {key: int(n) for key, n in rows}

    def requests(self, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        """Every request the provider received (optionally for one key), oldest first, with what it did."""
        query = select(payment_requests).order_by(payment_requests.c.id)
        if idempotency_key is not None:
            query = query.where(payment_requests.c.idempotency_key == idempotency_key)
        with self.backend.read() as conn:
            return [dict(row._asdict()) for row in conn.execute(query)]

    def refunds(self) -> list[Refund]:
        with self.backend.read() as conn:
            return [_refund(row) for row in conn.execute(select(refunds).order_by(refunds.c.created_at))]

    def _record_only(self, key: str, order_id: str, amount: int, result: str, detail: str) -> None:
        with self.backend.write() as conn:
            _record(conn, key, order_id, amount, None, result, detail)


def _pay(
    conn: Connection,
    key: str,
    order_id: str,
    amount: int,
    currency: str,
    reason: str,
    category: str | None,
    balance: int | None,
) -> Refund:
    at = now()
    refund_id = f"re_{key[:12]}"
    conn.execute(update(orders).where(orders.c.order_id == order_id).values(refunded=orders.c.refunded + amount))
    conn.execute(
        insert(refunds).values(
            idempotency_key=key,
            refund_id=refund_id,
            order_id=order_id,
            amount=amount,
            currency=currency,
            reason=reason[:300],
            category=category,
            created_at=at,
        )
    )
    _record(conn, key, order_id, amount, balance, "executed", "paid")
    return Refund(refund_id, key, order_id, amount, currency, category, at)


def _record(
    conn: Connection, key: str, order_id: str, amount: int, balance: int | None, result: str, detail: str
) -> None:
    conn.execute(
        insert(payment_requests).values(
            idempotency_key=key,
            order_id=order_id,
            amount=amount,
            balance_before=balance,
            result=result,
            detail=detail,
            at=now(),
        )
    )


def _refund(row: Any, *, replayed: bool = False) -> Refund:
    return Refund(
        row.refund_id,
        row.idempotency_key,
        row.order_id,
        row.amount,
        row.currency,
        row.category,
        utc(row.created_at),
        replayed,
    )
