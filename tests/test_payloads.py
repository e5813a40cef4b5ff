"""The declared event payloads: the conformance check catches what it must, and one summary and one code per event.

Which code an event carries and how it reads in one line are decided once (`event_code`, `summarise`): the CLI's
history, the API's timeline, the demo and the transition log all show these, so they are tested here on the
kinds of step a user meets.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from engine import Event, event_code, summarise
from engine.core.payloads import as_event_data
from tests.support.payloads import undeclared


def event(trigger: str, data: dict[str, Any], actor: str = "system:tools", seq: int = 2) -> Event:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return Event("t-1", seq, at, actor, "a", trigger, "b", as_event_data(data), "0" * 64, "0" * 64)


INTENT = {
    "task_id": "t-1",
    "action_id": "a" * 32,
    "tool": "refund_payment",
    "kind": "write",
    "arguments": {"amount": 300},
    "catalog": "shop",
    "catalog_digest": "d" * 64,
    "policy_version": "1",
    "required_role": None,
    "digest": "e" * 64,
}


def test_the_check_reports_undeclared_keys_wrong_types_and_missing_fields() -> None:
    assert undeclared([event("call", {"intent": INTENT, "attempt": 1, "requested_at": "2026-01-01T00:00:00Z"})]) == []
    assert undeclared([event("note", {"mood": "happy"})]) == ["t-1#2 note: data.mood is not declared"]
    assert undeclared([event("call", {"attempt": "one"})]) == ["t-1#2 call: data.attempt is not an integer"]
    partial = {k: v for k, v in INTENT.items() if k != "digest"}
    assert undeclared([event("call", {"intent": partial})]) == ["t-1#2 call: data.intent.digest is missing"]
    assert undeclared([event("reconcile", {"reconciled": {"outcome": "maybe", "action_id": "a"}})]) != []
    assert undeclared([event("limit", {"budget": "coffee"})]) != []


@pytest.mark.parametrize(
    ("trigger", "data", "code", "summary"),
    [
        ("start", {"workflow": "refund@2", "digest": "d", "input": {"order": "O-1"}}, None, '{"order": "O-1"}'),
        (
            "repair",
            {
                "turn": {
                    "strategy": "required",
                    "model": "m",
                    "profile": "p",
                    "thinking": False,
                    "mode": "tool",
                    "code": "NO_ACTION",
                }
            },
            "NO_ACTION",
            "model turn (required): NO_ACTION",
        ),
        (
            "repair",
            {
                "turn": {
                    "strategy": "native_schema",
                    "model": "m",
                    "profile": "p",
                    "thinking": False,
                    "mode": "structured",
                    "code": "OUTPUT_NOT_JSON",
                    "escalated": {"from": "native_schema", "to": "required", "step": "rung", "why": "OUTPUT_NOT_JSON"},
                }
            },
            "OUTPUT_NOT_JSON",
            "model turn (native_schema): OUTPUT_NOT_JSON; escalates to required",
        ),
        (
            "call",
            {"intent": INTENT, "attempt": 2, "requested_at": "2026-01-01T00:00:00Z"},
            None,
            'call refund_payment {"amount": 300} (attempt 2, action aaaaaaaaaaaa)',
        ),
        (
            "failed",
            {
                "outcome": {
                    "outcome": "failed",
                    "result": None,
                    "code": "TOOL_TIMEOUT",
                    "message": "slow",
                    "duration_ms": 5,
                },
                "tool_result": {"tool": "refund_payment", "error": {"code": "TOOL_TIMEOUT", "message": "slow"}},
            },
            "TOOL_TIMEOUT",
            "refund_payment: failed",
        ),
        (
            "succeeded",
            {
                "outcome": {
                    "outcome": "succeeded",
                    "result": {"id": 7},
                    "code": None,
                    "message": None,
                    "duration_ms": 1,
                },
                "tool_result": {"tool": "refund_payment", "result": {"id": 7}},
                "reconciled": True,
            },
            None,
            'refund_payment: succeeded, recovered by reconciliation {"id": 7}',
        ),
        (
            "limit",
            {"code": "AGENT_STEP_LIMIT_EXCEEDED", "budget": "model_turns", "used": 5, "limit": 5},
            "AGENT_STEP_LIMIT_EXCEEDED",
            "budget model_turns ran out (used 5 of 5)",
        ),
        ("cancel_requested", {"args": {"reason": "withdrawn"}}, None, "cancel requested by ann: withdrawn"),
    ],
)
def test_each_kind_of_step_has_one_code_and_one_summary(
    trigger: str, data: dict[str, Any], code: str | None, summary: str
) -> None:
    step = event(trigger, data, actor="ann" if trigger == "cancel_requested" else "system:tools")
    assert undeclared([step]) == []
    assert event_code(step.data) == code
    assert summarise(step) == summary


def test_the_log_summary_names_the_step_and_never_its_values() -> None:
    secret = {"intent": {**INTENT, "arguments": {"card": "4111 1111"}}, "attempt": 1, "requested_at": "x"}
    line = summarise(event("call", secret), values=False)
    assert line == f"call refund_payment (attempt 1, action {'a' * 12})" and "4111" not in line
    started = event("start", {"workflow": "refund@2", "digest": "d", "input": {"email": "ann@example.com"}}, seq=1)
    assert summarise(started, values=False) == "started on refund@2"
    approval = {
        "approval": {
            "actor": "dana",
            "role": "approver",
            "decision": "approve",
            "comment": "call me at 555",
            "digest": None,
        }
    }
    assert summarise(event("approve", approval, actor="dana"), values=False) == "approve by dana as approver"
    assert summarise(event("note", {"args": {"note": "private"}}), values=False) == ""


def test_a_summary_is_cut_to_the_width_asked_for() -> None:
    long = event("note", {"args": {"note": "x" * 500}})
    assert len(summarise(long, 60)) == 60 and summarise(long, 60).endswith("…")
