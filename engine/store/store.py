"""The event store: the only code that knows the database.

It speaks in verbs (`create`, `append`, `load`, `events`, `snapshots`) and
holds every SQL statement Railyard runs. A database error becomes one of our
codes here, at the boundary; the raw driver text goes to the log only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, DateTime, Integer, Row, Text, column, insert, select, text, update
from sqlalchemy import exc as sa_exc

from engine.canonical import canonical_json, now, utc
from engine.errors import Code, ConcurrencyConflict, RailyardError, StoreError
from engine.events import Event
from engine.store.database import WRITE, make_engine
from engine.store.schema import events, snapshots, tasks

log = logging.getLogger("railyard.store")

# k = 0: the task row; k = 1: its newest snapshot (at or below the row's seq); k = 2: the events after it.
_LOAD = text(
    """
    WITH t AS (
        SELECT task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at
        FROM tasks WHERE task_id = :task_id
    ), s AS (
        SELECT seq, hash, doc FROM snapshots
        WHERE task_id = :task_id AND seq <= (SELECT seq FROM t)
        ORDER BY seq DESC LIMIT 1
    )
    SELECT 0 AS k, seq, workflow AS t1, digest AS t2, state AS t3, status AS t4, last_hash AS t5,
           task_id AS t6, CAST(NULL AS TEXT) AS t7, version AS n1, created_at AS ts1, updated_at AS ts2
    FROM t
    UNION ALL
    SELECT 1, seq, hash, doc, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM s
    UNION ALL
    SELECT 2, e.seq, e.actor, e.from_state, e.trigger, e.to_state, e.data, e.prev_hash, e.hash, NULL, e.at, NULL
    FROM events e
    WHERE e.task_id = :task_id AND e.seq > COALESCE((SELECT seq FROM s), 0) AND e.seq <= (SELECT seq FROM t)
    ORDER BY k, seq
    """
).columns(
    column("k", Integer), column("seq", Integer),
    *(column(f"t{i}", Text) for i in range(1, 8)),
    column("n1", Integer), column("ts1", DateTime(timezone=True)), column("ts2", DateTime(timezone=True)),
)

@dataclass(frozen=True, slots=True)
class TaskRow:
    """The `tasks` row: the head of a task's log as the last append left it."""

    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    status: str
    seq: int
    last_hash: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Snapshot:
    task_id: str
    seq: int
    hash: str
    doc: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """What `load` read in one consistent view: the row, the newest snapshot, and the events after it."""

    row: TaskRow
    snapshot: Snapshot | None
    events: list[Event]


