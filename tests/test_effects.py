"""No effect outside the log, where people meet side effects: a cancel while a payment is in flight, approve
racing cancel, a retry after an unknown outcome, an operator's settlement; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from engine import (
    ANYONE,
    Code,
    Engine,
    RailyardError,
    Reconciled,
    Registry,
    ScriptedModel,
    StaticRoles,
    TaskState,
    Terminal,
    Tool,
    ToolCatalog,
    ToolDef,
    ToolInvocation,
    ToolKind,
    Wait,
    Worker,
    Workflow,
)
from engine.core.canonical import canonical_json
from engine.core.definition import Action as Act
from tests.support import reference
from tests.support.insider import forge
from tests.support.payloads import undeclared
from tests.support.races import together
from tests.support.reference import expire_leases
from tests.support.shop import ROLES as SHOP_ROLES
from tests.support.shop import Ledger, make_workflow
from workflows import fakes
from workflows.refund_tools import SETTLE_SECONDS
from workflows.scripts import REFUND_DAMAGED_ORDER_INPUT, refund_damaged_order

REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def refused(action: Callable[[], object]) -> RailyardError:
    with pytest.raises(RailyardError) as caught:
        action()
    return caught.value


def to_approval(eng: Engine, version: int = 1) -> str:
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal", version=version)
    assert eng.run(task_id, model=ScriptedModel(refund_damaged_order(version))).state == "awaiting_approval"
    return task_id


def approve(eng: Engine, task_id: str, **kwargs: Any) -> Any:
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    return eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"], **kwargs)


def triggers(eng: Engine, task_id: str) -> list[str]:
    return [e.trigger for e in eng.history(task_id)]


def worker_env(db_url: str, tmp_path: Path) -> dict[str, str]:
    silent = tmp_path / "silent.json"  # the tasks need no model turn; a worker serving agent states needs a model
    silent.write_text('{"turns": []}')
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_MODEL": f"scripted:{silent}",
    }
    env.pop("RAILYARD_WORKFLOWS", None)
    return env


def settled(eng: Engine, task_id: str) -> bool:
    return eng.load(task_id).status != "runnable"


def record_intent(eng: Engine, task: TaskState, requested_at: str = "2000-01-01T00:00:00Z") -> TaskState:
    """The intent of the task's prepared call, as a worker records it before calling (then dies, or is slow)."""
    assert task.prepared is not None
    return eng.commit_system(
        task, "call", {"intent": task.prepared, "attempt": 1, "requested_at": requested_at}, actor="system:tools"
    )


def wait_for(condition: Callable[[], bool], seconds: float = 60.0, what: str = "") -> None:
    until = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- a cancel while the payment is in flight ----------------------------------------------------------------


