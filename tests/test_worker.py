"""Workers on SQLite and PostgreSQL: leases with fencing, claims that never overlap, deadlines fired once,
and a killed worker's task resumed by another."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from engine import (
    ANYONE,
    Action,
    Agent,
    Approval,
    Code,
    Engine,
    LeaseLost,
    Registry,
    StaticRoles,
    Terminal,
    Worker,
    Workflow,
)
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall
from engine.runtime.leases import Lease, holding
from tests.support.reference import expire_leases, make_due
from tests.support.sample_workflows import COUNTER, ROLES
from tests.support.shop import ROLES as SHOP_ROLES
from tests.support.shop import SETTLE_SECONDS, Ledger, make_workflow
from tests.support.stores import sql_store

REPO = Path(__file__).resolve().parent.parent

GATED = Workflow(
    name="gated",
    version=1,
    states=[
        Approval(
            "review",
            role="approver",
            deadline=timedelta(hours=1),
            on_expired="expired_out",
            actions=[Action("approve", "done")],
        ),
        Terminal("done"),
        Terminal("expired_out"),
    ],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


class Finisher:
    """A model that always proposes `finish`: each counter task ends in one turn."""

    provider = "scripted"
    model = "finisher"
    profile = "anthropic"

    def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(tool_calls=(ToolCall("c", "finish", "{}"),), finish_reason="tool_calls")


@pytest.fixture
def eng(db_url: str) -> Iterator[Engine]:
    with Engine(db_url, Registry([COUNTER, GATED]), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def test_a_worker_whose_lease_was_taken_over_cannot_append(eng: Engine) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    [first] = eng.store.claim("w1", limit=5, lease_seconds=30)
    assert first.task_id == task_id
    first_epoch = first.epoch
    assert eng.store.claim("w2", limit=5, lease_seconds=30) == []  # held: nobody else gets it
    expire_leases(eng)
    [second] = eng.store.claim("w2", limit=5, lease_seconds=30)
    second_epoch = second.epoch
    assert second_epoch == first_epoch + 1
    task = eng.load(task_id)
    with holding(Lease(task_id, "w1", first_epoch)), pytest.raises(LeaseLost) as caught:
        eng.transition(task, "tick", {"n": 1}, actor="w1")
    assert caught.value.code is Code.LEASE_LOST
    with holding(Lease(task_id, "w2", second_epoch)):
        assert eng.transition(task, "tick", {"n": 2}, actor="w2").seq == 2
    assert [e.actor for e in eng.history(task_id)] == ["ann", "w2"]


def test_a_released_lease_stays_released_on_connections_once_used_in_autocommit(eng: Engine) -> None:
    # Every pooled connection has run under AUTOCOMMIT (as operators' scripts and these tests do); the pool
    # resets such a connection, and a release on it used to be rolled back: the task stayed leased for 30 s.
    task_id = eng.start("counter", {}, actor="ann")
    held = [sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") for _ in range(5)]
    for conn in held:
        conn.execute(text("SELECT 1"))
        conn.close()
    for round_ in range(3):
        [claim] = eng.store.claim("w1", limit=1, lease_seconds=30)
        eng.store.release(task_id, claim.epoch)
        row = eng.store.row(task_id)
        assert row is not None and (row.lease_owner, row.lease_expires_at) == (None, None), round_


def test_workers_at_once_never_run_one_task_twice(eng: Engine) -> None:
    task_ids = [eng.start("counter", {}, actor="ann") for _ in range(24)]
    workers = [Worker(eng, name=f"w{i}", concurrency=3, model=Finisher(), poll_seconds=0.01) for i in range(3)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    for t in threads:
        t.start()
    deadline = threading.Event()
    for _ in range(300):
        if all(eng.get(t).state == "done" for t in task_ids):
            break
        deadline.wait(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    for task_id in task_ids:
        assert [e.trigger for e in eng.history(task_id)] == ["start", "finish"]
    assert sum(w.counts.claimed for w in workers) == 24
    assert sum(w.counts.conflicts + w.counts.lease_losses + w.counts.failures for w in workers) == 0


def test_a_deadline_that_passed_while_no_worker_ran_fires_exactly_once(eng: Engine) -> None:
    task_id = eng.start("gated", {}, actor="ann")
    row = eng.store.row(task_id)
    assert row is not None and row.next_run_at is not None and row.next_run_at > row.created_at
    assert Worker(eng).run_once() == 0  # not due yet
    make_due(eng)
    workers = [Worker(eng, name=f"w{i}") for i in range(3)]
    threads = [threading.Thread(target=w.run_once) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [e.trigger for e in eng.history(task_id)] == ["start", "expired"]
    assert eng.get(task_id).state == "expired_out"
    assert eng.history(task_id)[-1].actor == "system:timer"
    assert Worker(eng).run_once() == 0


def test_a_task_of_a_version_the_worker_lacks_is_left_untouched_while_the_tasks_claimed_with_it_run(
    db_url: str,
) -> None:
    """A claim loads its tasks together; one that cannot be loaded here (pinned to a version this deployment
    lacks) is still met on its own: left as it is, for a worker that has the version, and not counted as its
    failure, while the tasks claimed with it run to their end."""
    newer = Workflow(
        name="counter",
        version=2,
        states=[Agent("counting", actions=[Action("finish", "done")]), Terminal("done")],
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )
    with Engine(db_url, Registry([COUNTER]), authoriser=StaticRoles(ROLES)) as engine:
        counters = [engine.start("counter", {}, actor="ann") for _ in range(3)]
    with Engine(db_url, Registry([COUNTER, newer]), authoriser=StaticRoles(ROLES)) as engine:
        orphan = engine.start("counter", {}, actor="ann")  # on version 2
    with Engine(db_url, Registry([COUNTER]), authoriser=StaticRoles(ROLES)) as engine:
        before = engine.store.events(orphan)
        worker = Worker(engine, name="lacking", model=Finisher(), concurrency=8, listen=False, max_failures=1)
        assert worker.run_once() == 4
        assert engine.store.events(orphan) == before
        row = engine.store.row(orphan)
        assert row is not None and row.lease_owner is None and row.failures == 0
        assert (worker.counts.config_errors, worker.counts.failures) == (1, 0)
        assert [engine.get(task_id).state for task_id in counters] == ["done"] * 3


def test_a_task_that_raises_is_retried_later_and_the_worker_goes_on(eng: Engine) -> None:
    class Broken:
        provider, model, profile = "scripted", "broken", "anthropic"

        def complete(self, request: ModelRequest) -> ModelResponse:
            raise RuntimeError("bug in an adapter")

    good, bad = eng.start("counter", {}, actor="ann"), eng.start("counter", {}, actor="ann")
    worker = Worker(eng, model=Broken(), retry_backoff=3600)
    assert worker.run_once() == 2
    assert worker.counts.failures == 2
    row = eng.store.row(bad)
    assert row is not None and row.next_run_at is not None and row.lease_owner is None
    assert Worker(eng, model=Finisher()).run_once() == 0  # postponed, not lost
    make_due(eng)
    assert Worker(eng, model=Finisher()).run_once() == 2
    assert eng.get(good).state == eng.get(bad).state == "done"
    for task_id in (good, bad):  # the ending append left the row as a release would: free, failures cleared
        row = eng.store.row(task_id)
        assert row is not None and (row.lease_owner, row.lease_expires_at, row.failures) == (None, None, 0)


def test_a_task_that_keeps_raising_is_handed_off_with_internal_error(eng: Engine) -> None:
    class Broken:
        provider, model, profile = "scripted", "broken", "anthropic"

        def complete(self, request: ModelRequest) -> ModelResponse:
            raise RuntimeError("bug in an adapter")

    task_id = eng.start("counter", {}, actor="ann")
    worker = Worker(eng, name="w", model=Broken(), retry_backoff=0, max_failures=3)
    for tries in (1, 2):
        assert worker.run_once() == 1
        row = eng.store.row(task_id)
        assert row is not None and row.failures == tries and eng.get(task_id).state == "counting"
    assert worker.run_once() == 1
    event = eng.history(task_id)[-1]
    assert (event.trigger, event.to_state) == ("limit", "limit_exceeded")
    assert event.data == {"code": "INTERNAL_ERROR", "error": "RuntimeError", "failures": 3}
    assert "bug in an adapter" not in str(event.data)
    assert worker.run_once() == 0  # blocked now: a human decides


KILLED_WORKER = """
import os, sys
from engine import Engine, Registry, StaticRoles
from engine import Worker
from tests.support.shop import ROLES, Ledger, make_workflow
url, ledger_path = sys.argv[1:3]
os.environ["SHOP_KILL_AT"] = "after_call"
engine = Engine(url, Registry([make_workflow(Ledger(ledger_path))]), authoriser=StaticRoles(ROLES))
Worker(engine, name="doomed", lease_seconds=30).run_once()
"""


def test_a_killed_workers_task_is_resumed_by_another_and_pays_once(db_url: str, tmp_path: Path) -> None:
    from engine import ScriptedModel

    ledger = Ledger(tmp_path / "ledger.db")
    with Engine(db_url, Registry([make_workflow(ledger)]), authoriser=StaticRoles(SHOP_ROLES)) as eng:
        task_id = eng.start("shop_refund", {"customer": "c1"}, actor="ann")
        eng.run(
            task_id,
            model=ScriptedModel(
                [
                    {"tool_calls": [{"name": "query_order", "arguments": {"order_id": "O-1"}}]},
                    {
                        "tool_calls": [
                            {
                                "name": "propose_refund",
                                "arguments": {
                                    "order_id": "O-1",
                                    "amount_cents": 1_000,
                                    "currency": "EUR",
                                    "reason": "late",
                                },
                            }
                        ]
                    },
                ],
                profile="anthropic",
            ),
        )
        prepared: Any = eng.load(task_id).prepared
        eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-c", KILLED_WORKER, db_url, ledger.path],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == -9, done.stderr
        row = eng.store.row(task_id)
        assert row is not None and row.lease_owner == "doomed"
        assert Worker(eng, name="heir").run_once() == 0  # the dead worker's lease still stands
        expire_leases(eng)
        heir = Worker(eng, name="heir")
        assert heir.run_once() == 1  # claimed, but the stranded attempt might still run: postponed
        assert eng.get(task_id).state == "executing" and ledger.executions() == {prepared["action_id"]: 1}
        time.sleep(SETTLE_SECONDS)
        assert heir.run_once() == 1
        assert eng.get(task_id).state == "completed"
        assert ledger.executions() == {prepared["action_id"]: 1}
        assert eng.history(task_id)[-1].data["reconciled"] is True


def test_railyard_worker_advances_tasks_and_stops_on_sigterm(tmp_path: Path) -> None:
    import json
    import signal
    import time

    from engine import migrations

    url = f"sqlite:///{tmp_path}/w.db"
    migrations.upgrade(url)
    script = tmp_path / "model.json"
    script.write_text(
        json.dumps({"profile": "anthropic", "turns": [{"tool_calls": [{"name": "finish", "arguments": {}}]}] * 3}),
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
    }
    with Engine(url, Registry([COUNTER])) as eng:
        task_ids = [eng.start("counter", {}, actor="ann") for _ in range(3)]
        exe = str(Path(sys.executable).with_name("railyard"))
        proc = subprocess.Popen(
            [exe, "worker", "--model", f"scripted:{script}", "--concurrency", "2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(200):
            if all(eng.get(t).state == "done" for t in task_ids):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "claimed 3" in err and "failures 0" in err
        assert err.count("railyard.transitions") == 3 and "trigger=finish to=done code=-" in err
        assert all(eng.get(t).state == "done" for t in task_ids)
        assert all(eng.store.row(t).lease_owner is None for t in task_ids)  # type: ignore[union-attr]


def test_the_heartbeat_warns_of_leases_taken_over_and_only_of_those(
    eng: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Of three tasks a worker has in hand when its heartbeat runs, one ended meanwhile (its last append dropped
    the lease), one was released and is no longer in hand, and one's lease expired and another worker claimed it.
    Only that one is reported taken over; the others used to be counted too ("3 of 3 leases were taken over")."""
    ended, released, taken = (eng.start("counter", {}, actor="ann") for _ in range(3))
    worker = Worker(eng, name="w1", model=Finisher())
    claims = {c.task_id: c for c in eng.store.claim("w1", limit=3, lease_seconds=60)}
    assert set(claims) == {ended, released, taken}
    with holding(Lease(ended, "w1", claims[ended].epoch)):
        eng.run(ended, model=Finisher())  # ends: its append drops the lease
    eng.store.release(released, claims[released].epoch)
    expire_leases(eng)
    [other] = [c for c in eng.store.claim("w2", limit=3, lease_seconds=60) if c.task_id == taken]
    worker._held.update({ended, taken})  # `released` left the worker's hands before the beat's UPDATE
    with caplog.at_level("WARNING", logger="railyard.worker"):
        worker._extend_leases([ended, released, taken])
    warnings = [r.getMessage() for r in caplog.records if "taken over" in r.getMessage()]
    assert warnings == [f"heartbeat: 1 of 3 leases were taken over: {taken}"]
    row = eng.store.row(taken)
    assert row is not None and (row.lease_owner, row.lease_epoch) == ("w2", other.epoch)
