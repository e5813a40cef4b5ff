"""The store contract, `AuditLog`: the audit stream and pages, the archive's bookkeeping and checkpoints, on
every store (memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine import Event, StoreError
from engine.core.canonical import now
from engine.core.checkpoints import Header
from engine.core.rows import Snapshot, TaskRow
from engine.store import Store
from tests.support.stores import T0, Log, started


# -- audit reads -----------------------------------------------------------------------------------
def audit_fixture(store: Store) -> dict[str, Log]:
    logs = {}
    for task_id in ("c", "a", "b"):
        log = logs[task_id] = started(store, task_id)
        store.append(task_id, 1, log.take(2), status="runnable", snapshot=(2, log.events[1].hash, "{}"))
    triage = logs["t"] = Log("t", workflow="triage")
    store.create(triage.row(), triage.first)
    return logs


def test_the_audit_stream_is_each_row_in_task_order_then_its_log_with_snapshots_after_their_event(
    store: Store,
) -> None:
    logs = audit_fixture(store)
    items = list(store.audit_stream())
    expected: list[TaskRow | Event | Snapshot] = []
    for task_id in ("a", "b", "c", "t"):
        log = logs[task_id]
        loaded = store.load(task_id)
        assert loaded is not None
        expected.append(loaded.row)
        expected += log.events[:2]
        if task_id != "t":
            expected += [Snapshot(task_id, 2, log.events[1].hash, "{}"), log.events[2]]
    assert items == expected
    # Each event carries the bytes it was hashed from, and they check.
    events = [item for item in items if isinstance(item, Event)]
    assert all(e.stored_data is not None for e in events)
    assert all(e.computed_hash() == e.hash for e in events)
    # Small pages read the same stream.
    assert list(store.audit_stream(page_size=1)) == items
    assert list(store.audit_pages(page_size=3)) == [["a", "b", "c"], ["t"]]
    assert list(store.audit_pages(page_size=2)) == [["a", "b"], ["c", "t"]]


def test_the_audit_stream_keeps_only_what_it_is_asked_for(store: Store) -> None:
    logs = audit_fixture(store)
    only = list(store.audit_stream(task_ids=["c", "a", "a"], with_snapshots=False, from_seq=2, upto_seq=2))
    assert [type(i).__name__ for i in only] == ["TaskRow", "Event", "TaskRow", "Event"]
    assert [i.task_id for i in only] == ["a", "a", "c", "c"]
    assert [i for i in only if isinstance(i, Event)] == [logs["a"].events[1], logs["c"].events[1]]
    assert [i.task_id for i in store.audit_stream(workflow="triage")] == ["t", "t"]
    assert list(store.audit_stream(task_ids=[])) == []
    assert list(store.audit_stream(since=now() + timedelta(minutes=1))) == []
    assert list(store.audit_pages(workflow="nothing")) == []


# -- archive ---------------------------------------------------------------------------------------
def test_archived_tasks_keep_their_row_and_lose_their_log(store: Store) -> None:
    logs = {}
    for task_id in ("x", "y", "z"):
        logs[task_id] = log = started(store, task_id)
        store.append(task_id, 1, log.take(1), status="terminal", snapshot=(2, log.events[1].hash, "{}"))
    started(store, "running")
    before = now() + timedelta(seconds=1)
    assert [r.task_id for r in store.archivable(before, limit=10)] == ["x", "y", "z"]
    assert [r.task_id for r in store.archivable(before, limit=2)] == ["x", "y"]
    assert store.archivable(T0, limit=10) == []

    # y moved on since it was exported (another seq): left alone.
    assert store.mark_archived([("x", 2), ("y", 1), ("z", 2), ("x", 2)], "archive-1.jsonl", "f" * 64) == 2
    assert store.events("x") == [] and store.snapshots("x") == [] and store.load("x") is not None
    assert store.events("y") == logs["y"].events
    ref = store.archive_of("x")
    assert ref is not None and (ref.task_id, ref.file, ref.sha256) == ("x", "archive-1.jsonl", "f" * 64)
    assert store.archive_of("y") is None and store.archive_of("nobody") is None
    assert store.mark_archived([("y", 2)], "archive-0.jsonl", "0" * 64) == 1
    assert [r.task_id for r in store.archivable(before, limit=10)] == []
    listed = list(store.archived())
    assert [(row.task_id, archive.file) for row, archive in listed] == [
        ("y", "archive-0.jsonl"),
        ("x", "archive-1.jsonl"),
        ("z", "archive-1.jsonl"),
    ]
    assert listed[0][0] == store.row("y")
    assert [row.task_id for row, _ in store.archived(page_size=1)] == ["y", "x", "z"]
    assert list(store.archived(workflow="triage")) == []
    # An archived task is still in the audit stream, as its row alone (replay reads the archive for the rest).
    assert [i.task_id for i in store.audit_stream(task_ids=["x"])] == ["x"]


# -- checkpoints ---------------------------------------------------------------------------------------------------
def test_heads_come_in_task_id_byte_order_and_event_hashes_are_read_back(store: Store) -> None:
    logs = {task_id: started(store, task_id) for task_id in ("t-b", "t-B", "t-a", "t-é", "t-10", "t-9")}
    for log in logs.values():
        store.append(log.task_id, 1, log.take(2), status="runnable")
    heads = list(store.heads())
    assert [h.task_id for h in heads] == sorted(logs, key=str.encode)  # byte order, whatever the locale says
    assert [(h.seq, h.hash) for h in heads] == [(3, logs[h.task_id].events[-1].hash) for h in heads]
    wanted = [("t-a", 2), ("t-é", 3), ("t-a", 9), ("nobody", 1)]
    assert store.event_hashes(wanted) == {
        ("t-a", 2): logs["t-a"].events[1].hash,
        ("t-é", 3): logs["t-é"].events[2].hash,
    }
    # The same heads with the log's own hash at each head's seq, in the same order.
    assert [(h, logged) for h, logged in store.log_heads()] == [(h, h.hash) for h in heads]


def test_the_last_checkpoint_noted_is_the_newest_and_a_file_is_noted_once(store: Store) -> None:
    assert store.last_checkpoint() is None
    older = Header(2, "a" * 64, "2026-12-01T10:00:00.000000Z", None, "k" * 16)
    newer = Header(3, "b" * 64, "2026-12-01T11:00:00.000000Z", "a" * 64, "k" * 16)
    store.record_checkpoint(newer, "b.jsonl")
    store.record_checkpoint(older, "a.jsonl")
    assert store.last_checkpoint() == (newer, "b.jsonl")
    quiet = Header(3, "b" * 64, "2026-12-01T12:00:00.000000Z", "b" * 64, "k" * 16)  # nothing changed since: same root
    store.record_checkpoint(quiet, "c.jsonl")
    assert store.last_checkpoint() == (quiet, "c.jsonl")
    with pytest.raises(StoreError):
        store.record_checkpoint(older, "a.jsonl")
