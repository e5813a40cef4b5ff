"""Fakes of the systems the reference workflows call: orders, payments, tickets.

They keep their data in tables of their own (`fake_*`) in the database the
engine uses, seeded with fixed customers, orders, evidence and tickets
(`workflows.fakes.seed`), and fail on demand (`Systems.arm`), so tests and the
demo walk the real failure paths: timeouts, refusals, replies lost after the
remote acted, a worker killed mid-call.

    from workflows import fakes
    fakes.bind(url)                       # the engine's database (default: RAILYARD_DATABASE_URL)
    books = fakes.systems()
    books.arm("payments.refund", "lost_reply")
    ...
    assert books.payments.executions() == {action_id: 1}
"""

from __future__ import annotations

from dataclasses import dataclass

from workflows.fakes.backend import Backend, backend, bind, close
from workflows.fakes.errors import Declined, NotFound
from workflows.fakes.faults import FAULTS, OPERATIONS, Fault, arm, held, release
from workflows.fakes.orders import Order, Orders
from workflows.fakes.payments import Payments, Refund
from workflows.fakes.tickets import Ticket, Tickets


@dataclass(frozen=True)
class Systems:
    """The three fake systems on one database."""

    backend: Backend

    @property
    def orders(self) -> Orders:
        return Orders(self.backend)

    @property
    def payments(self) -> Payments:
        return Payments(self.backend)

    @property
    def tickets(self) -> Tickets:
        return Tickets(self.backend)

    def arm(self, operation: str, fault: Fault, times: int = 1) -> None:
        """The next `times` calls of `operation` (see `OPERATIONS`) suffer `fault` (see `FAULTS`)."""
        arm(self.backend, operation, fault, times)

    def held(self, operation: str) -> bool:
        """Whether a call of `operation` armed with `hold_before`/`hold_after` is waiting now."""
        return held(self.backend, operation)

    def release(self, operation: str) -> None:
        """Let the held call of `operation` go on."""
        release(self.backend, operation)

    def reset(self) -> None:
        """Back to the seed data, with no fault armed."""
        self.backend.reset()


def systems(url: str | None = None) -> Systems:
    """The fakes on `url`, else on the URL given to `bind`, else on RAILYARD_DATABASE_URL."""
    return Systems(backend(url))


__all__ = [
    "FAULTS",
    "OPERATIONS",
    "Declined",
    "Fault",
    "NotFound",
    "Order",
    "Refund",
    "Systems",
    "Ticket",
    "bind",
    "close",
    "systems",
]
