"""Stores of every kind for the contract tests, logs built by hand the way the engine seals them, and the way
into an engine's SQL store for a test that reaches past the store's verbs into its tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import ConcurrencyConflict, Engine, Event
from engine.core.canonical import GENESIS_HASH
from engine.core.events import seal
from engine.core.payloads import as_event_data
from engine.core.rows import TaskRow
from engine.store import MemoryStore, SqlStore, Store
from tests.support.postgres import truncate
from tests.support.sqlite import migrated_sqlite

#: The backends every store contract test runs on.
BACKENDS = ["memory", "sqlite", "postgresql"]

#: A fixed instant the hand-built logs start at, so that the same log is the same bytes on every backend.
T0 = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


def sql_store(eng: Engine) -> SqlStore:
    """The engine's store, which this test needs to be a SQL one (it reads or edits the tables directly)."""
    assert isinstance(eng.store, SqlStore), f"this test needs a SQL store, not {type(eng.store).__name__}"
    return eng.store


def sqlite_store(directory: Path) -> SqlStore:
    """A migrated, empty SQLite store in `directory`."""
    return SqlStore(migrated_sqlite(directory / "store.db"))


def empty_postgres(url: str) -> SqlStore:
    """The session's PostgreSQL database emptied (worker reports too), as a store."""
    truncate(url)
    return SqlStore(url)


@contextmanager
def opened(kind: str, directory: Path, pg_url: str | None) -> Iterator[Store]:
    """An empty store of `kind` (`BACKENDS`), closed afterwards."""
    store: Store
    if kind == "memory":
        store = MemoryStore()
    elif kind == "sqlite":
        store = sqlite_store(directory)
    else:
        assert pg_url is not None
        store = empty_postgres(pg_url)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def store_for(request: pytest.FixtureRequest, directory: Path) -> Iterator[Store]:
    """The empty store of the backend a fixture parametrized over `BACKENDS` stands for."""
    kind = request.param
    pg_url = request.getfixturevalue("pg_database") if kind == "postgresql" else None  # the session's database
    with opened(kind, directory, pg_url) as store:
        yield store


class Log:
    """One task's log built by hand: each event sealed onto the last, a second apart from `T0`."""

    def __init__(self, task_id: str, *, workflow: str = "refund", version: int = 1, state: str = "drafting") -> None:
        self.task_id = task_id
        self.workflow = workflow
        self.version = version
        self.events: list[Event] = []
        self.first = self._seal(None, "start", state, {"payload": {"task": task_id}})

    @property
    def seq(self) -> int:
        return len(self.events)

    @property
    def state(self) -> str:
        return self.events[-1].to_state

    def row(self, *, status: str = "runnable", next_run_at: datetime | None = None) -> TaskRow:
        """The row `create` inserts for this log's start."""
        return TaskRow(
            self.task_id, self.workflow, self.version, "d" * 64, self.state, status, 1, self.first.hash, T0, T0,
            next_run_at,
        )  # fmt: skip

    def next(self, trigger: str = "step", to_state: str = "working", **data: Any) -> Event:
        """The event that follows the last one (kept: the log moves on even if a store refuses it)."""
        return self._seal(self.state, trigger, to_state, dict(data))

    def take(self, n: int) -> list[Event]:
        return [self.next(n=i) for i in range(n)]

    def forget(self, n: int) -> None:
        """Drop the last `n` events (ones a store refused), so the next event follows what was stored."""
        del self.events[len(self.events) - n :]

    def _seal(self, source: str | None, trigger: str, target: str, data: dict[str, Any]) -> Event:
        event = seal(
            task_id=self.task_id,
            seq=self.seq + 1,
            at=T0 + timedelta(seconds=self.seq),
            actor="ann",
            from_state=source,
            trigger=trigger,
            to_state=target,
            data=as_event_data(data),
            prev_hash=self.events[-1].hash if self.events else GENESIS_HASH,
        )
        self.events.append(event)
        return event


def started(store: Store, task_id: str, **row: Any) -> Log:
    """A task created in `store` with its start event; `row`: its status and next_run_at."""
    log = Log(task_id)
    store.create(log.row(**row), log.first)
    return log


def ended(store: Store, task_id: str, workflow: str = "refund") -> Log:
    """A task created runnable in `store`, then ended by its next append."""
    log = Log(task_id, workflow=workflow)
    store.create(log.row(next_run_at=T0), log.first)
    store.append(task_id, 1, [log.next("finish", "done")], status="terminal")
    return log


LATER = T0 + timedelta(hours=1)


def refusal(call: object) -> ConcurrencyConflict:
    """The conflict `call` is refused with."""
    assert callable(call)
    with pytest.raises(ConcurrencyConflict) as caught:
        call()
    return caught.value
