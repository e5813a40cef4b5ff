"""ticket_triage@2: a refund decision starts a `refund` task (a child) and the ticket answers from its outcome; a
cancel of the ticket while the refund is paying waits for the payment, which shows in both logs. SQLite and
PostgreSQL, with the payment made by a real worker process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import Engine, Registry, ScriptedModel, StaticRoles, Worker
from tests.support.reference import ROLES, fake_systems
from workflows import REFUND_V1, TICKET_TRIAGE_V2, fakes
from workflows.scripts import TICKET_REFUND, TICKET_REFUND_INPUT

REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))


@pytest.fixture
def books(db_url: str) -> Iterator[fakes.Systems]:
    with fake_systems(db_url) as systems:
        yield systems


@pytest.fixture
def eng(db_url: str, books: fakes.Systems) -> Iterator[Engine]:
    with Engine(db_url, Registry([REFUND_V1, TICKET_TRIAGE_V2]), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    until = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def approved_refund(eng: Engine, script: ScriptedModel) -> tuple[str, str]:
    """A ticket waiting for its refund task, which is approved and due to pay."""
    ticket = eng.start("ticket_triage", TICKET_REFUND_INPUT, actor="helpdesk", version=2)
    waiting = eng.run(ticket, model=script)
    assert (waiting.state, waiting.status) == ("refunding", "blocked")
    refund = waiting.visit["child"]["task_id"]
    assert eng.run(refund, model=script).state == "awaiting_approval"
    prepared = eng.load(refund).prepared
    assert prepared is not None
    eng.approve(refund, actor="dana", prepared_digest=prepared["digest"])
    return ticket, refund


def test_a_refund_decision_starts_a_refund_task_and_the_ticket_answers_from_its_outcome(
    eng: Engine, books: fakes.Systems
) -> None:
    script = ScriptedModel(TICKET_REFUND)
    ticket, refund = approved_refund(eng, script)
    first = eng.history(refund)[0]
    assert first.data["input"]["order_id"] == "O-1003" and first.data["input"]["customer_id"] == "C-100"
    assert first.data["input"]["message"].startswith("Order O-1003 was due")  # the ticket's words, by code
    assert eng.run(refund, model=script).state == "completed"
    Worker(eng, listen=False, workflows=["ticket_triage"], model=script).drain()
    assert eng.load(ticket).state == "resolved"
    end = next(e for e in eng.history(ticket) if e.trigger == "child_completed")
    assert end.data["child"]["result"] == {"state": "completed", "amount": 30_000, "currency": "USD"}
    assert len(books.payments.executions()) == 1
    assert eng.replay(ticket).ok and eng.replay(refund).ok


def test_a_ticket_without_a_known_order_cannot_start_a_refund(eng: Engine) -> None:
    ticket = eng.start("ticket_triage", {"ticket_id": "T-5003"}, actor="helpdesk", version=2)
    after = eng.run(ticket, model=ScriptedModel(TICKET_REFUND), max_turns=3)
    last = eng.history(ticket)[-1]
    assert (after.state, last.trigger, last.data["turn"]["code"]) == ("deciding~force", "repair", "DOMAIN_INVALID")
    assert "knows_the_order" in str(last.data["turn"]["errors"])  # the model is told why, and may ESCALATE
    assert eng.get(ticket).children == []


def test_cancelling_the_ticket_while_its_refund_pays_waits_for_the_payment_which_shows_in_both_logs(
    db_url: str, eng: Engine, books: fakes.Systems, tmp_path: Path
) -> None:
    script = ScriptedModel(TICKET_REFUND)
    ticket, refund = approved_refund(eng, script)
    books.arm("payments.refund", "hold_before")  # the provider takes its time: the ticket is cancelled meanwhile
    silent = tmp_path / "silent.json"
    silent.write_text('{"turns": []}')
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_MODEL": f"scripted:{silent}",
    }
    env.pop("RAILYARD_WORKFLOWS", None)
    worker = subprocess.Popen(
        [RAILYARD, "worker", "--once", "--workflows", "refund"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: books.held("payments.refund"), "the payment to reach the provider")
        during = eng.cancel(ticket, actor="sam", reason="The customer found the parcel.")
        # The ticket's cancel waits for its refund task; the refund's cancel waits for the payment in flight.
        assert during.state == "refunding" and during.cancel_requested is not None
        child = eng.load(refund)
        assert child.state == "executing" and child.cancel_requested is not None
        assert child.cancel_requested["actor"] == "system:children"
        books.release("payments.refund")  # the provider pays after all
        _, stderr = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert worker.returncode == 0, stderr
    assert eng.load(refund).state == "paid_after_cancel"  # the refund's own review of a payment despite a cancel
    assert eng.load(ticket).state == "refunding"  # still waiting: its child has not ended
    eng.fire(refund, "acknowledge", {"note": "Customer told the refund went out."}, actor="olga")
    Worker(eng, listen=False, workflows=["ticket_triage"]).drain()
    end = eng.history(ticket)[-1]
    assert (eng.load(ticket).state, end.trigger) == ("cancelled", "child_completed")
    assert end.data["child"]["result"] == {"state": "completed", "amount": 30_000, "currency": "USD"}  # in both logs
    paid = [e for e in eng.history(refund) if e.trigger == "succeeded" and e.from_state == "executing"]
    receipt = paid[0].data["outcome"]["result"] if paid else None
    assert receipt is not None and receipt["amount"] == 30_000
    assert books.payments.executions() == {paid[0].data["action_id"]: 1}
    assert eng.replay(ticket).ok and eng.replay(refund).ok
