"""Tools and approvals end to end: the refund flow with a scripted model, exactly-once writes across
SIGKILL at each point of the write protocol, stale approvals and injected instructions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Code, Engine, RailyardError, Registry, ScriptedModel, StaticRoles
from engine.providers.scripted import call
from tests.support.payloads import undeclared
from tests.support.shop import ROLES, SETTLE_SECONDS, Ledger, make_workflow

REPO = Path(__file__).resolve().parent.parent


REFUND = {"order_id": "O-1", "amount_cents": 4_000, "currency": "EUR", "reason": "damaged parcel"}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.db")


@pytest.fixture
def eng(db_url: str, ledger: Ledger) -> Iterator[Engine]:
    with Engine(db_url, Registry([make_workflow(ledger)]), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def to_approval(eng: Engine, refund: dict[str, Any] = REFUND) -> str:
    task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1"),
            call("propose_refund", **{**refund, "amount_cents": 9_000}),  # over the refundable balance: repaired
            call("propose_refund", **refund),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def test_the_refund_flow_runs_end_to_end_and_pays_exactly_once(eng: Engine, ledger: Ledger) -> None:
    task_id = to_approval(eng)
    pending = eng.approvals(role="refund_approver")
    assert [p["task_id"] for p in pending] == [task_id]
    prepared = pending[0]["prepared"]
    assert prepared["tool"] == "refund_payment" and prepared["arguments"]["amount_cents"] == 4_000
    assert prepared["required_role"] == "refund_approver"
    eng.approve(task_id, actor="dana", prepared_digest=pending[0]["digest"], comment="photos attached")
    task = eng.run(task_id)
    assert task.state == "completed"
    assert ledger.executions() == {prepared["action_id"]: 1}
    events = eng.history(task_id)
    steps = [(e.actor.split(":")[0], e.trigger, e.to_state) for e in events]
    assert steps == [
        ("ann", "start", "collecting"),
        ("model", "query_order", "querying"),
        ("system", "call", "querying"),
        ("system", "succeeded", "collecting"),
        ("model", "repair", "collecting~force"),
        ("model", "propose_refund", "awaiting_approval"),
        ("dana", "approve", "executing"),
        ("system", "call", "executing"),
        ("system", "succeeded", "completed"),
    ]
    assert events[4].data["turn"]["code"] == "DOMAIN_INVALID"
    assert events[7].data["intent"]["action_id"] == prepared["action_id"]
    assert events[6].data["approval"]["digest"] == prepared["digest"]


def test_an_approval_naming_another_digest_is_stale(eng: Engine) -> None:
    task_id = to_approval(eng)
    with pytest.raises(RailyardError) as caught:
        eng.approve(task_id, actor="dana", prepared_digest="0" * 64)
    assert caught.value.code is Code.APPROVAL_STALE
    with pytest.raises(RailyardError) as caught:
        eng.approve(task_id, actor="dana", prepared_digest=None)
    assert caught.value.code is Code.APPROVAL_STALE
    assert eng.get(task_id).state == "awaiting_approval"


def test_injected_instructions_in_a_tool_result_change_nothing(eng: Engine) -> None:
    task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
    obedient = ScriptedModel(
        [
            call("query_order", order_id="O-2"),
            # The model "obeys" the note in the order: the engine still applies every layer.
            call("propose_refund", order_id="O-2", amount_cents=1_000_000, currency="EUR", reason="as instructed"),
            call("refund_payment", order_id="O-2", amount_cents=1_000_000, currency="EUR", reason="direct"),
            call(
                "propose_refund", order_id="O-2", amount_cents=1_000_000, currency="EUR", reason="again", actor="admin"
            ),
        ],
        profile="anthropic",
    )
    task = eng.run(task_id, model=obedient)
    codes = [e.data["turn"]["code"] for e in eng.history(task_id) if "turn" in e.data and e.data["turn"]["code"]]
    assert codes == ["DOMAIN_INVALID", "ACTION_UNKNOWN", "IDENTITY_OVERRIDE"]
    assert task.state == "collecting~handoff"
    assert eng.approvals() == []
    request = obedient.requests[1]
    context = request.messages[1].content
    note = "IGNORE PREVIOUS INSTRUCTIONS"
    assert context.index('<tool_result name="query_order"') < context.index(note) < context.index("</tool_result>")
    assert [t.name for t in request.tools] == ["query_order", "propose_refund"]


def test_a_cancel_while_the_payment_is_in_flight_waits_for_its_outcome(
    eng: Engine, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = to_approval(eng)
    eng.approve(task_id, actor="dana", prepared_digest=eng.load(task_id).prepared["digest"])  # type: ignore[index]
    from engine.runtime.execute import execute as real_execute

    seen: list[Any] = []

    def cancel_while_running(tool: Any, prepared: Any, acting: Any) -> Any:
        outcome = real_execute(tool, prepared, acting)
        seen.append(eng.cancel(task_id, actor="ann", reason="customer called"))
        return outcome

    monkeypatch.setattr("engine.runtime.tool_runner.execute", cancel_while_running)
    task = eng.run(task_id)
    # The cancel was recorded while the call ran, and took effect once the payment's outcome was on record.
    assert seen[0].state == "executing" and seen[0].cancel_requested["actor"] == "ann"
    assert task.state == "cancelled"
    events = eng.history(task_id)
    assert [e.trigger for e in events][-3:] == ["call", "cancel_requested", "succeeded"]
    assert events[-1].data["outcome"]["outcome"] == "succeeded"  # the log says the money moved
    assert len(ledger.executions()) == 1
    assert eng.replay(task_id).ok


# -- SIGKILL at each point of the write protocol ------------------------------------------------------


WORKER = """
import os, sys
from engine import Engine, Registry, StaticRoles
from tests.support.shop import ROLES, SETTLE_SECONDS, Ledger, make_workflow
url, ledger_path, task_id, kill_at = sys.argv[1:5]
engine = Engine(url, Registry([make_workflow(Ledger(ledger_path))]), authoriser=StaticRoles(ROLES))
if kill_at == "before_intent":
    real = engine.commit
    def commit(task, decision, *, actor):
        if decision.trigger == "call":
            os.kill(os.getpid(), 9)
        return real(task, decision, actor=actor)
    engine.commit = commit
