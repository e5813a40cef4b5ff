"""Replay in several processes (`--jobs`) reports exactly what replay in one process reports, on SQLite and
PostgreSQL: clean logs, tampered logs, one long log cut at snapshots, many tasks a page at a time."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from engine import Engine
from engine.audit import parallel as replay_jobs
from engine.audit.parallel import STRETCHES_PER_JOB, Stretch, stretches
from engine.store import TaskRow
from tests.support.insider import tamper

MakeEngine = Callable[..., Engine]


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long logs and many pages, at the sizes a test can write (forked workers inherit these)."""
    monkeypatch.setattr(replay_jobs, "LONG_LOG", 10)
    monkeypatch.setattr(replay_jobs, "PAGE", 3)


def counter_task(eng: Engine, ticks: int) -> str:
    task_id = eng.start("counter", {}, actor="ann")
    for n in range(ticks):
        eng.fire(task_id, "tick", {"n": n}, actor="model")
    return task_id


def test_a_long_log_in_stretches_is_checked_like_one_fold(make_engine: MakeEngine) -> None:
    eng = make_engine(snapshot_every=3)
    task_id = counter_task(eng, 40)
    row = eng.store.row(task_id)
    assert row is not None
    parallel = replay_jobs.replay_long(eng.store, eng.registry.find, row, jobs=2)
    assert parallel is not None  # checked in stretches, not handed back for a serial replay
    assert parallel == eng.replay(task_id) == eng.replay(task_id, jobs=2)
    assert parallel.ok and parallel.events == 41
    # The workers used connections of their own: this process's still work.
    assert eng.fire(task_id, "finish", {}, actor="model").state == "done"
    assert eng.replay(task_id, jobs=2).ok


@pytest.mark.parametrize(
    ("edit", "values"),
    [
        ("UPDATE events SET data = :v WHERE task_id = :t AND seq = 20", {"v": '{"args":{"n":99}}'}),
        ("DELETE FROM events WHERE task_id = :t AND seq = 17", {}),
        (
            "UPDATE snapshots SET doc = replace(doc, :old, :new) WHERE task_id = :t AND seq = 18",
            {"old": '"n":16', "new": '"n":61'},
        ),
        # A stretch cannot start from a snapshot in a state the definition does not have (it is not a fold of this log).
        (
            "UPDATE snapshots SET doc = replace(doc, :old, :new) WHERE task_id = :t AND seq = 18",
            {"old": '"state":"counting"', "new": '"state":"nowhere"'},
        ),
        ("UPDATE tasks SET state = 'done' WHERE task_id = :t", {}),
        # The row rolled back to an earlier, consistent head: the events stored after it are still found.
        (
            "UPDATE tasks SET seq = 30, last_hash = (SELECT hash FROM events WHERE task_id = :t AND seq = 30)"
            " WHERE task_id = :t",
            {},
        ),
    ],
    ids=["event", "deleted", "snapshot", "snapshot-state", "row", "rolled-back-row"],
)
def test_a_tampered_long_log_gets_the_serial_findings(
    make_engine: MakeEngine, db_url: str, edit: str, values: dict[str, str]
) -> None:
    eng = make_engine(snapshot_every=3)
    task_id = counter_task(eng, 40)
    tamper(db_url, edit, t=task_id, **values)
    serial = eng.replay(task_id)
    assert not serial.ok
    row = eng.store.row(task_id)
    assert row is not None
    if row.seq >= replay_jobs.LONG_LOG:
        assert replay_jobs.replay_long(eng.store, eng.registry.find, row, jobs=2) is None  # replayed serially
    assert eng.replay(task_id, jobs=2) == serial


def test_many_tasks_a_page_per_job_come_back_in_order_with_the_same_findings(
    make_engine: MakeEngine, db_url: str
) -> None:
    eng = make_engine(snapshot_every=3)
    ids = [counter_task(eng, n % 4) for n in range(11)]
    tamper(db_url, "UPDATE events SET actor = 'mallory' WHERE task_id = :t AND seq = 2", t=ids[5])
    serial = list(eng.audit.replay_all())
    assert [r.task_id for r in serial] == sorted(ids)
    assert list(eng.audit.replay_all(jobs=3)) == serial
    assert [r.task_id for r in serial if not r.ok] == [ids[5]]
    assert list(eng.audit.replay_all(workflow="refund", jobs=2)) == []


#: The task whose page kills the job that replays it (set by the test, inherited by the forked jobs).
DOOMED: list[str] = []
REPLAY_PAGE = replay_jobs._replay_page


def dying_page(ids: list[str]) -> Any:
    """`_replay_page`, except that the job replaying the doomed task's page dies on the spot."""
    if DOOMED and DOOMED[0] in ids:
        os._exit(9)
    return REPLAY_PAGE(ids)


def dying_stretch(stretch: Stretch) -> Any:
    os._exit(9)


def test_a_job_that_dies_costs_time_not_reports(make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = make_engine(snapshot_every=3)
    ids = sorted(counter_task(eng, 2) for _ in range(10))
    long_id = counter_task(eng, 30)
    serial = list(eng.audit.replay_all())
    DOOMED[:] = [ids[4]]
    try:
        monkeypatch.setattr(replay_jobs, "_replay_page", dying_page)
        assert list(eng.audit.replay_all(jobs=2)) == serial
        monkeypatch.setattr(replay_jobs, "_replay_stretch", dying_stretch)
        assert eng.replay(long_id, jobs=2) == eng.replay(long_id)
    finally:
        DOOMED.clear()


def test_jobs_that_cannot_start_leave_replay_to_this_process(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = make_engine(snapshot_every=3)
    for n in range(7):
        counter_task(eng, n)
    long_id = counter_task(eng, 30)
    serial = list(eng.audit.replay_all())

    def no_semaphores(*args: Any, **kwargs: Any) -> Any:
        raise OSError("[Errno 38] Function not implemented")

    monkeypatch.setattr(replay_jobs, "ProcessPoolExecutor", no_semaphores)
    assert list(eng.audit.replay_all(jobs=2)) == serial
    assert eng.replay(long_id, jobs=2) == eng.replay(long_id)


def row_of(seq: int) -> TaskRow:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return TaskRow("t", "counter", 1, "d", "counting", "runnable", seq, "h", at, at)


def test_stretches_cut_at_snapshots_and_cover_the_log_once() -> None:
    assert STRETCHES_PER_JOB == 8  # the cuts below are for 8 stretches per job wanted
    parts = stretches(row_of(400), list(range(10, 401, 10)), jobs=2)  # 16 wanted: 25 events or more each
    assert [(p.after, p.upto) for p in parts] == [(a, a + 30) for a in range(0, 360, 30)] + [(360, 400)]
    assert stretches(row_of(5), [], jobs=4) == [Stretch(row_of(5), 0, 5)]  # no snapshot: nowhere to cut
    uneven = stretches(row_of(80), [3, 7, 30, 31, 76], jobs=1)  # 8 wanted: at least 10 before a cut, 5 after
    assert [(p.after, p.upto) for p in uneven] == [(0, 30), (30, 80)]
