"""The fake ticket system: tickets as the help desk stores them, personal data and internal notes included."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from engine.core.canonical import utc
from workflows.fakes.backend import Backend
from workflows.fakes.errors import NotFound
from workflows.fakes.faults import strike_after, strike_before, take
from workflows.fakes.schema import tickets


@dataclass(frozen=True)
class Ticket:
    """The whole record. Whoever shows a ticket to a model must pick the fields it may see."""

    ticket_id: str
    customer_id: str
    subject: str
    body: str
    status: str
    priority: str
    product: str
    opened_at: datetime
    phone: str
    national_id: str
    internal_notes: str


class Tickets:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def get(self, ticket_id: str, *, timeout: float = 10.0) -> Ticket:
        fault = take(self.backend, "tickets.get")
        strike_before(fault, timeout)
        with self.backend.read() as conn:
            row = conn.execute(select(tickets).where(tickets.c.ticket_id == ticket_id)).first()
        if row is None:
            raise NotFound(f"ticket {ticket_id}")
        strike_after(fault)
        return Ticket(**{**row._asdict(), "opened_at": utc(row.opened_at)})
