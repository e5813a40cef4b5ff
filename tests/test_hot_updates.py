"""A transition writes only what it must (issue #33, migration 0018): on PostgreSQL, a transition of a task that
stays runnable changes no indexed column of `tasks`, so it is a HOT update (no index written); one that blocks it
moves it into the blocked indexes and is not. Counted by PostgreSQL itself for the transaction that ran the
engine's own append statement."""

from __future__ import annotations

from typing import Any

import psycopg

from engine.core.canonical import now
from engine.store import SqlStore, postgres
from tests.support.postgres import libpq
from tests.support.stores import T0, Log, started


def _updates_in_transaction(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'tasks'"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _append(url: str, log: Log, expected_seq: int, status: str, next_run_at: Any) -> tuple[int, int]:
    """The engine's append statement on a connection of the test's, and what PostgreSQL counted for it."""
    with psycopg.connect(libpq(url)) as conn:
        postgres.append(conn, log.task_id, expected_seq, log.take(1), status, None, next_run_at, None)
        counted = _updates_in_transaction(conn)
        conn.commit()
    return counted


def test_a_transition_of_a_runnable_task_is_a_hot_update_and_one_that_blocks_it_is_not(pg_url: str) -> None:
    store = SqlStore(pg_url)
    try:
        log = started(store, "t-1", next_run_at=T0)
        # runnable -> runnable, asked to be due now: seq, state, last_hash and updated_at change, no key does.
        assert _append(pg_url, log, 1, "runnable", now()) == (1, 1)
        assert _append(pg_url, log, 2, "runnable", now()) == (1, 1)
        # into `blocked`: its place and wait now key the blocked indexes, which a HOT update cannot write.
        assert _append(pg_url, log, 3, "blocked", None) == (1, 0)
        row = store.row("t-1")
        assert row is not None and (row.seq, row.status, row.next_run_at) == (4, "blocked", None)
    finally:
        store.close()


def test_the_tables_indexes_hold_no_column_a_runnable_tasks_transition_changes(pg_url: str) -> None:
    """Every column an index of `tasks` reads (keys, expressions, predicates), from the catalogue: what a transition
    changes on every step must not be among them, or no transition is HOT again."""
    with psycopg.connect(libpq(pg_url)) as conn:
        indexed = {
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
                " WHERE i.indrelid = 'tasks'::regclass AND a.attnum > 0 AND ("
                " a.attnum = ANY(i.indkey::int2[])"
                " OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M')"
                " OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M'))"
            )
        }
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'tasks'").fetchone()
    every_step = {"seq", "state", "last_hash", "updated_at", "lease_owner", "lease_expires_at", "lease_epoch"}
    assert indexed & every_step == set()
    assert {"place", "waiting_since", "status", "next_run_at"} <= indexed  # what the lists and the queue need
    assert options is not None and "fillfactor=80" in (options[0] or [])
