"""refund@1 and refund@2 end to end on SQLite and PostgreSQL, against the fake order and payment systems.

Each test reads what happened from the task's log and the payment provider's
books: who moved the task where, what the guards refused, how often money
moved per action id.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import Code, Engine, RailyardError, ScriptedModel, Worker, decide
from engine.core.canonical import utc
from engine.core.payloads import PreparedCallData
from engine.providers.scripted import call
from engine.runtime.tool_runner import AttemptInFlight
from tests.support import reference
from tests.support.reference import DAMAGED, expire_leases, make_due, refund, steps
from workflows import REFUND_V1, REFUND_V2, fakes
from workflows.refund_tools import SETTLE_SECONDS

REPO = Path(__file__).resolve().parent.parent

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def refused(action: Any) -> RailyardError:
    with pytest.raises(RailyardError) as caught:
        action()
    return caught.value


def to_approval(eng: Engine, *, starter: str = "ann", amount: int = 12_999, version: int = 1, **extra: Any) -> str:
    """A task the model took to awaiting_approval: looked up, assessed, proposed 15,000 (refused), then `amount`."""
    task_id = eng.start("refund", DAMAGED, actor=starter, version=version)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(15_000, **extra),  # over the refundable balance of 12,999: the guard refuses, the model repairs
            refund(amount, **extra),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def prepared(eng: Engine, task_id: str) -> PreparedCallData:
    call_ = eng.load(task_id).prepared
    assert call_ is not None
    return call_


def approve(eng: Engine, task_id: str, approver: str = "dana") -> None:
    eng.approve(task_id, actor=approver, prepared_digest=prepared(eng, task_id)["digest"], comment="photo checked")


# -- the main path ------------------------------------------------------------------------------------------


def test_a_refund_is_looked_up_repaired_approved_by_another_user_and_paid_once(
    eng: Engine, books: fakes.Systems
) -> None:
    task_id = to_approval(eng)
    call_ = prepared(eng, task_id)
    assert call_["tool"] == "payments_refund" and call_["required_role"] == "refund_approver"
    assert call_["arguments"] == {
        "order_id": "O-1001",
        "amount": 12_999,
        "currency": "EUR",
        "reason": "Screen cracked in transit.",
        "evidence_ids": ["EV-1"],
    }
    assert (
        refused(lambda: eng.approve(task_id, actor="bob", prepared_digest=call_["digest"])).code
        is Code.APPROVAL_FORBIDDEN
    )  # no role
    assert books.payments.requests() == []

    approve(eng, task_id)
    assert eng.run(task_id).state == "completed"

    assert steps(eng, task_id) == [
        ("ann", "start", "collecting_information"),
        ("model", "query_order", "looking_up_order"),
        ("system", "call", "looking_up_order"),
        ("system", "succeeded", "collecting_information"),
        ("model", "assess_eligibility", "eligible"),
        ("model", "repair", "eligible~force"),
        ("model", "propose_refund", "awaiting_approval"),
        ("dana", "approve", "executing"),
        ("system", "call", "executing"),
        ("system", "succeeded", "completed"),
    ]
    events = eng.history(task_id)
    repair = events[5].data["turn"]
    assert repair["code"] == "DOMAIN_INVALID"
    assert [e["msg"] for e in repair["errors"]] == [
        "within_refundable_balance: amount 15000 exceeds the refundable balance of order O-1001: 12999 EUR "
        "(minor units)"
    ]
    assert events[7].data["approval"] == {
        "actor": "dana",
        "role": "refund_approver",
        "decision": "approve",
        "comment": "photo checked",
        "digest": call_["digest"],
    }
    assert events[8].data["intent"]["action_id"] == call_["action_id"]
    receipt = events[9].data["outcome"]["result"]
    assert receipt == {
        "refund_id": f"re_{call_['action_id'][:12]}",
        "order_id": "O-1001",
        "amount": 12_999,
        "currency": "EUR",
    }
    assert books.payments.executions() == {call_["action_id"]: 1}
    assert [r["result"] for r in books.payments.requests()] == ["executed"]
    assert books.orders.get("O-1001").refundable == 0


def test_the_refused_amount_is_fed_back_to_the_model_before_it_repairs(eng: Engine) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="damaged"),
            refund(15_000),
            refund(12_000),
        ],
        profile="anthropic",
    )
    eng.run(task_id, model=model)
    repaired = model.requests[-1]
    feedback = [m.content for m in repaired.messages if m.role == "tool"]
    assert len(feedback) == 1 and "DOMAIN_INVALID" in feedback[0] and "12999 EUR" in feedback[0]
    assert '<tool_result name="query_order"' in repaired.messages[1].content  # the looked-up order, as data


def test_whoever_started_the_task_may_not_approve_it_by_any_path(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng, starter="dana")  # dana holds refund_approver, but started this task
    digest = prepared(eng, task_id)["digest"]
    assert refused(lambda: eng.approve(task_id, actor="dana", prepared_digest=digest)).code is Code.APPROVAL_FORBIDDEN
    assert refused(lambda: eng.fire(task_id, "approve", actor="dana")).code is Code.APPROVAL_FORBIDDEN
    assert refused(lambda: eng.approve(task_id, actor="erin", prepared_digest="0" * 64)).code is Code.APPROVAL_STALE
    assert eng.get(task_id).state == "awaiting_approval" and books.payments.requests() == []
    approve(eng, task_id, approver="erin")
    assert eng.run(task_id).state == "completed"
    assert [e.actor for e in eng.history(task_id) if e.trigger == "approve"] == ["erin"]


# -- the guards -----------------------------------------------------------------------------------------------


def eligible_on(eng: Engine, order_id: str) -> Any:
    """A task in `eligible` whose model looked `order_id` up (for C-100)."""
    task_id = eng.start("refund", {**DAMAGED, "order_id": order_id}, actor="ann", version=1)
    model = ScriptedModel(
        [call("query_order", order_id=order_id), call("assess_eligibility", order_id=order_id, finding="looked at it")],
        profile="anthropic",
    )
    return eng.run(task_id, model=model, max_turns=3)  # the two turns and the lookup: it stops in `eligible`


@pytest.mark.parametrize(
    ("order_id", "proposal", "reason"),
    [
        (
            "O-1002",
            {"amount": 2_501},
            "within_refundable_balance: amount 2501 exceeds the refundable balance of order "
            "O-1002: 2500 EUR (minor units)",
        ),
        ("O-1002", {"amount": 0}, "amount_is_positive: the amount must be at least 1 minor unit"),
        ("O-1003", {"currency": "EUR"}, "currency_matches: order O-1003 was paid in USD, not EUR"),
        (
            "O-1001",
            {"evidence_ids": ["EV-1", "EV-3", "EV-99"]},
            "evidence_exists: no evidence EV-3, EV-99 on order O-1001; it has ['EV-1', 'EV-2']",
        ),
        (
            "O-1001",
            {"order_id": "O-1002"},
            "order_was_looked_up: order O-1002 was not looked up: use query_order on it first",
        ),
    ],
)
def test_each_guard_refuses_with_a_reason_the_model_can_act_on(
    eng: Engine, order_id: str, proposal: dict[str, Any], reason: str
) -> None:
    task = eligible_on(eng, order_id)
    assert task.state == "eligible"
    currency = {"O-1003": "USD"}.get(order_id, "EUR")
    payload = {
        "order_id": order_id,
        "amount": 100,
        "currency": currency,
        "reason": "damaged",
        "evidence_ids": [],
        **proposal,
    }
    with pytest.raises(RailyardError) as caught:
        decide(REFUND_V1, task, "propose_refund", payload, actor="model", by_model=True)
    assert caught.value.code is Code.DOMAIN_INVALID
    assert caught.value.details["reasons"] == [reason]
    decide(
        REFUND_V1,
        task,
        "propose_refund",
        {**payload, "order_id": order_id, "amount": 100, "currency": currency, "evidence_ids": []},
        actor="model",
        by_model=True,
    )  # the repaired proposal passes


def test_another_customers_order_can_be_read_but_not_assessed_or_refunded(eng: Engine) -> None:
    task_id = eng.start("refund", {**DAMAGED, "order_id": "O-2001"}, actor="ann", version=1)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-2001"),
            *[call("assess_eligibility", order_id="O-2001", finding="torn packaging")] * 4,
        ],
        profile="anthropic",
    )
    eng.run(task_id, model=model, max_turns=12)
    assert eng.get(task_id).state == "needs_human"  # the agent kept trying: after max_repairs a human takes over
    codes = [e.data["turn"]["code"] for e in eng.history(task_id) if e.trigger in ("repair", "hand_off")]
    assert codes == ["DOMAIN_INVALID", "DOMAIN_INVALID", "DOMAIN_INVALID", "REPAIRS_EXHAUSTED"]
    assert "order O-2001 belongs to another customer" in str(eng.history(task_id)[5].data["turn"]["errors"])


def test_schema_limits_reason_and_evidence_are_schema_errors_not_guards(eng: Engine) -> None:
    task = eligible_on(eng, "O-1001")
    base = {"order_id": "O-1001", "amount": 100, "currency": "EUR", "reason": "damaged", "evidence_ids": []}
    for bad in ({"reason": "x" * 301}, {"evidence_ids": ["EV-1"] * 11}, {"amount": 12.5}, {"currency": "eur"}):
        with pytest.raises(RailyardError) as caught:
            decide(REFUND_V1, task, "propose_refund", {**base, **bad}, actor="model", by_model=True)
        assert caught.value.code is Code.PAYLOAD_INVALID, bad


# -- other paths ----------------------------------------------------------------------------------------------


def test_the_agent_rejects_and_nothing_is_paid(eng: Engine, books: fakes.Systems) -> None:
    task_id = eng.start("refund", {**DAMAGED, "order_id": "O-1003"}, actor="ann", version=1)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1003"),
            call("assess_eligibility", order_id="O-1003", finding="not delivered yet"),
            call("reject", reason="The parcel is still in transit; nothing to refund yet."),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "rejected"
    assert eng.history(task_id)[-1].data["args"] == {"reason": "The parcel is still in transit; nothing to refund yet."}
    assert books.payments.requests() == []


def test_the_approver_rejects_and_nothing_is_paid(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    task = eng.reject(task_id, actor="dana", reason="Photo shows a different item.")
    assert task.state == "rejected"
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger) == ("dana", "reject")
    assert last.data["args"] == {"reason": "Photo shows a different item."}
    assert books.payments.requests() == []


def test_an_approval_nobody_gives_in_48_hours_expires_to_a_human(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    row = eng.store.row(task_id)
    entered = eng.history(task_id)[-1].at
    assert row is not None and row.next_run_at is not None
    assert utc(row.next_run_at) - entered == timedelta(hours=48)
    assert Worker(eng).run_once() == 0  # not due yet
    make_due(eng)
    assert Worker(eng).run_once() == 1
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger, last.from_state, last.to_state) == (
        "system:timer",
        "expired",
        "awaiting_approval",
        "needs_human",
    )
    assert refused(lambda: approve(eng, task_id)).code is Code.TASK_NOT_AWAITING_APPROVAL
    assert books.payments.requests() == []
    assert eng.fire(task_id, "reopen", actor="olga").state == "collecting_information"  # no payment was attempted


def test_the_model_asks_the_customer_and_the_portal_relays_the_answer(eng: Engine, books: fakes.Systems) -> None:
    task_id = eng.start("refund", {"customer_id": "C-100", "message": "I want my money back."}, actor="ann", version=1)
    model = ScriptedModel(
        [call("request_more_info", question="Which order, and can you send a photo?")], profile="anthropic"
    )
    assert eng.run(task_id, model=model).state == "awaiting_customer"
    books.orders.add_evidence("EV-10", "O-1002", "photo", "Wrong colour, second angle.")
    reply = {"message": "Order O-1002, photo uploaded.", "evidence_ids": ["EV-10"]}
    assert refused(lambda: eng.fire(task_id, "customer_replied", reply, actor="bob")).code is Code.FORBIDDEN
    eng.fire(task_id, "customer_replied", reply, actor="portal")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1002"),
            call("assess_eligibility", order_id="O-1002", finding="wrong colour"),
            refund(2_500, order_id="O-1002", evidence_ids=["EV-3", "EV-10"]),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    assert eng.get(task_id).facts["customer_replied"] == reply


# -- failures of the payment provider -------------------------------------------------------------------------


def test_a_reply_lost_after_paying_leaves_the_outcome_unknown_and_a_retry_never_pays_twice(
    eng: Engine, books: fakes.Systems
) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    task = eng.run(task_id)
    assert task.state == "retryable_failure"
    outcome = eng.history(task_id)[-1].data["outcome"]
    assert (outcome["outcome"], outcome["code"]) == ("unknown", "TOOL_REMOTE_ERROR")
    action_id = prepared(eng, task_id)["action_id"]
    assert books.payments.executions() == {action_id: 1}  # it did pay: only the answer was lost
    assert refused(lambda: eng.fire(task_id, "retry_refund", actor="bob")).code is Code.FORBIDDEN
    eng.fire(task_id, "retry_refund", actor="olga")
    assert eng.run(task_id).state == "completed"
    events = eng.history(task_id)
    # The retry asked the provider what became of the action id before sending anything: it was paid.
    assert [
        e.data["intent"]["action_id"]
        for e in events
        if e.trigger == "call" and e.data["intent"]["tool"] == "payments_refund"
    ] == [action_id]
    assert (events[-1].trigger, events[-1].data.get("reconciled")) == ("succeeded", True)
    assert [r["result"] for r in books.payments.requests(action_id)] == ["executed"]
    assert books.payments.executions() == {action_id: 1}
    assert books.orders.get("O-1001").refunded == 12_999


def test_a_provider_that_declines_fails_the_call_and_a_human_settles_it(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", "remote_error")
    assert eng.run(task_id).state == "retryable_failure"
    outcome = eng.history(task_id)[-1].data["outcome"]
    assert (outcome["outcome"], outcome["code"]) == ("failed", "TOOL_REMOTE_ERROR")
    assert books.payments.executions() == {}
    eng.fire(task_id, "give_up", actor="olga")
    assert refused(lambda: eng.fire(task_id, "reopen", actor="olga")).code is Code.DOMAIN_INVALID
    closed = eng.fire(task_id, "close", {"reason": "Refunded by bank transfer instead."}, actor="olga")
    assert closed.state == "rejected"


def test_a_provider_that_never_answers_is_unknown_and_the_retry_pays_once(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    books.arm("payments.refund", "timeout")
    assert eng.run(task_id).state == "retryable_failure"
    outcome = eng.history(task_id)[-1].data["outcome"]
    assert (outcome["outcome"], outcome["code"]) == ("unknown", "TOOL_TIMEOUT")
    eng.fire(task_id, "retry_refund", actor="otto")
    # The timed-out call may still land: nothing is asked or sent until it cannot.
    assert refused(lambda: eng.run(task_id)).code is Code.OUTCOME_UNSETTLED
    time.sleep(SETTLE_SECONDS)
    assert eng.run(task_id).state == "completed"
    action_id = prepared(eng, task_id)["action_id"]
    assert books.payments.executions() == {action_id: 1}
    assert [r["result"] for r in books.payments.requests(action_id)] == ["executed"]


def test_a_worker_that_dies_after_the_provider_paid_is_reconciled_by_action_id(
    eng: Engine, books: fakes.Systems, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.runtime.execute import execute as real_execute

    task_id = to_approval(eng)
    approve(eng, task_id)
    action_id = prepared(eng, task_id)["action_id"]

    def pays_then_dies(tool: Any, call_: Any, acting: Any) -> Any:
        real_execute(tool, call_, acting)  # the provider pays ...
        raise KeyboardInterrupt  # ... and the worker stops before it records the answer

    monkeypatch.setattr("engine.runtime.tool_runner.execute", pays_then_dies)
    with pytest.raises(KeyboardInterrupt):
        eng.run(task_id)
    monkeypatch.undo()
    assert eng.load(task_id).visit["pending"] == action_id
    with pytest.raises(AttemptInFlight):  # the stranded call might still be running: not yet
        eng.run(task_id)
    time.sleep(SETTLE_SECONDS)
    assert eng.run(task_id).state == "completed"
    last = eng.history(task_id)[-1]
    assert (last.trigger, last.data["reconciled"]) == ("succeeded", True)
    result = last.data["outcome"]["result"]
    assert result is not None and result["refund_id"] == f"re_{action_id[:12]}"
    assert [r["result"] for r in books.payments.requests(action_id)] == ["executed"]  # asked, never re-sent
    assert books.payments.executions() == {action_id: 1}


KILLED_WORKER = """
import sys
from engine import Engine, Registry, StaticRoles
from engine import Worker
from tests.support.reference import ROLES
url = sys.argv[1]
with Engine(url, Registry.from_modules(["workflows"]), authoriser=StaticRoles(ROLES)) as engine:
    Worker(engine, name="doomed", lease_seconds=30).run_once()
