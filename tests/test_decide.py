"""`decide` and `fold` are pure: these tests use no database, no clock and no model."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine import Code, Refused, TaskState, decide, fold
from engine.core.canonical import GENESIS_HASH
from engine.core.events import seal
from tests.support.sample_workflows import REFUND_V1

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def started(balance: int = 500) -> TaskState:
    first = seal(
        task_id="t1",
        seq=1,
        at=AT,
        actor="ann",
        from_state=None,
        trigger="start",
        to_state="assessing",
        data={"input": {"customer": "c1", "balance": balance}, "digest": REFUND_V1.digest},
        prev_hash=GENESIS_HASH,
    )
    return fold(REFUND_V1, [first])


def refusal(
    task: TaskState, trigger: str, payload: object, actor: str = "model", roles: frozenset[str] = frozenset()
) -> Code:
    with pytest.raises(Refused) as caught:
        decide(REFUND_V1, task, trigger, payload, actor=actor, roles=roles)  # type: ignore[arg-type]
    return caught.value.code


def test_guards_choose_between_transitions_sharing_a_trigger() -> None:
    task = started()
    small = decide(REFUND_V1, task, "propose", {"amount": 50, "reason": "late"}, actor="model")
    large = decide(REFUND_V1, task, "propose", {"amount": 300, "reason": "late"}, actor="model")
    assert (small.to_state, large.to_state) == ("auto_refund", "awaiting_approval")
    assert large.data["args"] == {"amount": 300, "reason": "late"}
    assert large.data["guards"][-1].endswith("large_amount")


def test_each_check_fails_with_its_own_code() -> None:
    task = started(balance=200)
    assert refusal(task, "approve", {}) is Code.TRIGGER_NOT_ALLOWED
    assert refusal(task, "propose", {"amount": "lots", "reason": "x"}) is Code.PAYLOAD_INVALID
    assert refusal(task, "propose", {"amount": 5, "reason": "x", "customer": "c2"}) is Code.IDENTITY_OVERRIDE
    assert refusal(task, "propose", {"amount": 5, "reason": "x", "extra": 1}) is Code.PAYLOAD_INVALID
    assert refusal(task, "propose", ["not", "an", "object"]) is Code.PAYLOAD_INVALID
    assert refusal(task, "give_up", {"why": "no args allowed"}) is Code.PAYLOAD_INVALID
    assert refusal(task, "propose", {"amount": 900, "reason": "x"}) is Code.DOMAIN_INVALID


def test_role_is_checked_against_the_trusted_roles() -> None:
    task = started()
    waiting = decide(REFUND_V1, task, "propose", {"amount": 300, "reason": "x"}, actor="model")
    from engine.core.fold import apply

    ev = seal(
        task_id="t1",
        seq=2,
        at=AT,
        actor="model",
        from_state=waiting.from_state,
        trigger=waiting.trigger,
        to_state=waiting.to_state,
        data=waiting.data,
        prev_hash=task.last_hash,
    )
    approval = apply(REFUND_V1, task, ev)
    assert refusal(approval, "approve", {}, actor="bob") is Code.FORBIDDEN
    ok = decide(REFUND_V1, approval, "approve", {}, actor="dana", roles=frozenset({"approver"}))
    assert ok.to_state == "executing"


def test_a_terminal_task_refuses_everything() -> None:
    task = started()
    from dataclasses import replace

    from engine import Status

    done = replace(task, state="completed", status=Status.TERMINAL)
    assert refusal(done, "cancel", {"reason": "x"}) is Code.TASK_TERMINAL


def test_payload_errors_name_fields_not_values() -> None:
    with pytest.raises(Refused) as caught:
        decide(REFUND_V1, started(), "propose", {"amount": "secret-4111", "reason": "x"}, actor="model")
    assert "secret-4111" not in str(caught.value.to_dict())
    assert caught.value.details["errors"][0]["loc"] == ["amount"]