def test_a_cancel_while_the_payment_is_in_flight_waits_and_a_paid_refund_goes_to_review(
    db_url: str, eng: Engine, books: fakes.Systems, tmp_path: Path
) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", "hold_before")  # the provider takes its time: the test acts meanwhile
    worker = subprocess.Popen(
        [RAILYARD, "worker", "--once", "--workflows", "refund"],
        env=worker_env(db_url, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: books.held("payments.refund"), what="the payment call to reach the provider")
        during = eng.cancel(task_id, actor="olga", reason="The customer called it off.")
        # Recorded, not applied: the payment's outcome is not known yet, so the task cannot end now.
        assert during.state == "executing" and during.cancel_requested is not None
        view = eng.get(task_id)
        assert view.cancel_requested is not None and view.cancel_requested["actor"] == "olga"
        assert view.unsettled is not None and view.unsettled["status"] == "pending"
        books.release("payments.refund")  # the provider pays after all
        _, stderr = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert worker.returncode == 0, stderr
    task = eng.load(task_id)
    assert task.state == "paid_after_cancel"  # the refund workflow's review of a payment made despite a cancel
    events = eng.history(task_id)
    assert [e.trigger for e in events][-3:] == ["call", "cancel_requested", "succeeded"]
    action_id = events[-1].data["action_id"]
    paid = events[-1].data["outcome"]["result"]
    assert paid is not None and paid["amount"] == 12_999  # the amount that went out, in the log
    assert books.payments.executions() == {action_id: 1}
    assert eng.replay(task_id).ok
    # A refund approver closes the review; the payment stays in the log and the books.
    assert eng.fire(task_id, "acknowledge", {"note": "Told the customer."}, actor="olga").state == "completed"


@pytest.mark.parametrize(("hold", "ends_in"), [("hold_before", "cancelled"), ("hold_after", "paid_after_cancel")])
def test_a_worker_killed_while_a_cancel_waits_is_reconciled_and_the_cancel_completes(
    db_url: str, eng: Engine, books: fakes.Systems, tmp_path: Path, hold: fakes.Fault, ends_in: str
) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", hold)  # held before the provider pays, or after it paid and before it answers
    worker = subprocess.Popen(
        [RAILYARD, "worker", "--once", "--workflows", "refund", "--lease-seconds", "1"],
        env=worker_env(db_url, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: books.held("payments.refund"), what="the payment call to reach the provider")
        eng.cancel(task_id, actor="olga", reason="Withdrawn.")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        worker.kill()
    assert eng.load(task_id).state == "executing"  # the cancel still waits: nobody knows what the provider did
    expire_leases(eng)
    time.sleep(SETTLE_SECONDS)  # the stranded call can no longer land
    assert Worker(eng, name="heir", listen=False).run_once() == 1
    task = eng.load(task_id)
    assert task.state == ends_in
    events = eng.history(task_id)
    action_id = events[-1].data.get("action_id") or task.effect["action_id"]  # type: ignore[index]
    paid = books.payments.executions()
    if ends_in == "cancelled":  # the provider never paid: asked, it said so, and the cancel took effect
        assert paid == {}
        assert [e.trigger for e in events][-3:] == ["cancel_requested", "reconcile", "cancel"]
        assert events[-1].actor == "olga"
    else:  # it paid: the reconciled outcome is recorded before anything else, and the review state shows it
        assert paid == {action_id: 1}
        assert (events[-1].trigger, events[-1].data["reconciled"]) == ("succeeded", True)
    assert [r["result"] for r in books.payments.requests()].count("executed") == len(paid)
    assert eng.replay(task_id).ok


def test_the_cli_says_a_cancel_waits_for_the_payment_in_flight(
    db_url: str, eng: Engine, books: fakes.Systems, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from engine.cli import app

    task_id = to_approval(eng)
    task = approve(eng, task_id)
    record_intent(eng, task)  # a worker has the payment in flight
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.delenv("RAILYARD_WORKFLOWS", raising=False)
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\nolga = ["refund_operator"]\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    runner = CliRunner()
    refused = runner.invoke(app, ["cancel", task_id, "--as", "ann", "--reason", "Customer called."])
    assert refused.exit_code == 1 and "FORBIDDEN" in refused.stderr  # deny by default: ann holds no role
    done = runner.invoke(app, ["cancel", task_id, "--as", "olga", "--reason", "Customer called."])
    assert done.exit_code == 0, done.output
    assert "executing" in done.stdout and "cancel requested by olga" in done.stdout
    assert "payments_refund" in done.stdout
    shown = runner.invoke(app, ["show", task_id])
    assert "cancel requested" in shown.stdout and "write open" in shown.stdout


# -- human commands act on the state their human saw ---------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


@pytest.fixture
def shop(db_url: str, ledger: Ledger) -> Iterator[Engine]:
    with Engine(db_url, Registry([make_workflow(ledger)]), authoriser=StaticRoles(SHOP_ROLES)) as engine:
        yield engine


def shop_approval(eng: Engine) -> str:
    task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "query_order", "arguments": {"order_id": "O-1"}}]},
            {
                "tool_calls": [
                    {
                        "name": "propose_refund",
                        "arguments": {"order_id": "O-1", "amount_cents": 4_000, "currency": "EUR", "reason": "damaged"},
                    }
                ]
            },
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def test_approve_and_cancel_decided_on_the_same_seq_exactly_one_wins_every_round(shop: Engine) -> None:
    for _ in range(50):
        task_id = shop_approval(shop)
        task = shop.load(task_id)
        digest = task.prepared["digest"]  # type: ignore[index]
        approved, cancelled = together(
            partial(shop.approve, task_id, actor="dana", prepared_digest=digest, expected_seq=task.seq),
            partial(shop.cancel, task_id, actor="ann", reason="stop", expected_seq=task.seq),
        )
        outcomes = {"approve": approved, "cancel": cancelled}
        winners = [name for name, r in outcomes.items() if not isinstance(r, Code)]
        assert len(winners) == 1, outcomes
        loser = next(r for r in outcomes.values() if isinstance(r, Code))
        assert loser is Code.CONCURRENCY_CONFLICT
        assert triggers(shop, task_id)[task.seq :] == winners
        assert shop.get(task_id).state == ("executing" if winners == ["approve"] else "cancelled")