"""


def test_a_worker_process_killed_mid_refund_is_resumed_by_another_without_paying_twice(
    db_url: str, eng: Engine, books: fakes.Systems
) -> None:
    task_id = to_approval(eng)
    approve(eng, task_id)
    action_id = prepared(eng, task_id)["action_id"]
    books.arm("payments.refund", "crash_after")  # the worker process dies right after the provider paid
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAILYARD_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WORKER, db_url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stderr
    assert books.payments.executions() == {action_id: 1}
    stranded = eng.load(task_id)
    assert (stranded.state, stranded.visit["pending"]) == ("executing", action_id)
    heir = Worker(eng, name="heir")
    assert heir.run_once() == 0  # the dead worker's lease still stands
    expire_leases(eng)
    time.sleep(SETTLE_SECONDS)
    assert heir.run_once() == 1
    assert eng.get(task_id).state == "completed"
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger, last.data["reconciled"]) == ("system:tools", "succeeded", True)
    assert [r["result"] for r in books.payments.requests(action_id)] == ["executed"]
    assert books.payments.executions() == {action_id: 1}


def test_a_read_that_times_out_is_shown_to_the_model_which_reads_again(eng: Engine, books: fakes.Systems) -> None:
    books.arm("orders.get", "timeout")
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    model = ScriptedModel([call("query_order", order_id="O-1001")] * 2, profile="anthropic")
    eng.run(task_id, model=model, max_turns=6)
    assert [t for _, t, _ in steps(eng, task_id)][:7] == [
        "start",
        "query_order",
        "call",
        "failed",
        "query_order",
        "call",
        "succeeded",
    ]
    failed = next(e for e in eng.history(task_id) if e.trigger == "failed")
    assert failed.data["outcome"]["code"] == "TOOL_TIMEOUT"
    assert '"error": "TOOL_TIMEOUT"' in model.requests[1].messages[1].content


# -- refund@2 -------------------------------------------------------------------------------------------------


def test_refund_v2_adds_one_rule_and_keeps_every_state_of_v1(eng: Engine) -> None:
    assert {s.name for s in REFUND_V1.all_states} == {s.name for s in REFUND_V2.all_states}
    assert eng.registry.get("refund").ref == "refund@2"  # new tasks start on the newest version

    over_half = refund(10_000)  # of 12,999
    v1 = to_approval(eng, amount=10_000, version=1)
    assert "category" not in prepared(eng, v1)["arguments"]

    task_id = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="damaged"),
            over_half,
            refund(10_000, category="goodwill"),
            refund(10_000, category="damaged"),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    errors = [e.data["turn"]["errors"][0]["msg"] for e in eng.history(task_id) if e.trigger == "repair"]
    assert (
        errors
        == [
            "large_refunds_name_a_category: a refund above 50% of the order total (12999) needs a "
            "category: damaged, not_delivered or wrong_item"
        ]
        * 2
    )
    assert prepared(eng, task_id)["arguments"]["category"] == "damaged"
    assert eng.load(task_id).version == 2 and eng.load(v1).version == 1

    small = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="goodwill"),
            refund(1_000, category="goodwill"),
        ],
        profile="anthropic",
    )
    assert eng.run(small, model=model).state == "awaiting_approval"  # a small goodwill refund needs no category