class Store:
    """Durable, append-only task logs with optimistic concurrency, on SQLite or PostgreSQL."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        self.dialect = self.engine.dialect.name
        self._pg_append_sql: dict[tuple[int, bool], str] = {}

    def close(self) -> None:
        self.engine.dispose()

    # -- writes ---------------------------------------------------------
    def create(self, row: TaskRow, first: Event) -> None:
        """Insert a new task and its `start` event together, or neither."""
        with self._errors(), self._writer() as conn:
            conn.execute(insert(tasks).values(**_row_values(row)))
            conn.execute(insert(events).values(**_event_values(first)))

    def append(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        *,
        status: str,
        snapshot: tuple[int, str, str] | None = None,
    ) -> None:
        """Write `new_events` (seq `expected_seq + 1 ...`) and move the task row, in one transaction.

        The task row is updated `WHERE seq = expected_seq`; if another writer got
        there first nothing at all is written and `ConcurrencyConflict` is raised.
        `snapshot` is `(seq, hash, doc)` of the folded state to cache.
        """
        if not new_events:
            raise ValueError("append needs at least one event")
        for offset, ev in enumerate(new_events, start=1):
            if ev.task_id != task_id or ev.seq != expected_seq + offset:
                raise ValueError(f"event {ev.seq} of {ev.task_id} does not follow seq {expected_seq} of {task_id}")
        with self._errors():
            if self.dialect == "postgresql":
                self._append_postgres(task_id, expected_seq, new_events, status, snapshot)
            else:
                self._append_generic(task_id, expected_seq, new_events, status, snapshot)

    def _append_generic(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        status: str,
        snapshot: tuple[int, str, str] | None,
    ) -> None:
        last = new_events[-1]
        at = now()
        with self._writer() as conn:
            result = conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id, tasks.c.seq == expected_seq)
                .values(seq=last.seq, state=last.to_state, status=status, last_hash=last.hash, updated_at=at)
            )
            if result.rowcount != 1:
                actual = conn.execute(select(tasks.c.seq).where(tasks.c.task_id == task_id)).scalar()
                raise ConcurrencyConflict(task_id, expected_seq, actual)
            conn.execute(insert(events), [_event_values(e) for e in new_events])
            if snapshot is not None:
                conn.execute(insert(snapshots).values(_snapshot_values(task_id, snapshot, at)))

    def _append_postgres(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        status: str,
        snapshot: tuple[int, str, str] | None,
    ) -> None:
        # One statement, one round trip, its own transaction (autocommit): the
        # UPDATE ... WHERE seq = expected gates the INSERTs, which select from it.
        last = new_events[-1]
        at = now()
        params: list[Any] = [last.seq, last.to_state, status, last.hash, at, task_id, expected_seq]
        for ev in new_events:
            params.extend(
                (ev.seq, ev.at, ev.actor, ev.from_state, ev.trigger, ev.to_state, canonical_json(ev.data),
                 ev.prev_hash, ev.hash)
            )
        if snapshot is not None:
            params.extend((snapshot[0], snapshot[1], snapshot[2], at))
        sql = self._pg_append_statement(len(new_events), snapshot is not None)
        with self.engine.connect() as conn:
            written = conn.exec_driver_sql(sql, tuple(params)).scalar()
            if not written:
                actual = conn.execute(select(tasks.c.seq).where(tasks.c.task_id == task_id)).scalar()
                raise ConcurrencyConflict(task_id, expected_seq, actual)

    def _pg_append_statement(self, n_events: int, with_snapshot: bool) -> str:
        key = (n_events, with_snapshot)
        sql = self._pg_append_sql.get(key)
        if sql is None:
            row = "(%s::int, %s::timestamptz, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text)"
            values = ", ".join([row] * n_events)
            snap = (
                ", snap AS (INSERT INTO snapshots (task_id, seq, hash, doc, created_at)"
                " SELECT upd.task_id, %s::int, %s::text, %s::text, %s::timestamptz FROM upd)"
                if with_snapshot
                else ""
            )
            sql = (
                "WITH upd AS (UPDATE tasks SET seq = %s, state = %s, status = %s, last_hash = %s, updated_at = %s"
                " WHERE task_id = %s AND seq = %s RETURNING task_id),"
                " ev AS (INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data,"
                " prev_hash, hash) SELECT upd.task_id, v.seq, v.at, v.actor, v.from_state, v.trigger, v.to_state,"
                " v.data, v.prev_hash, v.hash FROM upd CROSS JOIN (VALUES " + values + ") AS v(seq, at, actor,"
                " from_state, trigger, to_state, data, prev_hash, hash) RETURNING 1)" + snap +
                " SELECT count(*) FROM ev"
            )
            self._pg_append_sql[key] = sql
        return sql

    # -- reads ----------------------------------------------------------
    def row(self, task_id: str) -> TaskRow | None:
        with self._errors(), self._reader() as conn:
            found = conn.execute(select(tasks).where(tasks.c.task_id == task_id)).first()
        return _task_row(found) if found is not None else None

    def load(self, task_id: str) -> Loaded | None:
        """The task row, its newest snapshot and the events after that snapshot up to the row's seq.

        One statement, so one round trip and one consistent view even without a
        transaction: the row, the snapshot and the events can never disagree
        because a writer slipped in between two reads.
        """
        with self._errors(), self._reader() as conn:
            rows = conn.execute(_LOAD, {"task_id": task_id}).all()
        if not rows or rows[0].k != 0:
            return None
        head = rows[0]
        row = TaskRow(task_id=head.t6, workflow=head.t1, version=head.n1, digest=head.t2, state=head.t3,
                      status=head.t4, seq=head.seq, last_hash=head.t5, created_at=utc(head.ts1),
                      updated_at=utc(head.ts2))
        snap = None
        tail: list[Event] = []
        for r in rows[1:]:
            if r.k == 1:
                snap = Snapshot(task_id, r.seq, r.t1, r.t2)
            else:
                tail.append(Event(task_id=task_id, seq=r.seq, at=utc(r.ts1), actor=r.t1, from_state=r.t2,
                                  trigger=r.t3, to_state=r.t4, data=json.loads(r.t5), prev_hash=r.t6, hash=r.t7))
        return Loaded(row, snap, tail)

    def events(self, task_id: str, after_seq: int = 0, upto_seq: int | None = None) -> list[Event]:
        """The task's events with `after_seq < seq <= upto_seq`, in order."""
        with self._errors(), self._reader() as conn:
            return self._events(conn, task_id, after_seq, upto_seq)

    def snapshots(self, task_id: str) -> list[Snapshot]:
        with self._errors(), self._reader() as conn:
            rows = conn.execute(
                select(snapshots.c.seq, snapshots.c.hash, snapshots.c.doc)
                .where(snapshots.c.task_id == task_id)
                .order_by(snapshots.c.seq)
            ).all()
        return [Snapshot(task_id, r.seq, r.hash, r.doc) for r in rows]

    def task_ids(self, *, workflow: str | None = None, status: str | None = None) -> list[str]:
        query = select(tasks.c.task_id).order_by(tasks.c.created_at, tasks.c.task_id)
        if workflow is not None:
            query = query.where(tasks.c.workflow == workflow)
        if status is not None:
            query = query.where(tasks.c.status == status)
        with self._errors(), self._reader() as conn:
            return list(conn.execute(query).scalars())

    @staticmethod
    def _events(conn: Connection, task_id: str, after: int, upto: int | None) -> list[Event]:
        query = select(events).where(events.c.task_id == task_id, events.c.seq > after).order_by(events.c.seq)
        if upto is not None:
            query = query.where(events.c.seq <= upto)
        return [_event(r) for r in conn.execute(query)]

    # -- plumbing -------------------------------------------------------
    @contextmanager
    def _writer(self) -> Iterator[Connection]:
        """A real transaction: on SQLite it takes the write lock up front; on PostgreSQL it leaves autocommit."""
        options: dict[str, Any] = {WRITE: True}
        if self.dialect == "postgresql":
            options["isolation_level"] = "READ COMMITTED"
        with self.engine.connect().execution_options(**options) as conn, conn.begin():
            yield conn

    @contextmanager
    def _reader(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Map driver errors to our codes; the raw message goes to the log, cut to 200 characters."""
        try:
            yield
        except RailyardError:
            raise
        except sa_exc.IntegrityError as exc:
            log.warning("integrity error: %.200s", exc.orig)
            raise StoreError("the database refused the write (constraint violated)") from None
        except sa_exc.DBAPIError as exc:
            text = str(exc.orig).lower()
            log.error("database error: %.200s", exc.orig)
            if "no such table" in text or ("relation" in text and "does not exist" in text):
                raise StoreError(
                    "the database has no Railyard schema; run `railyard db upgrade`", code=Code.SCHEMA_MISSING
                ) from None
            raise StoreError(f"database error ({type(exc.orig).__name__})") from None


def _row_values(row: TaskRow) -> dict[str, Any]:
    return {
        "task_id": row.task_id,
        "workflow": row.workflow,
        "version": row.version,
        "digest": row.digest,
        "state": row.state,
        "status": row.status,
        "seq": row.seq,
        "last_hash": row.last_hash,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def _event_values(ev: Event) -> dict[str, Any]:
    return {
        "task_id": ev.task_id,
        "seq": ev.seq,
        "at": ev.at,
        "actor": ev.actor,
        "from_state": ev.from_state,
        "trigger": ev.trigger,
        "to_state": ev.to_state,
        "data": canonical_json(ev.data),
        "prev_hash": ev.prev_hash,
        "hash": ev.hash,
    }


def _snapshot_values(task_id: str, snapshot: tuple[int, str, str], at: datetime) -> dict[str, Any]:
    seq, hash_, doc = snapshot
    return {"task_id": task_id, "seq": seq, "hash": hash_, "doc": doc, "created_at": at}


def _task_row(r: Row[Any]) -> TaskRow:
    return TaskRow(
        task_id=r.task_id,
        workflow=r.workflow,
        version=r.version,
        digest=r.digest,
        state=r.state,
        status=r.status,
        seq=r.seq,
        last_hash=r.last_hash,
        created_at=utc(r.created_at),
        updated_at=utc(r.updated_at),
    )


def _event(r: Row[Any]) -> Event:
    return Event(
        task_id=r.task_id,
        seq=r.seq,
        at=utc(r.at),
        actor=r.actor,
        from_state=r.from_state,
        trigger=r.trigger,
        to_state=r.to_state,
        data=json.loads(r.data),
        prev_hash=r.prev_hash,
        hash=r.hash,
    )