def test_a_stale_command_is_refused_naming_the_state_now_and_writes_nothing(shop: Engine) -> None:
    task_id = shop_approval(shop)
    seen = shop.load(task_id).seq
    call_ = shop.load(task_id).prepared
    assert call_ is not None
    shop.approve(task_id, actor="dana", prepared_digest=call_["digest"])
    before = triggers(shop, task_id)
    for command in (
        lambda: shop.cancel(task_id, actor="ann", reason="stop", expected_seq=seen),
        lambda: shop.reject(task_id, actor="dana", reason="no", expected_seq=seen),
        lambda: shop.fire(task_id, "cancel", {"reason": "stop"}, actor="ann", expected_seq=seen),
    ):
        error = refused(command)
        assert error.code is Code.CONCURRENCY_CONFLICT
        assert "'executing'" in error.message and error.details["state"] == "executing"
        assert error.details["actual"] == seen + 1
    assert triggers(shop, task_id) == before


def test_approve_and_cancel_racing_a_live_worker_never_pay_outside_the_log(shop: Engine, ledger: Ledger) -> None:
    waiting = [shop_approval(shop) for _ in range(20)]  # at the gate before the worker starts: nobody else runs them
    stop = threading.Event()
    worker = Worker(shop, name="live", poll_seconds=0.01, listen=False, concurrency=4)
    running = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    running.start()
    told: list[tuple[str, object, object]] = []
    try:
        for task_id in waiting:
            digest = shop.load(task_id).prepared["digest"]  # type: ignore[index]
            # No seq named: each command is decided on the state it reads; the cancel comes 0-40 ms later.
            approved, cancelled = together(
                partial(shop.approve, task_id, actor="dana", prepared_digest=digest),
                partial(shop.cancel, task_id, actor="ann", reason="stop"),
                jitter=0.04,
            )
            told.append((task_id, approved, cancelled))
        for task_id, _, _ in told:
            wait_for(partial(settled, shop, task_id), what=f"task {task_id} to settle")
    finally:
        stop.set()
        running.join(timeout=30)
    paid = ledger.executions()
    assert all(n == 1 for n in paid.values()), paid
    for task_id, approved, cancelled in told:
        task, events = shop.load(task_id), shop.history(task_id)
        outcomes = {
            e.data["action_id"]: e.trigger
            for e in events
            if e.trigger in ("succeeded", "failed", "unknown") and e.data.get("action_id")
        }
        for action_id in (e.data["intent"]["action_id"] for e in events if e.trigger == "call"):
            if action_id in paid:  # money moved: the log says so
                assert outcomes.get(action_id) == "succeeded", [(e.trigger, e.to_state) for e in events]
        # Every success a caller was told is in the log; every refusal left nothing.
        names = [e.trigger for e in events]
        assert (not isinstance(approved, Code)) == ("approve" in names)
        assert (not isinstance(cancelled, Code)) == ("cancel" in names or "cancel_requested" in names)
        assert task.unsettled is None and task.terminal
        assert shop.replay(task_id).ok


