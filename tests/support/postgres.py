"""The PostgreSQL server the tests use: where it is, whether it must answer, and databases of their own on it.

RAILYARD_TEST_POSTGRES_URL (default the local `test` database) is only the
server to connect to; the tests create their own database on it and drop it at
the end. With RAILYARD_TEST_POSTGRES=required a missing server fails the run
instead of skipping its tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy.engine import make_url

from engine.store import migrations
from engine.store.schema import metadata

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def pg_server_url() -> str:
    return os.environ.get("RAILYARD_TEST_POSTGRES_URL") or DEFAULT_PG


def pg_required() -> bool:
    return os.environ.get("RAILYARD_TEST_POSTGRES", "").lower() == "required"


def libpq(url: str) -> str:
    """A psycopg (libpq) conninfo from a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pg_reachable() -> str | None:
    """None if the server answers, else why not."""
    try:
        with psycopg.connect(libpq(pg_server_url()), connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@contextmanager
def migrated_pg_database() -> Iterator[str]:
    """A fresh database on the test server at the schema's head, dropped after (skipped without a server, or
    failed where it is required)."""
    url = create_pg_database()
    try:
        migrations.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


def create_pg_database() -> str:
    """Create a fresh, empty database on the test server; returns its SQLAlchemy URL."""
    reason = pg_reachable()
    if reason is not None:
        if pg_required():
            pytest.fail(f"PostgreSQL is required (RAILYARD_TEST_POSTGRES=required) but unreachable: {reason}")
        pytest.skip(f"PostgreSQL unreachable ({reason}); set RAILYARD_TEST_POSTGRES=required to fail instead")
    # Unique on the server, and named after the pytest-xdist worker that made it (`main` without xdist).
    name = f"railyard_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq(pg_server_url()), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(pg_server_url()).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    with psycopg.connect(libpq(pg_server_url()), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def truncate(url: str) -> None:
    """Empty the engine's tables (between tests that share the session's database)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        # As the database's owner: the append-only guard (migration 0007) refuses TRUNCATE too.
        conn.execute("SET session_replication_role = replica")
        # Every table of the schema, so none is left holding the last test's rows (the kept counts above all).
        conn.execute(f"TRUNCATE {', '.join(table.name for table in metadata.sorted_tables)}")
