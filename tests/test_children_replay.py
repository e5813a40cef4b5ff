"""Replay checks the links between a parent and its children both ways: a forged link is a finding with its code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from engine import Engine, Registry, StaticRoles, Worker
from engine.core import commands
from engine.core.canonical import now
from engine.core.errors import Code
from tests.support import child_workflows
from tests.support.child_workflows import children_of
from tests.support.insider import forge, tamper

ORDER = {"order": "O-5", "amount": 30}
REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))


@pytest.fixture
def family(db_url: str) -> Iterator[Engine]:
    registry = Registry([child_workflows.payout(quick=False), child_workflows.claim(deadline=timedelta(hours=1))])
    eng = Engine(db_url, registry, authoriser=StaticRoles({"bob": set()}))
    yield eng
    eng.close()


def waiting_parent(eng: Engine) -> tuple[str, str]:
    parent_id = eng.start("claim", ORDER, actor="ann")
    eng.run(parent_id)
    [child_id] = children_of(eng, parent_id)
    return parent_id, child_id


def codes(eng: Engine, task_id: str) -> list[Code]:
    return [f.code for f in eng.replay(task_id).findings]


def test_a_clean_tree_replays_clean_both_ways(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    family.fire(child_id, "pay", {"paid": 30}, actor="bob")
    Worker(family, listen=False).drain()
    assert family.load(parent_id).state == "closed"
    assert codes(family, parent_id) == [] and codes(family, child_id) == []


def test_a_child_whose_parent_does_not_start_it_is_a_link_mismatch(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    parent = family.load(parent_id)
    record = dict(parent.visit["child"])
    record["task_id"] = str(uuid.uuid4())  # a second child that claims the same intent
    definition = family.registry.get("payout")
    link = {**family.history(child_id)[0].data["parent"]}
    forged = commands.start_child(definition, parent, record, link, at=now())  # type: ignore[arg-type]
    family.create(definition, forged)
    assert codes(family, record["task_id"]) == [Code.CHILD_LINK_MISMATCH]
    assert codes(family, child_id) == [] and codes(family, parent_id) == []


def test_a_recorded_result_the_child_never_gave_is_a_result_mismatch(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    family.fire(child_id, "pay", {"paid": 30}, actor="bob")
    child = family.history(child_id)[-1]
    record = family.load(parent_id).visit["child"]
    forge(
        family,
        parent_id,
        trigger="child_paid",
        to_state="closed",
        status="terminal",
        data={
            "child": {
                "task_id": child_id,
                "action_id": record["action_id"],
                "state": "paid",
                "seq": child.seq,
                "hash": child.hash,
                "result": {"state": "paid", "paid": 3000},  # the child paid 30
            }
        },
    )
    assert codes(family, parent_id) == [Code.CHILD_RESULT_MISMATCH]


def test_an_end_recorded_for_a_child_that_is_still_running_is_a_result_mismatch(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    record = family.load(parent_id).visit["child"]
    forge(
        family,
        parent_id,
        trigger="child_declined",
        to_state="refused",
        status="terminal",
        data={
            "child": {
                "task_id": child_id,
                "action_id": record["action_id"],
                "state": "declined",
                "seq": 2,
                "hash": "0" * 64,
                "result": None,
            }
        },
    )
    assert codes(family, parent_id) == [Code.CHILD_RESULT_MISMATCH]


def test_a_child_removed_from_the_database_is_missing_for_its_parent(db_url: str, family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    for table in ("snapshots", "events", "task_fields", "tasks"):
        tamper(db_url, f"DELETE FROM {table} WHERE task_id = :id", id=child_id)
    assert codes(family, parent_id) == [Code.CHILD_MISSING]


def test_a_parent_removed_from_the_database_is_missing_for_its_child(db_url: str, family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    for table in ("snapshots", "events", "task_fields", "tasks"):
        tamper(db_url, f"DELETE FROM {table} WHERE task_id = :id", id=parent_id)
    assert codes(family, child_id) == [Code.CHILD_MISSING]


def test_replay_tree_checks_a_parent_and_its_descendants_and_the_cli_exits_3_on_a_forged_link(
    db_url: str, tmp_path: Path
) -> None:
    with Engine(db_url, Registry(child_workflows.WORKFLOWS)) as eng:
        parent_id = eng.start("claim", ORDER, actor="ann")
        eng.run(parent_id)
        [child_id] = children_of(eng, parent_id)
        time.sleep(0.1)  # the quick payout pays itself once its deadline passed
        Worker(eng, listen=False).drain()
        assert eng.load(parent_id).state == "closed"
        reports = list(eng.audit.replay_tree(parent_id))
        assert [(r.task_id, r.ok) for r in reports] == [(parent_id, True), (child_id, True)]
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RAILYARD_DATABASE_URL": db_url,
            "RAILYARD_WORKFLOWS": "tests.support.child_workflows",
        }
        done = subprocess.run([RAILYARD, "replay", parent_id, "--tree"], env=env, capture_output=True, text=True)
        assert (done.returncode, done.stdout.strip()) == (0, "replayed 2 tasks, 6 events: no findings"), done.stderr
        # A second task forged to claim the same intent is not the parent's child: its own replay finds it.
        parent = eng.load(parent_id)
        spawn = eng.history(parent_id)[1]
        forged_id = str(uuid.uuid4())
        record = {**spawn.data["child"], "task_id": forged_id}
        definition = eng.registry.get("payout")
        link = eng.history(child_id)[0].data["parent"]
        eng.create(definition, commands.start_child(definition, parent, record, link, at=now()))  # type: ignore[arg-type]
        done = subprocess.run([RAILYARD, "replay", forged_id], env=env, capture_output=True, text=True)
        assert done.returncode == 3 and "CHILD_LINK_MISMATCH" in done.stdout, done.stdout + done.stderr
        done = subprocess.run([RAILYARD, "replay", "--all"], env=env, capture_output=True, text=True)
        assert done.returncode == 3 and "CHILD_LINK_MISMATCH" in done.stdout
