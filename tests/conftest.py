"""Fixtures only: every store test runs on SQLite and on PostgreSQL (`tests/support/postgres.py` says how the
server is found). Helpers live in `tests/support/`.

`make test` runs the suite on several pytest-xdist workers, each a process with its own session: its own
PostgreSQL database (named after the worker), its own temporary folder for the SQLite files, its own migrated
SQLite template. No test listens on a fixed port, and the files tests write are under their `tmp_path` (the one
exception, the screenshots of docs/img, is one test's)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from engine import Engine, Registry, StaticRoles, migrations
from tests.support.postgres import create_pg_database, drop_pg_database, truncate
from tests.support.sample_workflows import ROLES, all_workflows
from tests.support.sqlite import migrated_sqlite


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start, as in a terminal. A command started in the background by a
    shell without job control (`make test &` in a script, some CI runners) inherits SIGINT ignored, and so would
    every process the tests start, the xdist workers first: the tests that interrupt a worker or `Engine.run` with
    SIGINT (tests/test_worker_loop.py) then waited for nothing. Python sets its own handler only where SIGINT is
    not ignored; set here, a process started from this one gets SIGINT's default again, and sets its own."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
        yield migrated_sqlite(tmp_path_factory.mktemp("db") / "railyard.db")
        return
    url = request.getfixturevalue("pg_database")
    truncate(url)
    yield url


@pytest.fixture
def registry() -> Registry:
    return Registry(all_workflows())


@pytest.fixture
def make_engine(db_url: str, registry: Registry) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def factory(snapshot_every: int = 10) -> Engine:
        eng = Engine(db_url, registry, authoriser=StaticRoles(ROLES), snapshot_every=snapshot_every)
        engines.append(eng)
        return eng

    yield factory
    for eng in engines:
        eng.close()


@pytest.fixture
def eng(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine()
