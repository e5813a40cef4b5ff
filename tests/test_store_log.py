"""The store contract, `TaskLog`: what every store (memory, SQLite, PostgreSQL) does with the task logs, checked
the same way on each: create, append under optimistic concurrency, snapshots and loads, what a store can do, and
random sequences of appends (some at stale seqs) run against the three stores at once, asked for the same logs
and refusals. Logs are built by hand (`tests/support/stores.py`) so that the store is all that is under test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import ConcurrencyConflict, Event, StoreError
from engine.core.canonical import now
from engine.core.chain import verify_chain
from engine.core.errors import Code
from engine.core.rows import Snapshot, TaskRow
from engine.store import MemoryStore, SqlStore, Store, open_store
from tests.support.races import together
from tests.support.stores import BACKENDS, LATER, T0, Log, opened, refusal, started


# -- create, append, conflicts ---------------------------------------------------------------------
def test_a_created_task_reads_back_as_its_row_and_start_event(store: Store) -> None:
    log = started(store, "t-1", next_run_at=T0)
    row = store.row("t-1")
    assert row == TaskRow("t-1", "refund", 1, "d" * 64, "drafting", "runnable", 1, log.first.hash, T0, T0, T0)
    assert store.events("t-1") == [log.first]
    loaded = store.load("t-1")
    assert loaded is not None
    assert (loaded.row, loaded.snapshot, loaded.events) == (
        TaskRow("t-1", "refund", 1, "d" * 64, "drafting", "runnable", 1, log.first.hash, T0, T0),
        None,
        [log.first],
    )
    assert store.row("nobody") is None and store.load("nobody") is None and store.events("nobody") == []


def test_creating_a_task_twice_is_refused_and_leaves_the_first(store: Store) -> None:
    log = started(store, "t-1")
    other = Log("t-1", workflow="triage")
    with pytest.raises(StoreError) as caught:
        store.create(other.row(), other.first)
    assert caught.value.code is Code.DATABASE_ERROR
    assert store.events("t-1") == [log.first]
    assert store.row("t-1") == log.row()


def test_an_append_moves_the_row_and_its_events_follow_in_seq_order(store: Store) -> None:
    log = started(store, "t-1")
    store.append("t-1", 1, log.take(3), status="blocked", next_run_at=LATER)
    row = store.row("t-1")
    assert row is not None
    assert (row.seq, row.state, row.status, row.last_hash, row.next_run_at) == (
        4,
        "working",
        "blocked",
        log.events[-1].hash,
        LATER,
    )
    assert row.updated_at > T0  # the time of the write, not of the events
    assert store.events("t-1") == log.events
    assert verify_chain(store.events("t-1")) == []
    assert store.events("t-1", after_seq=1, upto_seq=3) == log.events[1:3]


def test_a_task_that_stays_due_keeps_the_due_time_it_has_and_one_put_off_or_parked_takes_the_new_one(
    store: Store,
) -> None:
    """A task due since T0 that moves and is asked to be due now stays due since T0 (the claims' order counts from
    when it first became due, and the due index is not rewritten); asked for later, or for never, it takes that."""
    log = started(store, "t-1", next_run_at=T0)
    store.append("t-1", 1, log.take(1), status="runnable", next_run_at=now())
    row = store.row("t-1")
    assert row is not None and row.next_run_at == T0
    put_off = now() + timedelta(minutes=5)
    store.append("t-1", 2, log.take(1), status="runnable", next_run_at=put_off)
    row = store.row("t-1")
    assert row is not None and row.next_run_at == put_off
    store.append("t-1", 3, log.take(1), status="blocked", next_run_at=None)
    row = store.row("t-1")
    assert row is not None and row.next_run_at is None
    due_again = now()
    store.append("t-1", 4, log.take(1), status="runnable", next_run_at=due_again)
    row = store.row("t-1")
    assert row is not None and row.next_run_at == due_again


def test_an_append_at_a_stale_seq_writes_nothing_and_says_where_the_task_is(store: Store) -> None:
    log = started(store, "t-1")
    store.append("t-1", 1, log.take(2), status="runnable")
    stale = Log("t-1")  # a writer that read the task at seq 1
    conflict = refusal(lambda: store.append("t-1", 1, [stale.next(n="late")], status="terminal"))
    assert type(conflict) is ConcurrencyConflict
    assert (conflict.code, conflict.task_id, conflict.expected, conflict.actual) == (
        Code.CONCURRENCY_CONFLICT,
        "t-1",
        1,
        3,
    )
    assert store.events("t-1") == log.events
    row = store.row("t-1")
    assert row is not None and (row.seq, row.status) == (3, "runnable")


def test_an_append_to_a_task_that_does_not_exist_is_a_conflict_with_nothing_found(store: Store) -> None:
    conflict = refusal(lambda: store.append("ghost", 1, Log("ghost").take(1), status="runnable"))
    assert (conflict.task_id, conflict.expected, conflict.actual) == ("ghost", 1, None)


def test_an_append_of_events_that_do_not_follow_the_expected_seq_is_a_programming_error(store: Store) -> None:
    log = started(store, "t-1")
    with pytest.raises(ValueError):
        store.append("t-1", 1, [], status="runnable")
    skipping = log.take(2)[1:]  # seq 3 after seq 1
    with pytest.raises(ValueError):
        store.append("t-1", 1, skipping, status="runnable")
    with pytest.raises(ValueError):
        store.append("t-2", 1, skipping, status="runnable")
    assert store.events("t-1") == [log.first]


def test_two_writers_at_the_same_seq_one_wins_and_the_other_is_refused(store: Store) -> None:
    for n in range(5):
        task_id = f"race-{n}"
        started(store, task_id)
        ours, theirs = Log(task_id), Log(task_id)
        results = together(
            partial(store.append, task_id, 1, [ours.next(by="us")], status="runnable"),
            partial(store.append, task_id, 1, [theirs.next(by="them")], status="runnable"),
        )
        assert sorted(results, key=str) == [Code.CONCURRENCY_CONFLICT, None]
        assert store.events(task_id) == (ours if results[0] is None else theirs).events


def test_repin_moves_the_task_to_another_version_or_conflicts_like_an_append(store: Store) -> None:
    log = started(store, "t-1")
    store.append("t-1", 1, log.take(1), status="runnable")
    stale = refusal(
        lambda: store.repin(
            "t-1", 1, log.next("migrate", "drafting"), version=2, digest="e" * 64, status="blocked", next_run_at=None
        )
    )
    assert (stale.expected, stale.actual) == (1, 2)
    log.forget(1)
    migrate = log.next("migrate", "review")
    store.repin("t-1", 2, migrate, version=2, digest="e" * 64, status="blocked", next_run_at=LATER)
    row = store.row("t-1")
    assert row is not None
    assert (row.version, row.digest, row.seq, row.state, row.status, row.last_hash, row.next_run_at) == (
        2,
        "e" * 64,
        3,
        "review",
        "blocked",
        migrate.hash,
        LATER,
    )
    assert store.events("t-1") == log.events


# -- snapshots and loads ---------------------------------------------------------------------------
def test_a_load_starts_from_the_newest_snapshot_at_or_below_the_row(store: Store) -> None:
    log = started(store, "t-1")
    store.append("t-1", 1, log.take(2), status="runnable", snapshot=(3, log.events[2].hash, '{"at":3}'))
    store.append("t-1", 3, log.take(3), status="runnable", snapshot=(6, log.events[5].hash, '{"at":6}'))
    store.append("t-1", 6, log.take(1), status="runnable")
    loaded = store.load("t-1")
    assert loaded is not None
    assert loaded.snapshot == Snapshot("t-1", 6, log.events[5].hash, '{"at":6}')
    assert loaded.events == log.events[6:]
    assert store.snapshots("t-1") == [
        Snapshot("t-1", 3, log.events[2].hash, '{"at":3}'),
        Snapshot("t-1", 6, log.events[5].hash, '{"at":6}'),
    ]
    assert store.snapshot_seqs("t-1") == [3, 6]
    assert store.snapshots("nobody") == [] and store.snapshot_seqs("nobody") == []


def test_loading_many_tasks_at_once_reads_each_as_its_own_load_does(store: Store) -> None:
    """What a worker reads for the tasks one claim gave it: each task exactly as `load` reads it (snapshot or
    none, the events after it up to the row), a task that does not exist left out, and nothing asked, nothing
    read."""
    plain = started(store, "a-plain")
    plain_events = plain.take(2)
    store.append("a-plain", 1, plain_events, status="runnable")
    snapped = started(store, "b-snapped")
    store.append("b-snapped", 1, snapped.take(2), status="runnable", snapshot=(3, snapped.events[2].hash, '{"at":3}'))
    store.append("b-snapped", 3, snapped.take(2), status="runnable")
    at_snapshot = started(store, "c-at-snapshot")
    store.append(
        "c-at-snapshot", 1, at_snapshot.take(1), status="terminal", snapshot=(2, at_snapshot.events[1].hash, "{}")
    )
    fresh = started(store, "d-fresh")
    asked = ["d-fresh", "nobody", "c-at-snapshot", "a-plain", "b-snapped"]
    loaded = store.load_many(asked)
    assert sorted(loaded) == ["a-plain", "b-snapped", "c-at-snapshot", "d-fresh"]
    for task_id in loaded:
        assert loaded[task_id] == store.load(task_id)
    assert loaded["b-snapped"].snapshot == Snapshot("b-snapped", 3, snapped.events[2].hash, '{"at":3}')
    assert loaded["b-snapped"].events == snapped.events[3:]
    assert loaded["c-at-snapshot"].events == [] and loaded["a-plain"].events == plain.events
    assert loaded["d-fresh"].events == [fresh.first] and loaded["d-fresh"].snapshot is None
    assert store.load_many([]) == {} and store.load_many(["nobody"]) == {}


def test_seq_at_is_the_last_event_written_at_or_before_a_time(store: Store) -> None:
    log = started(store, "t-1")
    store.append("t-1", 1, log.take(3), status="runnable")  # events at T0, T0 + 1 s, + 2 s, + 3 s
    assert store.seq_at("t-1", T0 - timedelta(seconds=1)) is None
    assert store.seq_at("t-1", T0) == 1
    assert store.seq_at("t-1", T0 + timedelta(seconds=2, milliseconds=500)) == 3
    assert store.seq_at("t-1", LATER) == 4
    assert store.seq_at("t-1", (T0 + timedelta(seconds=1)).astimezone(timezone(timedelta(hours=2)))) == 2  # any zone
    assert store.seq_at("nobody", LATER) is None


# -- what a store can do ---------------------------------------------------------------------------
def test_capabilities_say_what_the_backend_can_do(store: Store) -> None:
    if isinstance(store, MemoryStore):
        assert (store.supports_notify, store.supports_fork) == (False, False)
    else:
        assert isinstance(store, SqlStore)
        postgres = store.url.startswith("postgresql")
        assert (store.supports_notify, store.supports_fork) == (postgres, True)


def test_a_store_is_opened_from_its_url() -> None:
    memory = open_store("memory://")
    assert isinstance(memory, MemoryStore) and memory is not open_store("memory://")
    sqlite = open_store("sqlite://")  # an in-memory SQLite database: forked processes cannot read it
    assert isinstance(sqlite, SqlStore) and (sqlite.supports_notify, sqlite.supports_fork) == (False, False)
    sqlite.close()


# -- the same logs on every backend ----------------------------------------------------------------
#: One step of a writer: append `n` events at the task's seq minus `behind` (0: up to date), with or without
#: a snapshot at the new head.
Step = tuple[int, int, bool]

#: The row's fields a store keeps as it was given or moved them (the write time, `updated_at`, is its own).
ROW_FIELDS = ("task_id", "workflow", "version", "digest", "state", "status", "seq", "last_hash", "created_at")


@pytest.fixture
def every_store(tmp_path: Path, pg_database: str) -> Iterator[dict[str, Store]]:
    """One store of each backend, shared by the examples of a property (each example uses its own task)."""
    with ExitStack() as stack:
        yield {kind: stack.enter_context(opened(kind, tmp_path, pg_database)) for kind in BACKENDS}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 2), st.booleans()), min_size=1, max_size=12))
def test_random_appends_leave_the_same_gap_free_log_and_refusals_on_every_backend(
    steps: list[Step], every_store: dict[str, Store]
) -> None:
    task_id = f"prop-{next(EXAMPLES)}"
    outcomes: list[list[str]] = []
    logs: list[tuple[tuple[object, ...], list[Event], list[Snapshot]]] = []
    for store in every_store.values():
        log = started(store, task_id)
        seen = []
        for n, behind, snap in steps:
            expected = max(1, log.seq - behind)
            writer = Log(task_id)
            writer.events = log.events[:expected]
            events = writer.take(n)
            snapshot = (events[-1].seq, events[-1].hash, "{}") if snap else None
            try:
                store.append(task_id, expected, events, status="runnable", snapshot=snapshot)
                log.events = writer.events
                seen.append(f"wrote {n} at {expected}")
            except ConcurrencyConflict as conflict:
                seen.append(f"refused at {expected}: found {conflict.actual}")
        row = store.row(task_id)
        stored = store.events(task_id)
        assert [e.seq for e in stored] == list(range(1, len(stored) + 1))  # gap-free
        assert verify_chain(stored) == []
        assert row is not None and (row.seq, row.last_hash) == (len(stored), stored[-1].hash)
        assert stored == log.events
        outcomes.append(seen)
        logs.append((tuple(getattr(row, f) for f in ROW_FIELDS), stored, store.snapshots(task_id)))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert logs[0] == logs[1] == logs[2]


EXAMPLES = itertools.count()