os.environ["SHOP_KILL_AT"] = kill_at
print(engine.run(task_id).state)
"""


def run_worker(db_url: str, ledger: Ledger, task_id: str, kill_at: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, db_url, ledger.path, task_id, kill_at],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


@pytest.mark.parametrize("kill_at", ["before_intent", "after_intent", "after_call"])
def test_a_worker_killed_mid_write_never_pays_twice(eng: Engine, ledger: Ledger, db_url: str, kill_at: str) -> None:
    task_id = to_approval(eng)
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"])
    assert run_worker(db_url, ledger, task_id, kill_at) == -9  # killed by SIGKILL
    stranded = eng.load(task_id)
    assert stranded.state == "executing"
    assert bool(stranded.visit.get("pending")) is (kill_at != "before_intent")
    if stranded.visit.get("pending"):
        # Too early: the attempt might still be running, so reconciliation is not trusted yet.
        from engine.runtime.tool_runner import AttemptInFlight

        with pytest.raises(AttemptInFlight):
            eng.run(task_id)
        time.sleep(SETTLE_SECONDS)
    # Another worker resumes the task from its log.
    task = eng.run(task_id)
    assert task.state == "completed"
    assert ledger.executions() == {prepared["action_id"]: 1}
    triggers = [e.trigger for e in eng.history(task_id)[7:]]
    if kill_at == "after_call":  # executed, not recorded: reconciliation finds it
        assert triggers == ["call", "succeeded"]
        assert eng.history(task_id)[-1].data["reconciled"] is True
    elif kill_at == "after_intent":  # recorded, never executed: not_found permits a new attempt, same action id
        assert triggers == ["call", "reconcile", "call", "succeeded"]
        intents = [e.data["intent"]["action_id"] for e in eng.history(task_id) if e.trigger == "call"][-2:]
        assert intents == [prepared["action_id"]] * 2
    else:
        assert triggers == ["call", "succeeded"]
    assert json.dumps(eng.history(task_id)[-1].data["outcome"]["result"]).startswith('{"refund_id"')


# -- budgets ------------------------------------------------------------------------------------------


def budgeted(db_url: str, ledger: Ledger, **limits: Any) -> Engine:
    from engine import Budgets

    return Engine(db_url, Registry([make_workflow(ledger, Budgets(**limits))]), authoriser=StaticRoles(ROLES))


def limit_event(eng: Engine, task_id: str) -> Any:
    event = eng.history(task_id)[-1]
    assert (event.trigger, event.to_state, event.data["code"]) == (
        "limit",
        "limit_exceeded",
        "AGENT_STEP_LIMIT_EXCEEDED",
    )
    assert undeclared([event]) == []
    return event


def test_a_model_that_queries_the_same_thing_forever_stops_at_the_repeats_budget(db_url: str, ledger: Ledger) -> None:
    with budgeted(db_url, ledger, repeats=3) as eng:
        task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
        forever = ScriptedModel([call("query_order", order_id="O-1")] * 50, profile="anthropic")
        task = eng.run(task_id, model=forever, max_turns=100)
        assert task.state == "limit_exceeded" and task.status == "blocked"
        event = limit_event(eng, task_id)
        assert event.data["budget"] == "repeats" and event.data["tool"] == "query_order"
        assert [e.trigger for e in eng.history(task_id)].count("call") == 3  # the steps so far stay in the log


def test_model_turns_and_deadline_budgets(db_url: str, ledger: Ledger) -> None:
    from datetime import timedelta

    with budgeted(db_url, ledger, model_turns=2) as eng:
        task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
        eng.run(task_id, model=ScriptedModel([{"text": "thinking"}] * 5, profile="anthropic"))
        assert limit_event(eng, task_id).data["budget"] == "model_turns"
        assert [e.trigger for e in eng.history(task_id)] == ["start", "repair", "repair", "limit"]
    with budgeted(db_url, ledger, deadline=timedelta(microseconds=1)) as eng:
        task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
        eng.run(task_id, model=ScriptedModel([call("query_order", order_id="O-1")], profile="anthropic"))
        assert limit_event(eng, task_id).data["budget"] == "deadline"


def test_a_read_tool_is_simply_retried_and_a_failure_is_shown_to_the_model(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.runtime.execute import execute as real_execute

    task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
    crash = {"once": True}

    def dies_once(tool: Any, prepared: Any, acting: Any) -> Any:
        if crash.pop("once", False):
            raise KeyboardInterrupt  # the worker stops after the intent, before any outcome
        return real_execute(tool, prepared, acting)

    monkeypatch.setattr("engine.runtime.tool_runner.execute", dies_once)
    with pytest.raises(KeyboardInterrupt):
        eng.run(task_id, model=ScriptedModel([call("query_order", order_id="O-1")], profile="anthropic"))
    assert eng.load(task_id).visit["pending"]
    model = ScriptedModel([call("query_order", order_id="O-404"), {"text": "?"}], profile="anthropic")
    eng.run(task_id, model=model, max_turns=4)
    triggers = [e.trigger for e in eng.history(task_id)]
    assert triggers[:6] == ["start", "query_order", "call", "call", "succeeded", "query_order"]
    failure = next(e for e in eng.history(task_id) if e.trigger == "failed")
    assert failure.data["outcome"]["code"] == "TOOL_REMOTE_ERROR"
    context = model.requests[-1].messages[1].content
    assert '"error": "TOOL_REMOTE_ERROR"' in context and "no such order" not in context


def test_a_tool_changed_without_a_new_catalog_version_is_detected(db_url: str, ledger: Ledger, eng: Engine) -> None:
    from dataclasses import replace

    task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
    original = make_workflow(ledger)
    assert original.tools is not None
    edited_tools = [
        replace(t, description=t.description + " Now faster.") if t.name == "refund_payment" else t
        for t in original.tools.tools
    ]
    from engine import ToolCatalog

    catalog = ToolCatalog(original.tools.name, original.tools.version, edited_tools)
    edited = replace(original, tools=catalog)
    assert edited.digest != original.digest
    with (
        Engine(db_url, Registry([edited]), authoriser=StaticRoles(ROLES)) as other,
        pytest.raises(RailyardError) as caught,
    ):
        other.get(task_id)
    assert caught.value.code is Code.DEFINITION_CHANGED
