"""The operators' commands as pure decisions (`engine.core.commands`): who may migrate and fork, and what each
refuses, decided on a task and its row alone, with no database (a core test)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from engine.core.access import Caller
from engine.core.commands import NewTask, fork_refusal, fork_source_refusal, migrate, start
from engine.core.errors import Code, Refused
from engine.core.task import Status
from workflows import REFUND_V1, REFUND_V2
from workflows.scripts import REFUND_DAMAGED_ORDER_INPUT

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
OLGA = Caller("olga", frozenset({"refund_operator"}))
DANA = Caller("dana", frozenset({"refund_approver"}))
AUDREY = Caller("audrey", frozenset({"auditor"}))
EVERY_STATE = {s.name: s.name for s in REFUND_V1.states}


def started() -> NewTask:
    return start(REFUND_V1, REFUND_DAMAGED_ORDER_INPUT, caller=Caller("portal"), task_id="t-1", at=T0)


def test_an_operator_migrates_to_the_mapped_state_and_the_event_names_both_versions() -> None:
    task = started().task
    decision = migrate(REFUND_V1, REFUND_V2, task, EVERY_STATE, caller=OLGA, reason="refund@2 rolls out")
    assert (decision.trigger, decision.from_state, decision.to_state) == ("migrate", task.state, task.state)
    assert decision.data["from"] == "refund@1" and decision.data["to"] == "refund@2"
    assert (decision.data["to_digest"], decision.data["reason"]) == (REFUND_V2.digest, "refund@2 rolls out")


@pytest.mark.parametrize("caller", [DANA, AUDREY, Caller("bob")], ids=["approver", "auditor", "no-role"])
def test_who_is_not_an_operator_may_not_migrate(caller: Caller) -> None:
    with pytest.raises(Refused) as refused:
        migrate(REFUND_V1, REFUND_V2, started().task, EVERY_STATE, caller=caller, reason="x")
    assert refused.value.code is Code.FORBIDDEN


def test_a_migration_the_map_does_not_allow_is_invalid_whoever_asks() -> None:
    for caller in (OLGA, DANA):
        with pytest.raises(Refused) as refused:
            migrate(REFUND_V1, REFUND_V2, started().task, {"nowhere": "eligible"}, caller=caller, reason="x")
        assert refused.value.code is Code.MIGRATION_INVALID


def test_a_fork_is_refused_from_the_row_alone_unless_an_operator_gives_a_reason_for_an_ended_task() -> None:
    row = started().row
    ended = replace(row, status="terminal", state="rejected", seq=4)
    assert fork_refusal(REFUND_V1, ended, 2, caller=OLGA, reason="try again") is None
    refusals = {
        "no role": fork_refusal(REFUND_V1, ended, 2, caller=DANA, reason="try again"),
        "no reason": fork_refusal(REFUND_V1, ended, 2, caller=OLGA, reason="  "),
        "no such seq": fork_refusal(REFUND_V1, ended, 5, caller=OLGA, reason="try again"),
        "still running": fork_refusal(REFUND_V1, row, 1, caller=OLGA, reason="try again"),
    }
    assert {why: r.code if r else None for why, r in refusals.items()} == {
        "no role": Code.FORBIDDEN,
        "no reason": Code.FORK_INVALID,
        "no such seq": Code.FORK_INVALID,
        "still running": Code.FORK_INVALID,
    }


def test_a_fork_from_a_terminal_state_or_with_a_write_that_could_repeat_is_refused() -> None:
    task = started().task
    assert fork_source_refusal(task, "t-1", None) is None
    could_repeat = fork_source_refusal(task, "t-1", "the log holds write payments_refund, succeeded")
    assert could_repeat is not None and could_repeat.code is Code.WRITE_WOULD_REPEAT
    ended = fork_source_refusal(replace(task, state="rejected", status=Status.TERMINAL), "t-1", None)
    assert ended is not None and ended.code is Code.FORK_INVALID
