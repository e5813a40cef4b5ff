"""Alembic builds the schema on both databases: up from empty, down to empty, no drift, offline SQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, pool

from engine import SqlStore, migrations
from engine.store.database import normalize_url
from engine.store.protocol import QueueQuery
from tests.support.postgres import create_pg_database, drop_pg_database
from tests.support.stores import T0, ended, started


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
        return
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


def tables(url: str) -> set[str]:
    engine = create_engine(normalize_url(url), poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_to_head_and_back(empty_db: str) -> None:
    assert tables(empty_db) == set()
    migrations.upgrade(empty_db)
    assert tables(empty_db) == {
        "tasks",
        "events",
        "snapshots",
        "workers",
        "checkpoints",
        "archive_permits",
        "page_sessions",
        "login_failures",
        "task_fields",
        "terminal_counts",
        "people",
        "api_tokens",
        "access_trail",
        "flow_breakers",
        "flow_quotas",
        "flow_waits",
        "task_claims",
        "webhook_subscriptions",
        "webhook_outbox",
        "blocked_counts",
        "flow_shares",
        "alembic_version",
    }
    assert migrations.current(empty_db) == "0018"
    migrations.check(empty_db)  # raises if the metadata and the migrated schema differ
    migrations.downgrade(empty_db, "base")
    assert tables(empty_db) == {"alembic_version"}
    assert migrations.current(empty_db) is None
    migrations.upgrade(empty_db)  # and up again: downgrade left nothing behind
    assert migrations.current(empty_db) == "0018"


def test_upgrading_a_database_that_holds_ended_tasks_counts_them_once(empty_db: str) -> None:
    """Migration 0009 counts the tasks that ended before it (the status counts read those counts from then on),
    and a downgrade and upgrade count them again from the rows, not on top of the old counts."""
    migrations.upgrade(empty_db, "0008")
    store = SqlStore(empty_db)
    try:
        for n in range(3):
            ended(store, f"r-{n}")
        ended(store, "t-0", workflow="triage")
        started(store, "r-live", next_run_at=T0)
        expected = [("refund", "runnable", 1), ("refund", "terminal", 3), ("triage", "terminal", 1)]
        for _ in range(2):
            migrations.upgrade(empty_db)
            assert [(c["workflow"], c["status"], c["tasks"]) for c in store.status_counts()] == expected
            migrations.downgrade(empty_db, "0008")
        migrations.upgrade(empty_db)
        ended(store, "t-1", workflow="triage")  # and the triggers count from there on
        assert [c["tasks"] for c in store.status_counts() if c["workflow"] == "triage"] == [2]
    finally:
        store.close()


def test_upgrading_a_database_with_tasks_waiting_counts_them_in_the_queue_once(empty_db: str) -> None:
    """Migration 0016 counts the tasks already waiting per place (the queue reads those counts from then on), and a
    downgrade and upgrade count them again from the rows."""
    migrations.upgrade(empty_db, "0015")
    store = SqlStore(empty_db)
    try:
        columns = "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at, tenant"
        rows = ", ".join(
            f"('w-{n}', 'refund', 1, 'd', '{'approve' if n % 2 else 'review'}', "
            f"'{'blocked' if n % 5 else 'runnable'}', 1, 'h', '2026-01-01', '2026-01-01', "
            f"{'NULL' if n % 3 else repr('acme')})"
            for n in range(30)
        )
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO tasks ({columns}) VALUES {rows}")
        places = [("refund", 1, "approve"), ("refund", 1, "review")]
        expected = {("refund", 1, "approve"): 12, ("refund", 1, "review"): 12}  # 30, less the 6 runnable
        for _ in range(2):
            migrations.upgrade(empty_db)
            assert store.queue_counts(QueueQuery(places)) == expected
            assert store.queue_counts(QueueQuery(places, tenants=["acme"])) == {
                ("refund", 1, "approve"): 4,
                ("refund", 1, "review"): 4,
            }
            migrations.downgrade(empty_db, "0015")
    finally:
        store.close()


def test_ended_tasks_inserted_in_bulk_are_counted(empty_db: str) -> None:
    """Rows that arrive already ended (a bulk load, a restore: one statement, many rows) are counted like tasks
    that end one by one, and so are their deletions."""
    migrations.upgrade(empty_db)
    store = SqlStore(empty_db)
    try:
        columns = "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at"
        rows = ", ".join(
            f"('b-{n}', '{'triage' if n % 3 else 'refund'}', 1, 'd', '{'done' if n % 5 else 'working'}', "
            f"'{'terminal' if n % 5 else 'runnable'}', 1, 'h', '2026-01-01', '2026-01-01')"
            for n in range(300)
        )
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"INSERT INTO tasks ({columns}) VALUES {rows}")
        counted = {(c["workflow"], c["status"]): c["tasks"] for c in store.status_counts()}
        assert counted == {
            ("refund", "runnable"): 20,
            ("refund", "terminal"): 80,
            ("triage", "runnable"): 40,
            ("triage", "terminal"): 160,
        }
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM tasks WHERE workflow = 'triage'")
        assert [(c["workflow"], c["status"], c["tasks"]) for c in store.status_counts()] == [
            ("refund", "runnable", 20),
            ("refund", "terminal", 80),
        ]
    finally:
        store.close()


def test_upgrade_is_idempotent(empty_db: str) -> None:
    migrations.upgrade(empty_db)
    migrations.upgrade(empty_db)
    assert migrations.current(empty_db) == "0018"


@pytest.mark.parametrize("url", ["sqlite:///offline.db", "postgresql+psycopg://u@h/db"])
def test_offline_mode_emits_the_sql_without_a_database(url: str) -> None:
    sql = migrations.offline_sql(url)
    assert "CREATE TABLE tasks" in sql
    assert "CREATE TABLE events" in sql
    assert "PRIMARY KEY (task_id, seq)" in sql


def test_tables_that_are_not_railyards_are_not_drift(empty_db: str) -> None:
    """The reference fakes (and an application's own tables) may share the database: `check` ignores them."""
    from workflows import fakes

    migrations.upgrade(empty_db)
    fakes.systems(empty_db).reset()  # creates and seeds the fake_* tables
    try:
        assert any(name.startswith("fake_") for name in tables(empty_db))
        migrations.check(empty_db)
    finally:
        fakes.close()


def test_a_migrations_folder_of_the_users_own_is_never_what_db_upgrade_runs(tmp_path: Path) -> None:
    """The CLI puts the working directory first on the import path; Railyard's migrations are found by location."""
    import subprocess
    import sys

    own = tmp_path / "migrations"
    (own / "versions").mkdir(parents=True)
    (own / "__init__.py").write_text("")
    (own / "env.py").write_text("raise SystemExit('the user migrations ran')\n")
    (tmp_path / "workflows").mkdir()  # and the user's own workflows package beside it
    (tmp_path / "workflows" / "__init__.py").write_text("")
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    railyard = str(Path(sys.executable).with_name("railyard"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [railyard, "db", "upgrade"],
        cwd=tmp_path,
        env={**env, "RAILYARD_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "the user migrations ran" not in done.stdout + done.stderr
    assert migrations.current(url) is not None


def test_page_sessions_keep_working_across_0012_and_a_persons_session_is_dropped_going_down(empty_db: str) -> None:
    """0012 turns each session's `token_hash` into `credential` (`token:<sha256>`), so nobody signed in with a
    token is signed out by the upgrade; a downgrade turns those back and deletes the sessions people opened with
    a password (no token to name: they sign in again)."""
    migrations.upgrade(empty_db, "0011")
    engine = create_engine(normalize_url(empty_db), poolclass=pool.NullPool)
    row = "'{id}', '{token}', 'dana', 'csrf', '2026-01-01 00:00:00', '2099-01-01 00:00:00'"
    columns = "id_hash, {column}, actor, csrf, created_at, expires_at"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"INSERT INTO page_sessions ({columns.format(column='token_hash')}) "
                f"VALUES ({row.format(id='s1', token='a' * 64)})"
            )
        migrations.upgrade(empty_db, "0012")
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT id_hash, credential FROM page_sessions").all() == [
                ("s1", "token:" + "a" * 64)
            ]
            conn.exec_driver_sql(
                f"INSERT INTO page_sessions ({columns.format(column='credential')}) "
                f"VALUES ({row.format(id='s2', token='user:dana')})"
            )
        migrations.downgrade(empty_db, "0011")
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT id_hash, token_hash FROM page_sessions").all() == [("s1", "a" * 64)]
        migrations.upgrade(empty_db)
        migrations.check(empty_db)
    finally:
        engine.dispose()


def test_the_access_trail_refuses_updates_and_deletes(empty_db: str) -> None:
    migrations.upgrade(empty_db)
    engine = create_engine(normalize_url(empty_db), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO access_trail (at, by, action, subject, details) "
                "VALUES ('2026-01-01 00:00:00', 'root', 'person.added', 'dana', '{}')"
            )
        for statement in ("UPDATE access_trail SET by = 'mallory'", "DELETE FROM access_trail"):
            with pytest.raises(Exception, match="append-only"), engine.begin() as conn:
                conn.exec_driver_sql(statement)
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT by FROM access_trail").all() == [("root",)]
    finally:
        engine.dispose()