# -- a retry after an unknown outcome reconciles first; a remote that cannot be asked waits for a person --------


class Transfer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int


class Receipt(BaseModel):
    reference: str


class Bank:
    """A remote that executes transfers and may lose the answer; it counts what really ran."""

    def __init__(self) -> None:
        self.executed: dict[str, int] = {}
        self.lose_reply = False
        self.fail_before = False

    def send(self, call: ToolInvocation) -> Receipt:
        if self.fail_before:
            self.fail_before = False
            raise ConnectionRefusedError("down")
        key = call.idempotency_key
        self.executed[key] = self.executed.get(key, 0) + 1
        if self.lose_reply:
            self.lose_reply = False
            raise ConnectionResetError("the answer was lost")
        return Receipt(reference=f"T-{key[:6]}")

    def lookup(self, action_id: str) -> Reconciled:
        return (
            Reconciled.succeeded(Receipt(reference=f"T-{action_id[:6]}"))
            if action_id in self.executed
            else Reconciled.not_found()
        )


def transfer_workflow(bank: Bank, *, askable: bool) -> Workflow:
    """`transfer@1`: an operator sends a transfer; a lost outcome goes to review, where they retry or close."""
    tool = (
        ToolDef("transfer", Transfer, Receipt, ToolKind.WRITE, bank.send, reconcile=bank.lookup, timeout=5)
        if askable
        else ToolDef("transfer", Transfer, Receipt, ToolKind.WRITE, bank.send, operator_settles=True, timeout=5)
    )
    return Workflow(
        name="transfer",
        version=1,
        tools=ToolCatalog("bank", 1, [tool]),
        settle_role="ops",
        states=[
            Wait("ready", actions=[Act("send", "sending", Transfer, prepares="transfer", role="ops")]),
            Tool("sending", tool="transfer", on_succeeded="done", on_failed="review", on_unknown="review"),
            Wait(
                "review",
                actions=[
                    Act("try_again", "sending", role="ops"),
                    Act("close", "closed", role="ops"),
                    Act("send_other", "sending", Transfer, prepares="transfer", role="ops"),
                ],
            ),
            Terminal("done"),
            Terminal("closed"),
        ],
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )


OPS = {"olga": {"ops"}, "ann": set()}


def transfer_engine(db_url: str, bank: Bank, *, askable: bool) -> Engine:
    return Engine(db_url, Registry([transfer_workflow(bank, askable=askable)]), authoriser=StaticRoles(OPS))


def lost_transfer(eng: Engine, bank: Bank) -> str:
    """A transfer the bank executed, whose answer was lost: its outcome is `unknown`, the task in review."""
    task_id = eng.start("transfer", actor="olga")
    eng.fire(task_id, "send", {"amount": 100}, actor="olga")
    bank.lose_reply = True
    assert eng.run(task_id).state == "review"
    assert eng.history(task_id)[-1].trigger == "unknown"
    return task_id


def test_a_retry_after_an_unknown_outcome_reconciles_and_never_sends_again(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=True) as eng:
        task_id = lost_transfer(eng, bank)
        assert eng.get(task_id).unsettled["status"] == "unknown"  # type: ignore[index]
        eng.fire(task_id, "try_again", actor="olga")
        assert eng.run(task_id).state == "done"
        last = eng.history(task_id)[-1]
        assert (last.trigger, last.data["reconciled"]) == ("succeeded", True)
        assert list(bank.executed.values()) == [1]  # asked, not sent again
        assert eng.replay(task_id).ok


def test_a_retry_after_an_unknown_outcome_sends_again_only_when_the_remote_never_saw_it(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=True) as eng:
        task_id = eng.start("transfer", actor="olga")
        eng.fire(task_id, "send", {"amount": 100}, actor="olga")
        bank.fail_before = True  # refused before executing: not ToolFailed, so unknown to the engine
        assert eng.run(task_id).state == "review"
        eng.fire(task_id, "try_again", actor="olga")
        assert eng.run(task_id).state == "done"
        assert triggers(eng, task_id)[-4:] == ["try_again", "reconcile", "call", "succeeded"]
        assert list(bank.executed.values()) == [1]


