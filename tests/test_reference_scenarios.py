"""The showcase scenarios of the reference workflows, with the scripts in `workflows.scripts`, on both databases:
a refund repaired, approved and paid once; a ticket forced from prose into a decision; a `railyard worker`
process killed mid-refund and another worker finishing the task without paying twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import Engine, ScriptedModel, Worker
from tests.support import reference
from tests.support.reference import expire_leases, steps
from workflows import fakes
from workflows.refund_tools import SETTLE_SECONDS
from workflows.scripts import (
    REFUND_DAMAGED_ORDER_INPUT,
    TICKET_DOUBLE_CHARGE,
    TICKET_DOUBLE_CHARGE_INPUT,
    refund_damaged_order,
)

REPO = Path(__file__).resolve().parent.parent

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def to_approved_refund(eng: Engine, version: int) -> str:
    task_id = eng.start("refund", REFUND_DAMAGED_ORDER_INPUT, actor="portal", version=version)
    assert eng.run(task_id, model=ScriptedModel(refund_damaged_order(version))).state == "awaiting_approval"
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"], comment="Photos match the claim.")
    return task_id


@pytest.mark.parametrize("version", [1, 2])
def test_the_refund_script_is_repaired_approved_and_paid_once(eng: Engine, books: fakes.Systems, version: int) -> None:
    task_id = to_approved_refund(eng, version)
    assert eng.run(task_id).state == "completed"
    assert [(t, s) for _, t, s in steps(eng, task_id)] == [
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
    assert eng.history(task_id)[5].data["turn"]["code"] == "DOMAIN_INVALID"
    assert list(books.payments.executions().values()) == [1]


def test_the_ticket_script_is_forced_from_prose_to_an_escalation(eng: Engine) -> None:
    task_id = eng.start("ticket_triage", TICKET_DOUBLE_CHARGE_INPUT, actor="helpdesk")
    assert eng.run(task_id, model=ScriptedModel(TICKET_DOUBLE_CHARGE)).state == "human_queue"
    repair = next(e for e in eng.history(task_id) if e.trigger == "repair")
    assert (repair.from_state, repair.data["turn"]["code"]) == ("deciding", "NO_ACTION")
    assert eng.history(task_id)[-1].data["args"]["decision"] == "ESCALATE"


def test_a_railyard_worker_killed_mid_refund_is_finished_by_another_without_paying_twice(
    db_url: str, eng: Engine, books: fakes.Systems, tmp_path: Path
) -> None:
    task_id = to_approved_refund(eng, 2)
    books.arm("payments.refund", "crash_after")  # the worker dies after the provider paid, before it records it
    exe = str(Path(sys.executable).with_name("railyard"))
    silent = tmp_path / "silent.json"  # the task needs no model turn; a worker serving agent states needs a model
    silent.write_text('{"turns": []}')
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_MODEL": f"scripted:{silent}",
    }
    env.pop("RAILYARD_WORKFLOWS", None)  # the default: the project's `workflows` package
    done = subprocess.run(
        [exe, "worker", "--once", "--lease-seconds", "2"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, done.stderr
    action_id = eng.load(task_id).visit["pending"]
    assert books.payments.executions() == {action_id: 1}
    expire_leases(eng)
    time.sleep(SETTLE_SECONDS)
    assert Worker(eng, name="heir").run_once() == 1
    assert eng.get(task_id).state == "completed"
    last = eng.history(task_id)[-1]
    assert (last.trigger, last.data["reconciled"]) == ("succeeded", True)
    assert [r["result"] for r in books.payments.requests(action_id)] == ["executed"]
