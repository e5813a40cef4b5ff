"""Fan-out of 100 children worked by 4 worker processes, on SQLite and PostgreSQL: the joins on all, any and a
quorum come out right and no item's child is started twice; and a worker SIGKILLed amid the fan-out (some children
made, the rest not) or before the join is recorded leaves exactly one child per item and a batch that ends.

The SIGKILL points are played `FANOUT_CRASH_ROUNDS` times each (default 1), each round with a fresh batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine import Engine, Registry, Worker
from engine.core.errors import RailyardError
from engine.core.fanout import item_action_id
from tests.support import fanout_workflows as fw
from tests.support.fanout_worker import POINTS
from tests.support.reference import expire_leases

REPO = Path(__file__).resolve().parent.parent
N = 100
ROUNDS = int(os.environ.get("FANOUT_CRASH_ROUNDS", "1"))
ORDERS = [f"O-{i}" for i in range(N)]


def environment(db_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_WORKFLOWS": "tests.support.fanout_workflows",
        "RAILYARD_CHILD_RECHECK_SECONDS": "1",
    }


@contextmanager
def workers(db_url: str, count: int = 4) -> Iterator[None]:
    """`count` worker processes, stopped (and if need be killed) on the way out."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.fanout_worker", f"w{i}"],
            env=environment(db_url),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def wait_for(check: Callable[[], bool], seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def one_child_per_item(eng: Engine, parent_id: str, workflow: str) -> list[str]:
    """Exactly one child per item's action id, and none besides: the children in the order of the items."""
    found = fw.checks_of(eng, parent_id, workflow)
    spawns = [e for e in eng.history(parent_id) if e.trigger == "spawn"]
    assert len(spawns) == 1
    base = spawns[0].data["fan_out"]["action_id"]
    assert sorted(found) == sorted(item_action_id(base, i) for i in range(N))
    assert all(len(ids) == 1 for ids in found.values())
    return [found[item_action_id(base, i)][0] for i in range(N)]


def fire(eng: Engine, task_id: str, trigger: str) -> None:
    """A person's verdict on a check; one the batch already cancelled (its join decided) is left as it is."""
    try:
        eng.fire(task_id, trigger, actor="bob")
    except RailyardError:
        assert eng.load(task_id).state == "cancelled"


def test_100_children_under_4_worker_processes_join_on_all_any_and_quorum(db_url: str) -> None:
    with Engine(db_url, Registry(fw.WORKFLOWS)) as eng, workers(db_url):
        every = eng.start("batch", {"orders": ORDERS}, actor="ann")
        anyone = eng.start("batch_any", {"orders": ORDERS}, actor="ann")
        quorum = eng.start("batch_quorum", {"orders": ORDERS}, actor="ann")
        wait_for(lambda: all(eng.load(p).seq >= 3 for p in (anyone, quorum)))  # their checks exist, and wait
        slow_any = one_child_per_item(eng, anyone, "slow_check")
        slow_quorum = one_child_per_item(eng, quorum, "slow_check")
        for i in range(N - 1):
            fire(eng, slow_any[i], "fail")  # any: 99 failures do not fail it while one may pass
        assert eng.load(anyone).state == "checking"
        fire(eng, slow_any[N - 1], "pass")
        for i in range(N):
            fire(eng, slow_quorum[i], "pass" if i % 2 == 0 else "fail")  # 50 of 100 pass: a quorum of 50
        wait_for(lambda: all(eng.load(p).terminal for p in (every, anyone, quorum)))

        assert eng.load(every).state == "accepted"
        children = one_child_per_item(eng, every, "check")
        joined = eng.load(every).facts["children:checking"]["children"]
        assert [c["task_id"] for c in joined] == children
        assert [c["result"] for c in joined] == [{"state": "passed", "order": o} for o in ORDERS]

        assert eng.load(anyone).state == "accepted"
        assert [c["state"] for c in eng.load(anyone).facts["children:checking"]["children"]] == [
            *["failed"] * (N - 1),
            "passed",
        ]

        assert eng.load(quorum).state == "accepted"
        ends = [c["state"] for c in eng.load(quorum).facts["children:checking"]["children"]]
        assert ends[0::2] == ["passed"] * 50
        assert set(ends[1::2]) <= {"failed", "cancelled"}
        for parent_id in (every, anyone, quorum):
            assert eng.replay(parent_id).ok, eng.replay(parent_id).findings
        assert all(eng.replay(c).ok for c in children)


@pytest.mark.parametrize("point", POINTS)
def test_a_worker_killed_amid_a_fan_out_leaves_one_child_per_item_and_a_batch_that_ends(
    db_url: str, point: str
) -> None:
    with Engine(db_url, Registry(fw.WORKFLOWS)) as eng:
        for _ in range(ROUNDS):
            parent_id = eng.start("batch", {"orders": ORDERS}, actor="ann")
            doomed = subprocess.run(
                [sys.executable, "-m", "tests.support.fanout_worker", "doomed", point],
                env=environment(db_url),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert doomed.returncode == -signal.SIGKILL, doomed.stderr[-2000:]
            triggers = [e.trigger for e in eng.history(parent_id)]
            if point == "amid_the_children":
                assert triggers == ["start", "spawn"]  # some children made, no `spawned`
                assert 0 < len(fw.checks_of(eng, parent_id)) < N
            else:
                assert triggers == ["start", "spawn", "spawned"]
            expire_leases(eng)
            heir = Worker(eng, name="heir", listen=False, poll_seconds=0.05)
            deadline = time.monotonic() + 120
            while not eng.load(parent_id).terminal and time.monotonic() < deadline:
                expire_leases(eng)
                heir.drain()
                time.sleep(0.1)
            assert eng.load(parent_id).state == "accepted", [(e.trigger, e.to_state) for e in eng.history(parent_id)]
            children = one_child_per_item(eng, parent_id, "check")
            assert [e.trigger for e in eng.history(parent_id)] == ["start", "spawn", "spawned", "child_joined"]
            assert eng.replay(parent_id).ok, eng.replay(parent_id).findings
            assert all(eng.replay(c).ok for c in children)
