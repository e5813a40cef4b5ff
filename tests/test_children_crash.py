"""SIGKILL at each point of the child protocol, on SQLite and PostgreSQL, with real worker processes: exactly one
child per action id, and the parent always resumes and ends where its child's end routes it.

Each point is played `CHILD_CRASH_ROUNDS` times (default 3; the issue's acceptance run is 20:
`CHILD_CRASH_ROUNDS=20 pytest tests/test_children_crash.py`), each round with a fresh parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import Engine, Registry, Worker
from engine.core.children import child_task_id
from tests.support import child_workflows
from tests.support.child_crash import POINTS
from tests.support.child_workflows import children_of
from tests.support.reference import expire_leases

REPO = Path(__file__).resolve().parent.parent
ROUNDS = int(os.environ.get("CHILD_CRASH_ROUNDS", "3"))
#: The doomed worker puts a waiting parent's next look off by this much; the heir waits it out when a wake-up was lost.
RECHECK_SECONDS = "2"


@pytest.mark.parametrize("point", POINTS)
def test_a_worker_killed_at_each_point_of_the_child_protocol_leaves_one_child_and_a_parent_that_resumes(
    db_url: str, point: str
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_WORKFLOWS": "tests.support.child_workflows",
        "RAILYARD_CHILD_RECHECK_SECONDS": RECHECK_SECONDS,
    }
    with Engine(db_url, Registry(child_workflows.WORKFLOWS)) as eng:
        for _ in range(ROUNDS):
            parent_id = eng.start("claim", {"order": "O-9", "amount": 12}, actor="ann")
            doomed = subprocess.run(
                [sys.executable, "-m", "tests.support.child_crash", point],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert doomed.returncode == -signal.SIGKILL, doomed.stderr[-2000:]
            expire_leases(eng)
            heir = Worker(eng, name="heir", listen=False, poll_seconds=0.05)
            deadline = time.monotonic() + 60
            while not eng.load(parent_id).terminal and time.monotonic() < deadline:
                expire_leases(eng)
                heir.drain()
                time.sleep(0.1)
            parent = eng.load(parent_id)
            assert parent.state == "closed", [(e.trigger, e.to_state) for e in eng.history(parent_id)]
            spawn = next(e for e in eng.history(parent_id) if e.trigger == "spawn")
            action_id = spawn.data["child"]["action_id"]
            assert children_of(eng, parent_id) == [child_task_id(parent_id, action_id)]
            assert [e.trigger for e in eng.history(parent_id)].count("spawn") == 1
            assert eng.history(parent_id)[-1].data["child"]["result"] == {"state": "paid", "paid": 12}
            assert eng.replay(parent_id).ok
            assert eng.replay(children_of(eng, parent_id)[0]).ok