def test_a_write_nobody_can_ask_about_waits_for_an_operator_before_it_is_sent_again(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=False) as eng:
        task_id = lost_transfer(eng, bank)
        before = triggers(eng, task_id)
        assert refused(lambda: eng.fire(task_id, "try_again", actor="olga")).code is Code.OUTCOME_UNSETTLED
        assert refused(lambda: eng.fire(task_id, "close", actor="olga")).code is Code.OUTCOME_UNSETTLED
        assert refused(lambda: eng.settle(task_id, "ann", "not_executed", "checked")).code is Code.FORBIDDEN
        assert refused(lambda: eng.settle(task_id, "olga", "maybe", "checked")).code is Code.PAYLOAD_INVALID
        assert refused(lambda: eng.settle(task_id, "olga", "executed", "")).code is Code.PAYLOAD_INVALID
        assert triggers(eng, task_id) == before  # every refusal left the log as it was
        # The operator looked at the bank's statement: it was executed. The retry records that, sending nothing.
        eng.settle(task_id, "olga", "executed", "statement line 42")
        assert eng.get(task_id).unsettled is None
        eng.fire(task_id, "try_again", actor="olga")
        assert eng.run(task_id).state == "done"
        last = eng.history(task_id)[-1]
        assert last.data["asserted"] == {"by": "olga", "evidence": "statement line 42"}
        assert list(bank.executed.values()) == [1]
        assert eng.replay(task_id).ok


def test_an_operator_who_verified_nothing_happened_lets_the_retry_send_it_again(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=False) as eng:
        task_id = eng.start("transfer", actor="olga")
        eng.fire(task_id, "send", {"amount": 100}, actor="olga")
        bank.fail_before = True
        assert eng.run(task_id).state == "review"
        eng.fire(
            task_id, "settle", {"outcome": "not_executed", "evidence": "bank says no such transfer"}, actor="olga"
        )  # `fire` reaches the same settlement
        eng.fire(task_id, "try_again", actor="olga")
        assert eng.run(task_id).state == "done"
        assert list(bank.executed.values()) == [1]
        assert triggers(eng, task_id)[-4:] == ["settle", "try_again", "call", "succeeded"]


def test_a_stranded_write_nobody_can_ask_about_is_recorded_unknown_not_sent_again(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=False) as eng:
        task_id = eng.start("transfer", actor="olga")
        task = eng.fire(task_id, "send", {"amount": 100}, actor="olga")
        # A worker recorded the intent and died before the outcome (the call may or may not have happened).
        record_intent(eng, task)
        assert eng.run(task_id).state == "review"
        outcome = eng.history(task_id)[-1].data["outcome"]
        assert (outcome["outcome"], outcome["code"]) == ("unknown", "TOOL_EXECUTION_UNKNOWN")
        assert bank.executed == {}


def test_a_cancel_of_a_task_whose_outcome_is_unknown_waits_for_the_operators_settlement(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=False) as eng:
        task_id = lost_transfer(eng, bank)
        assert eng.cancel(task_id, actor="olga", reason="customer withdrew").state == "review"
        assert eng.get(task_id).cancel_requested is not None
        eng.settle(task_id, "olga", "executed", "statement line 7")
        # The effect happened although a cancel was asked for: by default the task ends cancelled, its log
        # showing the effect (a workflow names a review state with effect_after_cancel, as refund does).
        task = eng.load(task_id)
        assert task.state == "cancelled"
        assert eng.history(task_id)[-1].data["settled"]["outcome"] == "executed"
        assert undeclared(eng.history(task_id)) == []
        assert eng.replay(task_id).ok


