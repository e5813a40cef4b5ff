"""A worker's life: which tasks it takes, how fast it hears of new ones, what it reports, how it loses a
lease mid-step, and how it stops (gracefully, or at the end of its grace) without losing a task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from engine import Engine, Registry, StaticRoles, Worker, migrations
from engine.core.canonical import now
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall
from tests.support.reference import expire_leases
from tests.support.sample_workflows import COUNTER, REFUND_V1, ROLES
from tests.support.stores import sql_store
from tests.test_worker import Finisher

REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))


class GatedFinisher:
    """Proposes `finish`, but the first request waits at a gate the test opens: a long step on demand."""

    provider, model, profile = "scripted", "gated", "anthropic"

    def __init__(self, model: str = "gated") -> None:
        self.model = model
        self.entered = threading.Event()
        self.gate = threading.Event()
        self._first = threading.Lock()

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self._first.acquire(blocking=False):
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return ModelResponse(tool_calls=(ToolCall("c", "finish", "{}"),), finish_reason="tool_calls")


@pytest.fixture
def eng(db_url: str) -> Iterator[Engine]:
    with Engine(db_url, Registry([COUNTER, REFUND_V1]), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_worker_serves_only_the_workflows_it_is_given(eng: Engine) -> None:
    counters = [eng.start("counter", {}, actor="ann") for _ in range(3)]
    refund = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    worker = Worker(eng, name="counting-only", workflows=["counter"], model=Finisher(), concurrency=8)
    assert worker.run_once() == 3
    assert all(eng.get(t).state == "done" for t in counters)
    row = eng.store.row(refund)
    assert row is not None and row.lease_epoch == 0 and eng.get(refund).seq == 1  # never touched
    assert eng.store.claim("x", limit=8, lease_seconds=5, workflows=["nope"]) == []
    [claim] = eng.store.claim("x", limit=8, lease_seconds=5, workflows=["nope", "refund"])
    assert claim.task_id == refund


def test_one_slow_task_does_not_hold_up_the_others(eng: Engine) -> None:
    model = GatedFinisher()
    task_ids = [eng.start("counter", {}, actor="ann") for _ in range(6)]
    worker = Worker(eng, name="w", concurrency=2, model=model, poll_seconds=0.02)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        assert model.entered.wait(20)
        # One slot is stuck in the gated step; the other keeps claiming as each task is released.
        wait_for(lambda: sum(eng.get(t).state == "done" for t in task_ids) == 5)
        slow = [t for t in task_ids if eng.get(t).state != "done"]
        assert len(slow) == 1
        row = eng.store.row(slow[0])
        assert row is not None and row.lease_owner == "w"
    finally:
        model.gate.set()
        wait_for(lambda: all(eng.get(t).state == "done" for t in task_ids))
        worker.stop()
        runner.join(timeout=30)
    assert not runner.is_alive()
    counts = worker.counts.snapshot()
    assert (counts["claimed"], counts["transitions"], counts["released"]) == (6, 6, 6)


def test_heartbeats_keep_the_lease_of_a_long_step_and_only_that_one(eng: Engine) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    bystander = eng.start("counter", {}, actor="ann")
    model = GatedFinisher()
    worker = Worker(eng, name="slow", model=model, lease_seconds=0.6, concurrency=1)
    running = threading.Thread(target=worker.run_once)
    running.start()
    try:
        assert model.entered.wait(20)
        held = eng.store.row(task_id)
        assert held is not None and held.lease_owner == "slow"
        with sql_store(eng).engine.begin() as conn:  # a lease under the same name the worker does not hold
            conn.execute(
                text("UPDATE tasks SET lease_owner = 'slow', lease_expires_at = :past WHERE task_id = :t"),
                {"past": "2000-01-01 00:00:00", "t": bystander},
            )
        time.sleep(1.5)  # more than two lease lengths into the step
        row = eng.store.row(task_id)
        assert row is not None and row.lease_owner == "slow" and row.lease_expires_at is not None
        assert row.lease_expires_at > now()  # extended, so no other worker may claim it
        assert Worker(eng, name="other", model=Finisher(), workflows=["counter"]).run_once() == 1  # the bystander
        other = eng.store.row(bystander)
        assert other is not None and other.lease_owner is None and eng.get(bystander).state == "done"
    finally:
        model.gate.set()
        running.join(timeout=30)
    assert eng.get(task_id).state == "done"


def test_two_workers_on_one_task_when_the_lease_expires_mid_step(eng: Engine) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    first_model, second_model = GatedFinisher("first"), GatedFinisher("second")
    first = Worker(eng, name="first", model=first_model, lease_seconds=30)
    second = Worker(eng, name="second", model=second_model, lease_seconds=30)
    first_run = threading.Thread(target=first.run_once)
    first_run.start()
    assert first_model.entered.wait(20)  # `first` holds the task and is in the middle of a model call
    expire_leases(eng)  # its lease runs out meanwhile (a stalled process, a long GC pause)
    second_run = threading.Thread(target=second.run_once)
    second_run.start()
    assert second_model.entered.wait(20)  # `second` claimed it (a new epoch) and is mid-step too
    first_model.gate.set()
    first_run.join(timeout=30)
    second_model.gate.set()
    second_run.join(timeout=30)
    history = eng.history(task_id)
    assert [(e.trigger, e.actor) for e in history] == [("start", "ann"), ("finish", "model:scripted:second")]
    assert first.counts.lease_losses == 1 and first.counts.transitions == 0
    assert second.counts.transitions == 1 and second.counts.lease_losses + second.counts.conflicts == 0
    row = eng.store.row(task_id)
    assert row is not None and row.lease_owner is None and row.lease_epoch == 2


def test_a_worker_reports_its_counts_while_it_runs(eng: Engine) -> None:
    task_ids = [eng.start("counter", {}, actor="ann") for _ in range(4)]
    worker = Worker(eng, name="reporting", model=Finisher(), poll_seconds=0.02, report_seconds=0.1)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_for(lambda: all(eng.get(t).state == "done" for t in task_ids))

        def reported() -> dict[str, int]:
            live = {w.name: w for w in eng.store.workers(seen_since=now() - timedelta(seconds=60))}
            return live["reporting"].counts if "reporting" in live else {}

        wait_for(lambda: reported().get("transitions") == 4)
        counts = reported()
        assert (counts["claimed"], counts["failures"], counts["conflicts"]) == (4, 0, 0)
        assert counts["claim_latency_p99_ms"] is not None
    finally:
        worker.stop()
        runner.join(timeout=30)
    assert "reporting" not in {w.name for w in eng.store.workers(seen_since=now() - timedelta(seconds=60))}


def test_an_idle_worker_hears_of_a_new_task_without_polling(db_url: str) -> None:
    with Engine(db_url, Registry([COUNTER])) as eng:
        if not db_url.startswith("postgresql"):
            assert Worker(eng).listen is False  # SQLite has no notifications: its workers poll
            return
        worker = Worker(eng, name="listening", model=Finisher(), poll_seconds=60)
        runner = threading.Thread(target=worker.run)
        runner.start()
        try:
            time.sleep(1.0)  # the worker has polled once and is now waiting (for 60 s, or a notification)
            latencies = []
            for _ in range(5):
                started = time.monotonic()
                task_id = eng.start("counter", {}, actor="ann")
                wait_for(lambda t=task_id: eng.get(t).state == "done", seconds=10)  # type: ignore[misc]
                latencies.append(time.monotonic() - started)
            assert max(latencies) < 5, latencies  # far below the 60 s poll: the notification woke it
        finally:
            worker.stop()
            runner.join(timeout=30)


def _worker_env(tmp_path: Path, url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
    }


def _script(tmp_path: Path, name: str, turns: list[dict[str, object]]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"profile": "anthropic", "turns": turns}), encoding="utf-8")
    return f"scripted:{path}"


TICK: dict[str, object] = {"tool_calls": [{"name": "tick", "arguments": {"n": 1}}]}
FINISH: dict[str, object] = {"tool_calls": [{"name": "finish", "arguments": {}}]}


def test_sigterm_during_a_step_hands_the_task_back_after_that_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    migrations.upgrade(url)
    with Engine(url, Registry([COUNTER])) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        slow = _script(tmp_path, "slow.json", [{**TICK, "delay_seconds": 2.0}, TICK, FINISH])
        proc = subprocess.Popen(
            [RAILYARD, "worker", "--model", slow, "--grace-seconds", "20"],
            env=_worker_env(tmp_path, url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: eng.store.row(task_id).lease_owner is not None)  # type: ignore[union-attr]
        time.sleep(0.5)  # inside the 2-second model call
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
        assert proc.returncode == 0, err
        assert took < 20, took
        # The step in progress was finished and recorded; the next one was not started.
        assert [e.trigger for e in eng.history(task_id)] == ["start", "tick"]
        row = eng.store.row(task_id)
        assert row is not None and row.lease_owner is None and row.status == "runnable"
        assert "handed back 1" in err
        rest = _script(tmp_path, "rest.json", [TICK, FINISH])
        done = subprocess.run(
            [RAILYARD, "worker", "--once", "--model", rest],
            env=_worker_env(tmp_path, url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert [e.trigger for e in eng.history(task_id)] == ["start", "tick", "tick", "finish"]


def test_a_step_longer_than_the_grace_is_cut_off_and_resumed_by_the_next_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    migrations.upgrade(url)
    with Engine(url, Registry([COUNTER])) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        slow = _script(tmp_path, "slow.json", [{**FINISH, "delay_seconds": 30.0}])
        proc = subprocess.Popen(
            [RAILYARD, "worker", "--model", slow, "--grace-seconds", "1"],
            env=_worker_env(tmp_path, url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: eng.store.row(task_id).lease_owner is not None)  # type: ignore[union-attr]
        time.sleep(0.5)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert time.monotonic() - signalled < 10
        assert [e.trigger for e in eng.history(task_id)] == ["start"]  # nothing half-written
        assert eng.store.claim("next", limit=1, lease_seconds=5) == []  # its lease still stands...
        expire_leases(eng)  # ...until it runs out
        fast = _script(tmp_path, "fast.json", [FINISH])
        done = subprocess.run(
            [RAILYARD, "worker", "--once", "--model", fast],
            env=_worker_env(tmp_path, url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert [e.trigger for e in eng.history(task_id)] == ["start", "finish"]
        assert eng.get(task_id).state == "done"


def test_status_lists_leased_tasks_and_live_workers(eng: Engine) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    [claim] = eng.store.claim("holder", limit=1, lease_seconds=60)
    assert claim.task_id == task_id
    [row] = [c for c in eng.store.status_counts() if c["workflow"] == "counter"]
    assert (row["status"], row["tasks"], row["leased"]) == ("runnable", 1, 1)
    assert row["oldest_due"] is None  # held: no runnable task waits for a worker
    eng.store.release(task_id, claim.epoch)
    [row] = [c for c in eng.store.status_counts() if c["workflow"] == "counter"]
    assert (row["leased"], row["oldest_due"]) == (0, eng.store.row(task_id).next_run_at)  # type: ignore[union-attr]


def test_a_worker_without_the_tasks_version_leaves_it_alone_without_counting_a_failure(eng: Engine) -> None:
    from dataclasses import replace as with_changes

    task_id = eng.start("counter", {}, actor="ann")
    other = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    newer_only = Registry([with_changes(COUNTER, version=2)])
    with Engine(sql_store(eng).url, newer_only) as deployed_elsewhere:
        worker = Worker(deployed_elsewhere, name="v2-only", model=Finisher(), retry_backoff=3600)
        assert worker.workflows == ["counter"]  # by default, only the workflows this process defines
        assert worker.run_once() == 1  # the counter task; never the refund task it has no definition of
        assert worker.counts.failures == 0 and worker.counts.transitions == 0
        assert worker.run_once() == 0  # postponed, for a worker that has counter@1
    row = eng.store.row(task_id)
    assert row is not None and row.failures == 0 and row.lease_owner is None and eng.get(task_id).seq == 1
    assert eng.store.row(other).lease_epoch == 0  # type: ignore[union-attr]
    assert Worker(eng, model=Finisher()).run_once() == 1  # `other` is due; the counter task waits its backoff
