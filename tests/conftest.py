"""Fixtures only: every store test runs on SQLite and on PostgreSQL (`tests/support/postgres.py` says how the
server is found). Helpers live in `tests/support/`.

`make test` runs the suite on several pytest-xdist workers, each a process with its own session: its own
PostgreSQL database (named after the worker), its own temporary folder for the SQLite files, its own migrated
SQLite template. No test listens on a fixed port, and the files tests write are under their `tmp_path` (the
screenshots of docs/img are written there only with RAILYARD_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine import Engine, Registry, StaticRoles
from engine.store import Store
from tests.support.postgres import migrated_pg_database, truncate
from tests.support.sample_workflows import ROLES, all_workflows
from tests.support.sqlite import migrated_sqlite
from tests.support.stores import BACKENDS, store_for

#: The test files of the pure core (engine/core): no database, no subprocess, no server, no model. They carry the
#: `core` marker; `make test-core` (`pytest -m core`) collects these files alone and runs them in seconds, and
#: a test among them that starts a process, opens a database or connects anywhere fails.
CORE_TESTS = frozenset(
    {
        "test_children_core.py",
        "test_commands.py",
        "test_decide.py",
        "test_flow_core.py",
        "test_fold.py",
        "test_merkle.py",
        "test_model_errors.py",
        "test_payloads.py",
        "test_records.py",
        "test_worker_groups.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start, as in a terminal. A command started in the background by a
    shell without job control (`make test &` in a script, some CI runners) inherits SIGINT ignored, and so would
    every process the tests start, the xdist workers first: the tests that interrupt a worker or `Engine.run` with
    SIGINT (tests/test_worker_loop.py) then waited for nothing. Python sets its own handler only where SIGINT is
    not ignored; set here, a process started from this one gets SIGINT's default again, and sets its own."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m core`, the other test files are not even imported (their imports alone take seconds)."""
    if config.option.markexpr == "core" and collection_path.name.startswith("test_") and collection_path.is_file():
        return collection_path.name not in CORE_TESTS
    return None


#: The files of the longest tests (each docs page's commands, a minute or more; the demo's runs), collected first:
#: on xdist's workers they then start at once instead of ending the run alone after every other test is done.
LONGEST_FIRST = ("test_docs.py", "test_demo.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the order is otherwise kept
    for item in items:
        if item.path.name in CORE_TESTS:
            item.add_marker(pytest.mark.core)


@pytest.fixture(autouse=True)
def core_stays_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core test fails if it starts a process, opens a SQLite file or connects a socket (a database, a server)."""
    if request.node.get_closest_marker("core") is None:
        return

    def refuse(what: str) -> Callable[..., None]:
        def refused(*_args: object, **_kwargs: object) -> None:
            raise AssertionError(f"{request.node.nodeid} {what}: not a core test (CORE_TESTS, tests/conftest.py)")

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("started a process"))
    monkeypatch.setattr(sqlite3, "connect", refuse("opened a SQLite database"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connected a socket"))


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each backend (memory, SQLite, PostgreSQL): the store contract's (`tests/test_store_*.py`,
    one file per role of `engine.store.protocol`)."""
    with store_for(request, tmp_path) as empty:
        yield empty


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """One migrated PostgreSQL database for the session (tables are emptied between tests)."""
    with migrated_pg_database() as url:
        yield url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A migrated PostgreSQL database of the test's own (its statistics and processes are its alone)."""
    with migrated_pg_database() as url:
        yield url


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