def test_the_refund_cannot_be_closed_while_its_payment_is_unknown_and_a_settled_cancel_goes_to_review(
    eng: Engine, books: fakes.Systems
) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    assert eng.run(task_id).state == "retryable_failure"
    eng.fire(task_id, "give_up", actor="olga")
    assert refused(lambda: eng.fire(task_id, "close", {"reason": "No."}, actor="olga")).code is Code.OUTCOME_UNSETTLED
    assert (
        refused(lambda: eng.migrate(task_id, 2, {"needs_human": "needs_human"}, "dana", "x")).code
        is Code.MIGRATION_INVALID
    )
    eng.cancel(task_id, actor="olga", reason="Withdrawn.")
    assert eng.settle(task_id, "olga", "executed", "provider dashboard").state == "paid_after_cancel"
    assert undeclared(eng.history(task_id)) == []
    assert eng.replay(task_id).ok


def stranded(eng: Engine, *, requested_at: str) -> str:
    """A transfer whose intent a worker recorded at `requested_at` before it stopped answering."""
    task_id = eng.start("transfer", actor="olga")
    task = eng.fire(task_id, "send", {"amount": 100}, actor="olga")
    assert task.prepared is not None
    record_intent(eng, task, requested_at)
    return task_id


def test_an_operator_cannot_settle_a_call_that_may_still_land(db_url: str) -> None:
    from engine.core.canonical import format_instant, now

    bank = Bank()
    with transfer_engine(db_url, bank, askable=False) as eng:
        task_id = stranded(eng, requested_at=format_instant(now()))
        before = triggers(eng, task_id)
        error = refused(lambda: eng.settle(task_id, "olga", "not_executed", "looked"))
        assert error.code is Code.OUTCOME_UNSETTLED and "may still be running" in error.message
        assert triggers(eng, task_id) == before
        # Once the attempt's time is up (its intent long ago, no worker holding it), the settlement is recorded.
        old = stranded(eng, requested_at="2000-01-01T00:00:00Z")
        assert eng.settle(old, "olga", "not_executed", "looked").unsettled is None


def test_no_other_call_is_prepared_while_a_write_is_open(db_url: str) -> None:
    bank = Bank()
    with transfer_engine(db_url, bank, askable=True) as eng:
        task_id = lost_transfer(eng, bank)
        before = triggers(eng, task_id)
        error = refused(lambda: eng.fire(task_id, "send_other", {"amount": 5}, actor="olga"))
        assert error.code is Code.OUTCOME_UNSETTLED and "prepare another call" in error.message
        assert triggers(eng, task_id) == before
        eng.fire(task_id, "try_again", actor="olga")  # the open one is reconciled first, then others may follow
        assert eng.run(task_id).state == "done"


def test_a_snapshot_from_before_effects_is_not_trusted_with_an_open_intent(db_url: str) -> None:
    from tests.support.insider import tamper

    bank = Bank()
    with Engine(
        db_url, Registry([transfer_workflow(bank, askable=True)]), authoriser=StaticRoles(OPS), snapshot_every=1
    ) as eng:
        task_id = stranded(eng, requested_at="2000-01-01T00:00:00Z")
        seq = eng.load(task_id).seq
        # The snapshot at the intent, as the code before effects wrote it: no `effect` key.
        [snapshot] = [s for s in eng.store.snapshots(task_id) if s.seq == seq]
        older = {k: v for k, v in json.loads(snapshot.doc).items() if k != "effect"}
        tamper(
            db_url,
            "UPDATE snapshots SET doc = :doc WHERE task_id = :t AND seq = :s",
            doc=canonical_json(older),
            t=task_id,
            s=seq,
        )
        assert eng.load(task_id).unsettled is not None  # folded from zero: the intent is still open
        assert eng.replay(task_id).ok  # an older snapshot is checked on what it holds
        assert eng.run(task_id).state == "done"
        assert list(bank.executed.values()) == [1]  # reconciliation found nothing sent; then one send
        assert triggers(eng, task_id)[-3:] == ["reconcile", "call", "succeeded"]


