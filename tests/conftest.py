"""Fixtures: every store test runs on SQLite and on PostgreSQL.

PostgreSQL: RAILYARD_TEST_POSTGRES_URL (default the local `test` database) is
only the server to connect to; the tests create their own database on it and
drop it at the end, so a developer's data is never touched. With
RAILYARD_TEST_POSTGRES=required a missing server fails the run instead of
skipping its tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from engine import Engine, Registry, StaticRoles, migrations
from tests.sample_workflows import ROLES, all_workflows

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def pg_server_url() -> str:
    return os.environ.get("RAILYARD_TEST_POSTGRES_URL") or DEFAULT_PG


def pg_required() -> bool:
    return os.environ.get("RAILYARD_TEST_POSTGRES", "").lower() == "required"


def _libpq(url: str) -> str:
    """A psycopg (libpq) conninfo from a SQLAlchemy URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def pg_reachable() -> str | None:
    """None if the server answers, else why not."""
    try:
        with psycopg.connect(_libpq(pg_server_url()), connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def create_pg_database() -> str:
    """Create a fresh, empty database on the test server; returns its SQLAlchemy URL."""
    reason = pg_reachable()
    if reason is not None:
        if pg_required():
            pytest.fail(f"PostgreSQL is required (RAILYARD_TEST_POSTGRES=required) but unreachable: {reason}")
        pytest.skip(f"PostgreSQL unreachable ({reason}); set RAILYARD_TEST_POSTGRES=required to fail instead")
    name = f"railyard_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(pg_server_url()), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(pg_server_url()).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(url: str) -> None:
    name = make_url(url).database
    with psycopg.connect(_libpq(pg_server_url()), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One migrated PostgreSQL database for the session (tables are emptied between tests)."""
    url = create_pg_database()
    try:
        migrations.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'railyard.db'}"
        migrations.upgrade(url)
        yield url
        return
    url = request.getfixturevalue("pg_database")
    _truncate(url)
    yield url


def _truncate(url: str) -> None:
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute("TRUNCATE snapshots, events, tasks")


@pytest.fixture
def registry() -> Registry:
    return Registry(all_workflows())


@pytest.fixture
def make_engine(db_url: str, registry: Registry) -> Iterator[object]:
    engines: list[Engine] = []

    def factory(snapshot_every: int = 10) -> Engine:
        eng = Engine(db_url, registry, authoriser=StaticRoles(ROLES), snapshot_every=snapshot_every)
        engines.append(eng)
        return eng

    yield factory
    for eng in engines:
        eng.close()


@pytest.fixture
def eng(make_engine: object) -> Engine:
    return make_engine()  # type: ignore[operator]
