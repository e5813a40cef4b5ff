"""`railyard demo` on both databases: its three scenarios leave the logs they claim to, and replay verifies them.

The assertions read the task logs and the fake provider's books, never the printed text.
"""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from engine import Engine, Registry
from tests.support.payloads import undeclared
from tests.support.reference import steps
from workflows import fakes
from workflows.demo import run_demo


def test_the_demo_scenarios(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAILYARD_WORKFLOWS", raising=False)  # the demo runs the project's own workflows
    console = Console(file=io.StringIO(), width=120)
    started = time.monotonic()
    tasks = run_demo(db_url, console)
    assert time.monotonic() - started < 30
    books = fakes.systems(db_url)
    with Engine(db_url, Registry.from_env()) as eng:
        refund = [(trigger, to) for _, trigger, to in steps(eng, tasks.refund)]
        assert refund == [
            ("start", "collecting_information"),
            ("query_order", "looking_up_order"),
            ("call", "looking_up_order"),
            ("succeeded", "collecting_information"),
            ("assess_eligibility", "eligible"),
            ("repair", "eligible~force"),
            ("propose_refund", "awaiting_approval"),
            ("approve", "executing"),
            ("call", "executing"),
            ("succeeded", "completed"),
        ]
        history = eng.history(tasks.refund)
        assert history[5].data["turn"]["code"] == "DOMAIN_INVALID"  # the amount over the balance, repaired
        assert history[7].actor == "dana"  # bob's attempt was refused and left no event
        ticket = eng.history(tasks.ticket)
        assert [e.trigger for e in ticket] == ["start", "query_ticket", "call", "succeeded", "repair", "decide"]
        assert ticket[4].data["turn"]["code"] == "NO_ACTION" and ticket[-1].to_state == "human_queue"
        crashed = eng.history(tasks.crashed_refund)
        assert [(e.trigger, e.to_state) for e in crashed[-3:]] == [
            ("approve", "executing"),
            ("call", "executing"),
            ("succeeded", "completed"),
        ]
        assert crashed[-1].data["reconciled"] is True  # settled from the provider, not paid again
        for task_id in (tasks.refund, tasks.crashed_refund):
            action_id = eng.load(task_id).prepared["action_id"]  # type: ignore[index]
            assert books.payments.executions()[action_id] == 1
        assert all(eng.replay(t).ok for t in (tasks.refund, tasks.ticket, tasks.crashed_refund))
        for task_id in (tasks.refund, tasks.ticket, tasks.crashed_refund):
            assert undeclared(eng.history(task_id)) == []
