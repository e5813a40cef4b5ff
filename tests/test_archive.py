"""Retention: ended tasks' logs move to verified files, a tombstone row stays, and the task is still provable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from engine import Code, Engine, RailyardError, Registry, StaticRoles, migrations
from engine.core.canonical import now
from tests.support.insider import sql
from tests.support.sample_workflows import COUNTER, ROLES
from tests.support.stores import sql_store

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def eng(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with Engine(
        db_url, Registry([COUNTER]), authoriser=StaticRoles(ROLES), archive_dir=tmp_path / "archive", snapshot_every=2
    ) as engine:
        yield engine


def ended_and_running(eng: Engine) -> tuple[list[str], str]:
    ended = []
    for n in range(2):
        task_id = eng.start("counter", {}, actor="ann")
        for i in range(3):
            eng.fire(task_id, "tick", {"n": i}, actor="model")
        if n == 0:
            eng.fire(task_id, "finish", {}, actor="model")
        else:
            eng.cancel(task_id, actor="ann", reason="duplicate")
        ended.append(task_id)
    running = eng.start("counter", {}, actor="ann")
    eng.fire(running, "tick", {"n": 1}, actor="model")
    return ended, running


def stored_events(eng: Engine, task_id: str) -> int:
    with sql_store(eng).engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM events WHERE task_id = :t"), {"t": task_id}).scalar_one())


def test_ended_tasks_move_to_a_verified_file_and_stay_provable(eng: Engine) -> None:
    ended, running = ended_and_running(eng)
    before = {t: (eng.history(t), eng.get(t).to_dict()) for t in ended}
    done = eng.audit.archive(now() + timedelta(seconds=1))
    assert (done.tasks, done.events, len(done.files)) == (2, sum(len(before[t][0]) for t in ended), 1)
    assert (eng.archive_dir / done.files[0]).is_file()
    for task_id in ended:
        assert stored_events(eng, task_id) == 0 and eng.store.snapshots(task_id) == []
        row = eng.store.row(task_id)
        assert row is not None and row.status == "terminal"  # the tombstone
        assert eng.history(task_id) == before[task_id][0]  # read back from the file
        assert eng.get(task_id).to_dict() == before[task_id][1]
        report = eng.replay(task_id)
        assert report.ok and report.events == len(before[task_id][0])
    assert stored_events(eng, running) == 2 and eng.store.archive_of(running) is None
    assert all(r.ok for r in eng.audit.replay_all())
    assert eng.audit.archive(now() + timedelta(seconds=1)).tasks == 0  # nothing left to archive


@pytest.mark.parametrize("batch", [500, 2])
def test_replay_all_reads_each_archive_file_once(eng: Engine, monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """Six ended tasks in one file, or in three files of two (filled by end time, so task ids jump between files):
    `replay_all` reads each file once for all its tasks, and reports every task once."""
    from engine.audit import archive

    ended = [t for _ in range(3) for t in ended_and_running(eng)[0]]
    files = eng.audit.archive(now() + timedelta(seconds=1), batch=batch).files
    assert len(files) == 6 // min(batch, 6)
    opened: list[str] = []
    check = archive._check_file

    def counted(path: Any, lookup: Any, origin: Any = None) -> Any:
        opened.append(path.name)
        return check(path, lookup, origin)

    monkeypatch.setattr(archive, "_check_file", counted)
    reports = [r for r in eng.audit.replay_all() if r.task_id in ended]
    assert sorted(r.task_id for r in reports) == sorted(ended) and all(r.ok for r in reports)
    assert sorted(opened) == sorted(files)  # one read per file, not one per task
    everything = [r.task_id for r in eng.audit.replay_all(workflow="counter")]  # each task once, archived or not
    assert sorted(everything) == sorted(eng.store.task_ids(workflow="counter")) and len(everything) == 9


def test_only_tasks_that_ended_before_the_date_are_archived(eng: Engine) -> None:
    ended, _ = ended_and_running(eng)
    assert eng.audit.archive(now() - timedelta(days=1)).tasks == 0
    assert all(stored_events(eng, t) > 0 for t in ended)


def test_an_edited_or_lost_archive_file_is_an_audit_finding(eng: Engine) -> None:
    ended, _ = ended_and_running(eng)
    [name] = eng.audit.archive(now() + timedelta(seconds=1)).files
    path = eng.archive_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert "HASH_MISMATCH" in eng.replay(ended[0]).codes
    assert {r.task_id: r.codes for r in eng.audit.replay_all() if r.task_id in ended} == {
        t: ["HASH_MISMATCH"] for t in ended
    }
    with pytest.raises(RailyardError) as caught:
        eng.history(ended[0])
    assert caught.value.code is Code.HASH_MISMATCH
    path.unlink()
    assert eng.replay(ended[1]).codes == ["ARCHIVE_MISSING"]
    with pytest.raises(RailyardError) as caught:
        eng.load(ended[1])
    assert caught.value.code is Code.ARCHIVE_MISSING


def test_a_log_that_does_not_verify_is_never_archived(eng: Engine) -> None:
    ended, _ = ended_and_running(eng)
    with sql(sql_store(eng).url) as conn:  # someone edited an event of the first task
        conn.execute(
            text("UPDATE events SET data = :d WHERE task_id = :t AND seq = 2"),
            {"d": json.dumps({"args": {"n": 99}}), "t": ended[0]},
        )
    with pytest.raises(RailyardError) as caught:
        eng.audit.archive(now() + timedelta(seconds=1))
    assert caught.value.code is Code.HASH_MISMATCH
    assert all(stored_events(eng, t) > 0 for t in ended)  # nothing deleted, evidence kept
    assert all(eng.store.archive_of(t) is None for t in ended)


def test_railyard_archive_then_replay(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    migrations.upgrade(url)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
        "RAILYARD_ARCHIVE_DIR": str(tmp_path / "kept"),
    }
    with Engine(url, Registry([COUNTER])) as eng:
        task_id = eng.start("counter", {}, actor="ann")
        eng.fire(task_id, "finish", {}, actor="model")
    exe = str(Path(sys.executable).with_name("railyard"))

    def railyard(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *argv], env=env, capture_output=True, text=True, timeout=60)

    cutoff = (now() + timedelta(seconds=1)).isoformat()
    done = railyard("archive", "--before", cutoff, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tasks"] == 1
    assert railyard("replay", task_id).returncode == 0
    assert railyard("replay", "--all").returncode == 0
    history = railyard("history", task_id, "--json")
    assert [e["trigger"] for e in json.loads(history.stdout)] == ["start", "finish"]
    for archived in (tmp_path / "kept").iterdir():
        archived.unlink()
    missing = railyard("replay", task_id)
    assert missing.returncode == 3 and "ARCHIVE_MISSING" in missing.stdout + missing.stderr
    assert railyard("archive", "--before", "not a date").returncode == 2
