"""Crash and resume at scale (PostgreSQL): worker processes SIGKILLed at random while 200 tasks run
read and write tool steps. Nothing is lost, nothing is paid twice, every log holds together."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from engine import Engine, Registry, verify_chain
from tests.support.shop import ROLES, Ledger, make_auto_workflow
from tests.support.stores import sql_store

REPO = Path(__file__).resolve().parent.parent
TASKS = 200

WORKER = """
import sys, threading, signal
from engine import Engine, Registry, StaticRoles
from engine import Worker
from tests.support.shop import ROLES, ClerkModel, Ledger, make_auto_workflow
url, ledger_path, name = sys.argv[1:4]
engine = Engine(url, Registry([make_auto_workflow(Ledger(ledger_path))]), authoriser=StaticRoles(ROLES))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
Worker(engine, name=name, concurrency=4, lease_seconds=2, poll_seconds=0.05, model=ClerkModel()).run(stop)
"""


def test_workers_killed_at_random_lose_nothing_and_pay_once(pg_database: str, tmp_path: Path) -> None:
    from engine import StaticRoles
    from tests.support.postgres import truncate as _truncate

    _truncate(pg_database)
    ledger = Ledger(tmp_path / "ledger.db")
    registry = Registry([make_auto_workflow(ledger)])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(7)
    with Engine(pg_database, registry, authoriser=StaticRoles(ROLES)) as eng:
        task_ids = [eng.start("shop_auto", {"customer": "c1"}, actor="ann") for _ in range(TASKS)]

        def spawn(n: int) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-c", WORKER, pg_database, ledger.path, f"w{n}"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )

        workers = [spawn(n) for n in range(4)]
        spawned, kills = 4, 0
        started = time.monotonic()
        while time.monotonic() - started < 150:
            with sql_store(eng).engine.connect() as conn:
                open_tasks = conn.execute(text("SELECT count(*) FROM tasks WHERE status <> 'terminal'")).scalar()
            if open_tasks == 0:
                break
            time.sleep(rng.uniform(0.2, 0.5))
            if kills < 12:
                victim = rng.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=30)
                kills += 1
                workers[victim] = spawn(spawned)
                spawned += 1
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=60)

        assert kills >= 1
        states = {t: eng.get(t).state for t in task_ids}
        assert set(states.values()) == {"completed"}, {s for s in states.values()}
        executions = ledger.executions()
        for task_id in task_ids:
            events = eng.history(task_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert verify_chain(events) == []
            refund = next(e for e in events if e.trigger == "propose_refund")
            assert executions.get(refund.data["prepared"]["action_id"]) == 1, [(e.seq, e.trigger) for e in events]
        assert len(executions) == TASKS and set(executions.values()) == {1}
        with sql_store(eng).engine.connect() as conn:
            held = conn.execute(text("SELECT count(*) FROM tasks WHERE lease_owner IS NOT NULL")).scalar()
        assert held == 0