def test_replay_reports_a_garbled_settlement_instead_of_crashing(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    task = eng.load(task_id)
    assert task.prepared is not None
    record_intent(eng, task)
    forge(
        eng,
        task_id,
        trigger="settle",
        to_state="cancelled",
        status="terminal",
        data={
            "args": {"outcome": "not_executed", "evidence": "x"},
            "settled": {"action_id": task.prepared["action_id"], "outcome": ["no"]},
        },
    )
    assert "ILLEGAL_TRANSITION" in eng.replay(task_id).codes


# -- configuration errors are not task failures -------------------------------------------------------------


def test_a_worker_without_a_model_refuses_to_start_and_touches_no_task(
    db_url: str, eng: Engine, tmp_path: Path
) -> None:
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal")
    before = eng.store.row(task_id)
    env = worker_env(db_url, tmp_path)
    env.pop("RAILYARD_MODEL")
    done = subprocess.run([RAILYARD, "worker", "--once"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "MODEL_NOT_CONFIGURED" in done.stderr and "Traceback" not in done.stderr
    assert eng.store.row(task_id) == before


def test_a_worker_with_an_unreadable_profiles_file_refuses_to_start(db_url: str, eng: Engine, tmp_path: Path) -> None:
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal")
    before = eng.store.row(task_id)
    (tmp_path / "profiles.toml").write_text("this is [not toml")
    env = {**worker_env(db_url, tmp_path), "RAILYARD_PROFILES_FILE": str(tmp_path / "profiles.toml")}
    done = subprocess.run([RAILYARD, "worker", "--once"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "CONFIG_INVALID" in done.stderr and "Traceback" not in done.stderr
    assert eng.store.row(task_id) == before


def test_a_tool_the_deployment_lacks_leaves_the_task_untouched_and_uncounted(db_url: str) -> None:
    from tests.support.sample_workflows import REFUND_V1 as NO_CATALOG  # its tool states name a tool no catalog holds

    with Engine(db_url, Registry([NO_CATALOG])) as engine:
        task_id = engine.start("refund", {"customer": "c1", "balance": 100}, actor="ann")
        engine.fire(task_id, "propose", {"amount": 5, "reason": "small"}, actor="model")
        before = triggers(engine, task_id)
        worker = Worker(engine, name="lacking", listen=False, max_failures=1, retry_backoff=0)
        for _ in range(2):
            assert worker.run_once() == 1
        assert triggers(engine, task_id) == before and engine.get(task_id).state == "auto_refund"
        assert worker.counts.config_errors == 2 and worker.counts.failures == 0


def test_a_model_missing_at_run_time_leaves_the_task_untouched_and_uncounted(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAILYARD_MODEL", raising=False)
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal")
    before = triggers(eng, task_id)
    worker = Worker(eng, name="unconfigured", listen=False, max_failures=1, retry_backoff=0)
    for _ in range(3):  # a failure budget of one would have handed it off after the first
        worker.run_once()
    assert triggers(eng, task_id) == before
    row = eng.store.row(task_id)
    assert row is not None and row.state == "collecting_information" and row.lease_owner is None
    assert worker.counts.config_errors == 3 and worker.counts.failures == 0


# -- replay knows the invariant -----------------------------------------------------------------------------


def test_replay_finds_a_task_that_ended_with_its_payment_unsettled(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    task = eng.load(task_id)
    assert task.prepared is not None
    record_intent(eng, task, requested_at="2026-01-01T00:00:00Z")
    assert eng.replay(task_id).ok
    # An insider "cancels" it with a well-chained event the engine would have refused: the intent has no outcome.
    forge(eng, task_id, trigger="cancel", to_state="cancelled", data={"args": {"reason": "x"}}, status="terminal")
    report = eng.replay(task_id)
    assert report.codes == ["INTENT_UNSETTLED"]
    assert "payments_refund" in report.findings[0].message


def test_replay_finds_a_payment_outcome_whose_intent_is_missing(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    forge(
        eng,
        task_id,
        trigger="succeeded",
        to_state="completed",
        status="terminal",
        data={"outcome": {"outcome": "succeeded"}, "action_id": prepared["action_id"]},
    )
    assert eng.replay(task_id).codes == ["OUTCOME_WITHOUT_INTENT"]
