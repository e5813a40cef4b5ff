"""Shared set-up for the reference workflows' tests: the fakes bound to the test's database, roles, script turns."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from engine import Engine, Registry, StaticRoles
from engine.providers.scripted import call
from tests.support.stores import sql_store
from workflows import REFUND_V1, REFUND_V2, TICKET_TRIAGE, fakes

#: dana and erin approve refunds; olga and otto run them when they stop (retry, send back, settle, cancel, stand in
#: for the model); bob holds no role; the portal relays customers' answers; sam works tickets; audrey audits.
ROLES = {
    "dana": {"refund_approver"},
    "erin": {"refund_approver"},
    "olga": {"refund_operator"},
    "otto": {"refund_operator"},
    "audrey": {"auditor"},
    "portal": {"customer_portal"},
    "sam": {"support_agent"},
}

DAMAGED = {"customer_id": "C-100", "message": "My laptop arrived with a cracked screen.", "order_id": "O-1001"}


@contextmanager
def fake_systems(db_url: str) -> Iterator[fakes.Systems]:
    """The fakes on the test's database, back at their seed data; unbound afterwards."""
    fakes.bind(db_url)
    try:
        books = fakes.systems()
        books.reset()
        yield books
    finally:
        fakes.bind(None)
        fakes.close(db_url)


@contextmanager
def reference_engine(db_url: str) -> Iterator[Engine]:
    registry = Registry([REFUND_V1, REFUND_V2, TICKET_TRIAGE])
    with Engine(db_url, registry, authoriser=StaticRoles(ROLES)) as engine:
        yield engine


@pytest.fixture
def books(db_url: str) -> Iterator[fakes.Systems]:
    """The fakes on the test's database (import this fixture, and `eng`, into a test module to use them)."""
    with fake_systems(db_url) as systems:
        yield systems


@pytest.fixture
def eng(db_url: str, books: fakes.Systems) -> Iterator[Engine]:
    """An engine with the reference workflows, over the fakes of `books`."""
    with reference_engine(db_url) as engine:
        yield engine


def refund(amount: int, order_id: str = "O-1001", currency: str = "EUR", **extra: Any) -> dict[str, Any]:
    return call(
        "propose_refund",
        order_id=order_id,
        amount=amount,
        currency=currency,
        reason=extra.pop("reason", "Screen cracked in transit."),
        evidence_ids=extra.pop("evidence_ids", ["EV-1"]),
        **extra,
    )


def steps(engine: Engine, task_id: str) -> list[tuple[str, str, str]]:
    """(who, trigger, to_state) of every event: the actor reduced to its kind for engine components."""
    out = []
    for event in engine.history(task_id):
        actor = event.actor.split(":")[0] if ":" in event.actor else event.actor
        out.append((actor, event.trigger, event.to_state))
    return out


def make_due(engine: Engine) -> None:
    """Every timer fires now: as if the deadlines had passed while no worker ran."""
    with sql_store(engine).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            text("UPDATE tasks SET next_run_at = :past WHERE next_run_at IS NOT NULL"), {"past": "2000-01-01 00:00:00"}
        )


def expire_leases(engine: Engine) -> None:
    """Every lease ends now: as if its worker had stopped heartbeating long ago."""
    with sql_store(engine).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            text("UPDATE tasks SET lease_expires_at = :past WHERE lease_expires_at IS NOT NULL"),
            {"past": "2000-01-01 00:00:00"},
        )
