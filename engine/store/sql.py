"""The SQL store: the only code that knows the database, over SQLite or PostgreSQL.

It speaks the verbs of `engine.store.protocol.Store` (`create`, `append`,
`load`, `events`, `snapshots`, ...). What is the same on both databases is
SQLAlchemy Core here; what differs (the hot statements written out by hand,
how a write or an audit read begins) is in one module per dialect,
`engine.store.sqlite` and `engine.store.postgres`, under the same names
(`Dialect`), chosen once when the store is built. A database error becomes one
of our codes here, at the boundary; the raw driver text goes to the log only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Row,
    Select,
    Table,
    and_,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
    null,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.sql import ColumnElement, Executable

from engine.core.canonical import canonical_json, format_instant, now, parse_instant, utc
from engine.core.checkpoints import Head, Header
from engine.core.errors import Code, RailyardError, StoreError
from engine.core.events import Event, with_stored_data
from engine.core.remarks import REMARKS
from engine.core.rows import ArchiveRef, Claim, Loaded, Snapshot, TaskRow, WorkerReport
from engine.core.webhooks import Outgoing
from engine.store import postgres, sqlite
from engine.store.database import connection_problem, make_engine, reading, writing
from engine.store.decode import audit_data, audit_instant, read_instant, stored_data
from engine.store.flow_sql import Statements
from engine.store.protocol import (
    AUDIT_PAGE,
    NO_DEADLINE,
    ListedTask,
    QueuedTask,
    QueueQuery,
    TaskQuery,
    WorkClaim,
    conflict,
)
from engine.store.schema import (
    archive_permits,
    blocked_counts,
    checkpoints,
    events,
    snapshots,
    task_claims,
    task_fields,
    tasks,
    terminal_counts,
    webhook_outbox,
    workers,
)
from engine.store.sql_flow import SqlFlow
from engine.store.sql_people import SqlPeople
from engine.store.sql_webhooks import SqlWebhooks, outbox_rows
from engine.store.wakeups import Listener

log = logging.getLogger("railyard.store")

#: An audit read's two ways to run a statement: all its rows at once, or streamed.
FetchAll = Callable[[str, list[Any]], list[Any]]
Stream = Callable[[str, list[Any]], Generator[Any]]


class Dialect(Protocol):
    """What `engine.store.sqlite` and `engine.store.postgres` each define, under these names.

    `raw` is a DBAPI connection from the pool (`Engine.raw_connection`), `cur` its cursor.
    """

    #: Whether the database tells listeners when a task becomes claimable (`engine.store.wakeups`).
    SUPPORTS_NOTIFY: bool
    #: The statement that gives a lease back. Parameters: step succeeded, task id, epoch.
    RELEASE: str
    #: Every task's (task_id, seq, last_hash), ordered by the bytes of the task id: a checkpoint's leaves.
    HEADS: str
    LOG_HEADS: str
    #: The flow-control statements (`engine.store.flow_sql`, `engine.store.sql_flow`).
    FLOW: Statements

    def shared(self, url: str) -> bool:
        """Whether another process can open the database at `url` (forked replay jobs open it anew)."""
        ...

    def load(self, cur: Any, task_id: str) -> list[Any]: ...

    def load_many(self, cur: Any, task_ids: Sequence[str]) -> list[list[Any]]: ...

    def append(
        self,
        raw: Any,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        status: str,
        snapshot: tuple[int, str, str] | None,
        next_run_at: datetime | None,
        lease_epoch: int | None,
        outbox: Sequence[Outgoing] = (),
    ) -> None: ...

    def claim(
        self, raw: Any, owner: str, until: datetime, at: datetime, limit: int, workflows: Sequence[str] | None
    ) -> list[Claim]: ...

    def upsert(self, table: Table, values: dict[str, Any], key: str, refresh: Sequence[str]) -> Executable: ...

    def instant(self, at: datetime) -> Any: ...

    def audit_ids(self, ids: list[str]) -> list[Any]: ...

    def audit_page(self, n_ids: int, after: bool, workflow: bool, since: bool) -> str: ...

    def audit_logs(self, n_ids: int, snapshots: bool, upto: bool, lower: bool = False) -> str: ...

    def audit_session(self, raw: Any) -> AbstractContextManager[tuple[FetchAll, Stream]]: ...

    def queue_due(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        """A blocked task's deadline for the work queue's order, with no deadline sorting last."""
        ...

    def id_prefix(self, column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
        """`column` starts with `prefix`, in the form this database's index on the column serves."""
        ...


#: The dialect modules by SQLAlchemy's backend name.
DIALECTS: dict[str, Dialect] = {"sqlite": sqlite, "postgresql": postgres}


class SqlStore(SqlFlow, SqlWebhooks, SqlPeople):
    """Durable, append-only task logs with optimistic concurrency, on SQLite or PostgreSQL; with `SqlFlow`, the
    rows that pace model calls too (`engine.store.protocol.FlowStore`); with `SqlWebhooks`, webhook subscriptions
    and deliveries; with `SqlPeople`, page sessions, failed logins, people and tokens."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        found = DIALECTS.get(self.engine.dialect.name)
        if found is None:
            raise ValueError(f"Railyard stores tasks in SQLite or PostgreSQL, not {self.engine.dialect.name}")
        self.sql: Dialect = found
        self.supports_notify = found.SUPPORTS_NOTIFY
        self.supports_fork = found.shared(url)
        #: Pools a forked process inherited (`after_fork`).
        self._inherited: list[Any] = []

    def close(self) -> None:
        self.engine.dispose()

    # -- writes ---------------------------------------------------------
    def create(
        self, row: TaskRow, first: Event, fields: Mapping[str, str] | None = None, outbox: Sequence[Outgoing] = ()
    ) -> None:
        """Insert a new task and its `start` event together, or neither; its starter and searchable fields, and
        the webhook messages its start brings, too."""
        with self._errors(), self._writer() as conn:
            # The tenant only when there is one: a task of none is the row it always was (migration 0011).
            within: dict[str, Any] = {"tenant": row.tenant} if row.tenant is not None else {}
            if row.priority is not None:
                within["priority"] = row.priority
            conn.execute(insert(tasks).values(**_row_values(row), started_by=first.actor, **within))
            conn.execute(insert(events).values(**_event_values(first)))
            if fields:
                rows = [{"task_id": row.task_id, "name": k, "value": v} for k, v in fields.items()]
                conn.execute(insert(task_fields), rows)
            if outbox:
                conn.execute(insert(webhook_outbox), outbox_rows(outbox))

    def repin(
        self,
        task_id: str,
        expected_seq: int,
        event: Event,
        *,
        version: int,
        digest: str,
        status: str,
        next_run_at: datetime | None,
    ) -> None:
        """Append a `migrate` event and pin the task row to another version, in one transaction (or neither).

        Rare (an operator's command), so plain SQLAlchemy; conflicts like `append` when the task moved.
        """
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id, tasks.c.seq == expected_seq)
                .values(
                    seq=event.seq,
                    state=event.to_state,
                    status=status,
                    last_hash=event.hash,
                    updated_at=now(),
                    next_run_at=next_run_at,
                    version=version,
                    digest=digest,
                )
            )
            if moved.rowcount != 1:
                found = conn.execute(select(tasks.c.seq, tasks.c.lease_epoch).where(tasks.c.task_id == task_id))
                raise conflict(task_id, expected_seq, None, found.first())
            conn.execute(insert(events).values(**_event_values(event)))

    def append(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        *,
        status: str,
        snapshot: tuple[int, str, str] | None = None,
        next_run_at: datetime | None = None,
        lease_epoch: int | None = None,
        outbox: Sequence[Outgoing] = (),
    ) -> None:
        """Write `new_events` (seq `expected_seq + 1 ...`) and move the task row, in one transaction; the webhook
        messages they bring (`outbox`) in the same one.

        The task row is updated `WHERE seq = expected_seq`; if another writer got
        there first nothing at all is written and `ConcurrencyConflict` is raised.
        With `lease_epoch` (a worker's fencing token) the row must also still carry
        that epoch: a worker whose lease was taken over gets `LeaseLost`.
        `snapshot` is `(seq, hash, doc)` of the folded state to cache; `next_run_at`
        is when a worker should look at the task next (None: only a human or signal moves it).
        """
        if not new_events:
            raise ValueError("append needs at least one event")
        for offset, ev in enumerate(new_events, start=1):
            if ev.task_id != task_id or ev.seq != expected_seq + offset:
                raise ValueError(f"event {ev.seq} of {ev.task_id} does not follow seq {expected_seq} of {task_id}")
        with self._errors():
            raw = self.engine.raw_connection()
            try:
                self.sql.append(
                    raw, task_id, expected_seq, new_events, status, snapshot, next_run_at, lease_epoch, outbox
                )
            finally:
                raw.close()

    # -- leases ---------------------------------------------------------
    def claim(
        self,
        owner: str,
        *,
        limit: int,
        lease_seconds: float,
        workflows: Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> list[Claim]:
        """Lease up to `limit` due tasks to `owner`, the longest-due first."""
        at = at or now()
        until = at + timedelta(seconds=lease_seconds)
        with self._errors():
            raw = self.engine.raw_connection()
            try:
                return self.sql.claim(raw, owner, until, at, limit, workflows)
            finally:
                raw.close()

    def heartbeat(self, owner: str, task_ids: Sequence[str], *, lease_seconds: float) -> frozenset[str]:
        """Extend the leases `owner` still holds on `task_ids`, in one statement; returns the ids it holds.

        By primary key, so a heartbeat never scans the table. A lease another worker took
        over carries that worker's name now, so it is not extended.
        """
        if not task_ids:
            return frozenset()
        with self._errors(), self._writer() as conn:
            result = conn.execute(
                update(tasks)
                .where(tasks.c.task_id.in_(list(task_ids)), tasks.c.lease_owner == owner)
                .values(lease_expires_at=now() + timedelta(seconds=lease_seconds))
                .returning(tasks.c.task_id)
            )
            return frozenset(result.scalars())

    def release(self, task_id: str, epoch: int, *, step_succeeded: bool = True) -> None:
        """Give the lease back (only if still held at `epoch`); the epoch stays, so old appends stay fenced.

        A step that went through clears the task's count of consecutive failures.
        """
        # Once per claim: one statement on the driver connection (autocommit), not a three-round-trip transaction.
        with self._errors():
            raw = self.engine.raw_connection()
            try:
                cur: Any = raw.cursor()
                at = self.sql.instant(now())
                cur.execute(self.sql.RELEASE, (step_succeeded, at, at, task_id, epoch))
            finally:
                raw.close()

    def postpone(self, task_id: str, epoch: int, until: datetime, *, failed: bool = False) -> int:
        """Move a held task's next look to `until`; with `failed`, count one more failed step. Returns the count."""
        values: dict[str, Any] = {"next_run_at": until}
        if failed:
            values["failures"] = tasks.c.failures + 1
        with self._errors(), self._writer() as conn:
            conn.execute(update(tasks).where(tasks.c.task_id == task_id, tasks.c.lease_epoch == epoch).values(**values))
            count = conn.execute(select(tasks.c.failures).where(tasks.c.task_id == task_id)).scalar()
        return int(count or 0)

    def wake(self, task_id: str, state: str, at: datetime) -> bool:
        """Make a task blocked in `state` due at `at` unless it is due sooner; by primary key, one statement."""
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id, tasks.c.state == state, tasks.c.status == "blocked")
                .values(
                    next_run_at=case(
                        (and_(tasks.c.next_run_at.is_not(None), tasks.c.next_run_at < at), tasks.c.next_run_at),
                        else_=at,
                    )
                )
            )
            return bool(moved.rowcount)

    # -- archive --------------------------------------------------------
    def archivable(self, before: datetime, *, limit: int) -> list[TaskRow]:
        """Ended tasks whose last event is older than `before` and whose events are still here, oldest first."""
        query = (
            select(tasks)
            .where(tasks.c.status == "terminal", tasks.c.updated_at < before, tasks.c.archived_at.is_(None))
            .order_by(tasks.c.updated_at, tasks.c.task_id)
            .limit(limit)
        )
        with self._errors(), self._reader() as conn:
            return [_task_row(r) for r in conn.execute(query)]

    def mark_archived(self, archived: Sequence[tuple[str, int]], file: str, sha256: str) -> int:
        """Tombstone each (task_id, seq) and delete its events and snapshots, in one transaction.

        A task whose row moved since it was exported (another seq) is left alone.
        Returns how many tasks were archived.
        """
        at = now()
        moved = 0
        with self._errors(), self._writer() as conn:
            # The one path allowed past the append-only triggers (migration 0007) says so inside its transaction;
            # the permit is gone before the commit, and no other transaction ever sees it.
            conn.execute(insert(archive_permits).values(holder="railyard archive"))
            for task_id, seq in archived:
                done = conn.execute(
                    update(tasks)
                    .where(
                        tasks.c.task_id == task_id,
                        tasks.c.seq == seq,
                        tasks.c.status == "terminal",
                        tasks.c.archived_at.is_(None),
                    )
                    .values(archived_at=at, archive_file=file, archive_sha256=sha256)
                )
                if done.rowcount == 1:
                    conn.execute(delete(snapshots).where(snapshots.c.task_id == task_id))
                    conn.execute(delete(events).where(events.c.task_id == task_id))
                    moved += 1
            conn.execute(delete(archive_permits))
        return moved

    def archive_of(self, task_id: str) -> ArchiveRef | None:
        """The archive holding the task's events, if it was archived."""
        query = select(tasks.c.archive_file, tasks.c.archive_sha256, tasks.c.archived_at).where(
            tasks.c.task_id == task_id, tasks.c.archived_at.is_not(None)
        )
        with self._errors(), self._reader() as conn:
            found = conn.execute(query).first()
        return ArchiveRef(task_id, found.archive_file, found.archive_sha256, utc(found.archived_at)) if found else None

    def archived(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[tuple[TaskRow, ArchiveRef]]:
        """Archived tasks (of `workflow`, whose row changed at or after `since`) and their archives, file by file.

        In keyset pages ordered by (archive file, task id): replay reads each file once for its tasks.
        """
        after: tuple[str, str] | None = None
        while True:
            query = select(tasks).where(tasks.c.archived_at.is_not(None))
            if workflow is not None:
                query = query.where(tasks.c.workflow == workflow)
            if since is not None:
                query = query.where(tasks.c.updated_at >= utc(since))  # UTC: SQLite compares the stored text
            if after is not None:
                query = query.where(tuple_(tasks.c.archive_file, tasks.c.task_id) > tuple_(*after))
            query = query.order_by(tasks.c.archive_file, tasks.c.task_id).limit(page_size)
            with self._errors(), self._reader() as conn:
                found = list(conn.execute(query))
            for r in found:
                yield _task_row(r), ArchiveRef(r.task_id, r.archive_file, r.archive_sha256, utc(r.archived_at))
            if len(found) < page_size:
                return
            after = (found[-1].archive_file, found[-1].task_id)

    # -- reads ----------------------------------------------------------
    def row(self, task_id: str) -> TaskRow | None:
        with self._errors(), self._reader() as conn:
            found = conn.execute(select(tasks).where(tasks.c.task_id == task_id)).first()
        return _task_row(found) if found is not None else None

    def load(self, task_id: str) -> Loaded | None:
        """The task row, its newest snapshot and the events after that snapshot up to the row's seq.

        One statement (one round trip, one consistent view) on the driver connection.
        """
        with self._errors():
            raw = self.engine.raw_connection()
            try:
                rows = self.sql.load(raw.cursor(), task_id)  # the driver's own cursor (psycopg accepts prepare=)
            finally:
                raw.close()
        return _loaded(rows)

    def load_many(self, task_ids: Sequence[str]) -> dict[str, Loaded]:
        """`load` of each task, in one statement; a task not found is not in the answer."""
        if not task_ids:
            return {}
        with self._errors():
            raw = self.engine.raw_connection()
            try:
                found = self.sql.load_many(raw.cursor(), task_ids)
            finally:
                raw.close()
        return {loaded.row.task_id: loaded for rows in found if (loaded := _loaded(rows)) is not None}

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

    # -- audit reads ----------------------------------------------------
    def audit_stream(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        workflow: str | None = None,
        since: datetime | None = None,
        with_snapshots: bool = True,
        upto_seq: int | None = None,
        from_seq: int | None = None,
        page_size: int = AUDIT_PAGE,
    ) -> Iterator[TaskRow | Event | Snapshot]:
        """Task rows in task_id order, each followed by its events (and snapshots) in seq order.

        Replay, export and as-of read through this so that memory stays flat however
        long a log is: task rows come in keyset pages, and each page's events and
        snapshots stream from two cursors (server-side on PostgreSQL), merged in log
        order (`in_log_order`) while the caller checks them. A page is read in one
        read-only transaction (REPEATABLE READ on PostgreSQL), so a row, its events
        and its snapshots are one consistent view even while workers append. `since`
        keeps tasks whose row changed at or after it.
        """
        ids = list(task_ids) if task_ids is not None else []
        if task_ids is not None and not ids:
            return
        after: str | None = None
        while True:
            rows: list[TaskRow] = []
            with self._errors(), self._audit_session() as (fetch_all, stream):
                page, params = self._audit_page(ids, after, workflow, since, page_size)
                rows = [
                    TaskRow(
                        r[0],
                        r[1],
                        r[2],
                        r[3],
                        r[4],
                        r[5],
                        r[6],
                        r[7],
                        read_instant(r[8]),
                        read_instant(r[9]),
                        tenant=r[10],
                    )
                    for r in fetch_all(page, params)
                ]
                if not rows:
                    return
                page_ids = [r.task_id for r in rows]
                params = [*self.sql.audit_ids(page_ids), *(b for b in (from_seq, upto_seq) if b is not None)]
                bounds = (upto_seq is not None, from_seq is not None)
                logs = stream(self.sql.audit_logs(len(page_ids), False, *bounds), params)
                if with_snapshots:
                    logs = in_log_order(
                        logs,
                        stream(self.sql.audit_logs(len(page_ids), True, *bounds), params),
                        {tid: n for n, tid in enumerate(page_ids)},
                    )
                heads = iter(rows)
                head: TaskRow | None = None
                try:
                    for k, tid, seq, at, actor, source, trigger, target, data, prev, digest in logs:
                        while head is None or head.task_id != tid:  # the rows of tasks before this one first
                            head = next(heads, None)
                            if head is None:
                                raise StoreError(
                                    f"audit read: a log row of task {tid} out of its page's order",
                                    code=Code.DATABASE_ERROR,
                                )
                            yield head
                        if k == 0:
                            yield with_stored_data(
                                Event(
                                    tid,
                                    seq,
                                    at if type(at) is datetime and at.tzinfo is UTC else audit_instant(at),
                                    actor,
                                    source,
                                    trigger,
                                    target,
                                    audit_data(data),
                                    prev,
                                    digest,
                                ),
                                data,
                            )
                        else:
                            yield Snapshot(tid, seq, digest, data)
                finally:
                    logs.close()  # before the transaction ends: a server-side cursor lives only inside it
                yield from heads  # tasks after the last one with a log row (a task always has one)
            if len(rows) < page_size:
                return
            after = rows[-1].task_id

    def audit_pages(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[list[str]]:
        """The ids `audit_stream` would visit, a keyset page at a time (what parallel replay hands out)."""
        after: str | None = None
        while True:
            page, params = self._audit_page([], after, workflow, since, page_size)
            with self._errors(), self._audit_session() as (fetch_all, _):
                ids = [r[0] for r in fetch_all(page, params)]
            if ids:
                yield ids
            if len(ids) < page_size:
                return
            after = ids[-1]

    def _audit_page(
        self, ids: list[str], after: str | None, workflow: str | None, since: datetime | None, page_size: int
    ) -> tuple[str, list[Any]]:
        """The keyset page query of task rows that `audit_stream` and `audit_pages` read, with its parameters."""
        params: list[Any] = self.sql.audit_ids(ids) if ids else []
        params += [after] if after is not None else []
        params += [workflow] if workflow is not None else []
        if since is not None:
            params.append(self.sql.instant(since))
        params.append(page_size)
        return self.sql.audit_page(len(ids), after is not None, workflow is not None, since is not None), params

    def snapshot_seqs(self, task_id: str) -> list[int]:
        """The seqs the task has snapshots at, ascending: where a long log can be cut for parallel replay."""
        query = select(snapshots.c.seq).where(snapshots.c.task_id == task_id).order_by(snapshots.c.seq)
        with self._errors(), self._reader() as conn:
            return [int(seq) for seq in conn.execute(query).scalars()]

    def seq_at(self, task_id: str, at: datetime) -> int | None:
        """The seq of the task's last event written at or before `at` (None: the task did not exist yet)."""
        # In UTC: SQLite stores times as text, which an offset would silently shift.
        query = select(func.max(events.c.seq)).where(events.c.task_id == task_id, events.c.at <= utc(at))
        with self._errors(), self._reader() as conn:
            found = conn.execute(query).scalar()
        return int(found) if found is not None else None

    @contextmanager
    def _audit_session(self) -> Iterator[tuple[FetchAll, Stream]]:
        """One read-only transaction: a `fetch_all(sql, params)` and a streaming `stream(sql, params)` in it."""
        raw = self.engine.raw_connection()
        try:
            with self.sql.audit_session(raw) as session:
                yield session
        finally:
            raw.close()

    def heads(self) -> Iterator[Head]:
        # One read-only snapshot (REPEATABLE READ on PostgreSQL), streamed: every head as of one instant.
        with self._errors(), self._audit_session() as (_fetch_all, stream):
            for task_id, seq, last_hash, tenant in stream(self.sql.HEADS, []):
                yield Head(task_id, seq, last_hash, tenant)

    def log_heads(self) -> Iterator[tuple[Head, str | None]]:
        with self._errors(), self._audit_session() as (_fetch_all, stream):
            for task_id, seq, last_hash, tenant, logged in stream(self.sql.LOG_HEADS, []):
                yield Head(task_id, seq, last_hash, tenant), logged

    def event_hashes(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        found: dict[tuple[str, int], str] = {}
        with self._errors(), self._reader() as conn:
            for start in range(0, len(keys), AUDIT_PAGE):
                page = list(keys[start : start + AUDIT_PAGE])
                query = select(events.c.task_id, events.c.seq, events.c.hash).where(
                    tuple_(events.c.task_id, events.c.seq).in_(page)
                )
                found.update({(t, s): h for t, s, h in conn.execute(query)})
        return found

    def record_checkpoint(self, header: Header, file: str) -> None:
        values = {
            "root": header.root,
            "tree_size": header.tree_size,
            "at": parse_instant(header.at),
            "previous_root": header.previous_root,
            "key_id": header.key_id,
            "file": file,
        }
        with self._errors(), self._writer() as conn:
            conn.execute(insert(checkpoints).values(**values))

    def last_checkpoint(self) -> tuple[Header, str] | None:
        query = select(checkpoints).order_by(checkpoints.c.at.desc(), checkpoints.c.tree_size.desc()).limit(1)
        with self._errors(), self._reader() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        header = Header(row.tree_size, row.root, format_instant(utc(row.at)), row.previous_root, row.key_id)
        return header, row.file

    def task_ids(self, *, workflow: str | None = None, status: str | None = None) -> list[str]:
        query = select(tasks.c.task_id).order_by(tasks.c.created_at, tasks.c.task_id)
        if workflow is not None:
            query = query.where(tasks.c.workflow == workflow)
        if status is not None:
            query = query.where(tasks.c.status == status)
        with self._errors(), self._reader() as conn:
            return list(conn.execute(query).scalars())

    def task_ids_starting(
        self,
        prefix: str,
        *,
        limit: int = 2,
        workflows: Sequence[str] | None = None,
        tenants: Sequence[str] | None = None,
    ) -> list[str]:
        query = (
            select(tasks.c.task_id)
            # LIKE narrows (SQLite's ignores case), the substring decides: ids are compared as written.
            .where(tasks.c.task_id.startswith(prefix, autoescape=True))
            .where(func.substr(tasks.c.task_id, 1, len(prefix)) == prefix)
            .order_by(tasks.c.task_id)
            .limit(limit)
        )
        if workflows is not None:
            query = query.where(tasks.c.workflow.in_(list(workflows)))
        if tenants is not None:
            query = query.where(tasks.c.tenant.in_(list(tenants)))
        with self._errors(), self._reader() as conn:
            return list(conn.execute(query).scalars())

    def recent(
        self, *, workflow: str | None = None, state: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[TaskRow]:
        """Task rows, most recently changed first, at most `limit`: one bounded query for back-office lists."""
        query = select(tasks)
        if workflow:
            query = query.where(tasks.c.workflow == workflow)
        if state:
            query = query.where(tasks.c.state == state)
        if status:
            query = query.where(tasks.c.status == status)
        query = query.order_by(tasks.c.updated_at.desc(), tasks.c.task_id).limit(limit)
        with self._errors(), self._reader() as conn:
            return [_task_row(r) for r in conn.execute(query)]

    def list_statement(self, query: TaskQuery) -> Select[Any]:
        """The SELECT `list_tasks` runs (tests read its plan)."""
        where: list[ColumnElement[bool]] = []
        if query.workflow:
            where.append(tasks.c.workflow == query.workflow)
        if query.workflows is not None:
            where.append(tasks.c.workflow.in_(list(query.workflows)))
        if query.tenants is not None:
            where.append(tasks.c.tenant.in_(list(query.tenants)))
        if query.states:
            where.append(tasks.c.state.in_(list(query.states)))
        if query.status:
            where.append(tasks.c.status == query.status)
        if query.started_by:
            where.append(tasks.c.started_by == query.started_by)
        if query.created_from is not None:
            where.append(tasks.c.created_at >= query.created_from)
        if query.created_before is not None:
            where.append(tasks.c.created_at < query.created_before)
        found: list[Select[Any]] = []
        if query.field_value:
            found.append(select(task_fields.c.task_id).where(task_fields.c.value == query.field_value))
        if query.id_prefix:
            by_id = tasks.alias("by_id")
            found.append(select(by_id.c.task_id).where(self.sql.id_prefix(by_id.c.task_id, query.id_prefix)))
        if found:
            where.append(tasks.c.task_id.in_(union_all(*found) if len(found) > 1 else found[0]))
        if query.after is not None:
            where.append(_keyset(query.after, before=True))
        return (
            select(tasks)
            .where(*where)
            .order_by(tasks.c.created_at.desc(), tasks.c.task_id.desc())
            .limit(max(query.limit, 0))
        )

    def list_tasks(self, query: TaskQuery) -> list[ListedTask]:
        """One keyset page, newest first: each filter is a column of an index that ends in (created_at, task_id),
        so a page costs `limit` index entries however many tasks the table holds; a search starts from the
        field values' index and the task id's pattern index instead, and sorts only what it found."""
        statement = self.list_statement(query)
        with self._errors(), self._reader() as conn:
            rows = conn.execute(statement).all()
            ids = [r.task_id for r in rows]
            found: dict[str, dict[str, str]] = {}
            if ids:
                named = select(task_fields).where(task_fields.c.task_id.in_(ids)).order_by(task_fields.c.name)
                for f in conn.execute(named):
                    found.setdefault(f.task_id, {})[f.name] = f.value
        return [ListedTask(_task_row(r), r.started_by, found.get(r.task_id, {})) for r in rows]

    def blocked_in(
        self,
        states: Sequence[tuple[str, int, str]],
        *,
        after: str | None = None,
        limit: int | None = None,
        by_deadline: bool = False,
        waiting_before: datetime | None = None,
        tenants: Sequence[str] | None = None,
    ) -> list[str]:
        """Blocked tasks standing in one of `states` (workflow, version, state), oldest first (or nearest deadline
        first): the work queue reads these instead of loading every blocked task to find out where it stands."""
        if not states:
            return []
        # The status as a literal: the partial index of blocked tasks (migration 0010) then serves a generic plan too.
        query = select(tasks.c.task_id).where(
            tasks.c.status == literal_column("'blocked'"),
            tuple_(tasks.c.workflow, tasks.c.version, tasks.c.place).in_(list(states)),
        )
        if waiting_before is not None:
            query = query.where(tasks.c.waiting_since < waiting_before)
        if tenants is not None:
            query = query.where(tasks.c.tenant.in_(list(tenants)))
        if by_deadline:
            # No deadline sorts last: a far-off instant stands in for it, so the keyset stays one tuple comparison.
            due = func.coalesce(tasks.c.next_run_at, literal(NO_DEADLINE, type_=tasks.c.next_run_at.type))
            query = query.order_by(due, tasks.c.created_at, tasks.c.task_id)
            if after is not None:
                other = tasks.alias("cursor")
                last = other.c.task_id == after
                their_due = func.coalesce(other.c.next_run_at, literal(NO_DEADLINE, type_=other.c.next_run_at.type))
                theirs = tuple_(
                    select(their_due).where(last).scalar_subquery(),
                    select(other.c.created_at).where(last).scalar_subquery(),
                    after,
                )
                query = query.where(tuple_(due, tasks.c.created_at, tasks.c.task_id) > theirs)
        else:
            query = query.order_by(tasks.c.created_at, tasks.c.task_id)
        if after is not None and not by_deadline:
            query = query.where(_keyset(after, before=False))
        if limit is not None:
            query = query.limit(max(limit, 0))
        with self._errors(), self._reader() as conn:
            return list(conn.execute(query).scalars())

    def status_counts(self, at: datetime | None = None) -> list[dict[str, Any]]:
        """Per workflow and status: how many tasks, how many of them leased, and the oldest due time.

        The unfinished tasks are grouped through the partial index of them (`ix_tasks_due`); the ended ones are
        the sums of `terminal_counts`, which the database keeps (migration 0009). So the cost follows the live
        tasks, not the finished ones: in bench/scale.py 5.4 ms at 1,000,000 tasks (990,000 ended) against 7.0 at
        10,000, where the GROUP BY over the whole table it replaces took 209 ms against 2.8. An ended task holds
        no lease and is never due.
        """
        at = at or now()
        held = tasks.c.lease_expires_at > at
        leased = func.sum(case((held, 1), else_=0))
        # A held task that keeps moving stays due since it first became due (`still_due`): it is not waiting.
        waiting_due = func.min(case((held, null()), else_=tasks.c.next_run_at))
        live = (
            select(
                tasks.c.workflow,
                tasks.c.status,
                func.count().label("tasks"),
                leased.label("leased"),
                waiting_due.label("oldest_due"),
            )
            # A literal, not a parameter: a generic plan of a prepared statement must still prove ix_tasks_due's
            # predicate (a parameter could be any status), as the claim's SQL does.
            .where(tasks.c.status != literal_column("'terminal'"))
            .group_by(tasks.c.workflow, tasks.c.status)
        )
        ended_tasks = func.sum(terminal_counts.c.tasks)
        ended = (
            select(
                terminal_counts.c.workflow,
                literal("terminal", type_=tasks.c.status.type).label("status"),
                ended_tasks.label("tasks"),
                literal(0).label("leased"),
                null().label("oldest_due"),
            )
            .group_by(terminal_counts.c.workflow)
            .having(ended_tasks > 0)
        )
        both = union_all(live, ended).subquery()
        query = select(both).order_by(both.c.workflow, both.c.status)
        with self._errors(), self._reader() as conn:
            rows = conn.execute(query).all()
        return [
            {
                "workflow": r.workflow,
                "status": r.status,
                "tasks": int(r.tasks),
                "leased": int(r.leased or 0),
                "oldest_due": utc(r.oldest_due) if r.oldest_due is not None else None,
            }
            for r in rows
        ]

    # -- the work queue: pages, counts, claims ----------------------------
    def _queue_where(self, query: QueueQuery) -> list[ColumnElement[bool]]:
        """The blocked tasks `query` selects, its order and page aside: the status as a literal, so that the
        partial index of blocked tasks (migration 0010) serves a generic plan too."""
        where: list[ColumnElement[bool]] = [
            tasks.c.status == literal_column("'blocked'"),
            tuple_(tasks.c.workflow, tasks.c.version, tasks.c.place).in_(list(query.places)),
        ]
        if query.waiting_before is not None:
            where.append(tasks.c.waiting_since < query.waiting_before)
        if query.tenants is not None:
            where.append(tasks.c.tenant.in_(list(query.tenants)))
        found: list[Select[Any]] = []
        if query.field_value:
            found.append(select(task_fields.c.task_id).where(task_fields.c.value == query.field_value))
        if query.id_prefix:
            by_id = tasks.alias("by_id")
            found.append(select(by_id.c.task_id).where(self.sql.id_prefix(by_id.c.task_id, query.id_prefix)))
        if found:
            where.append(tasks.c.task_id.in_(union_all(*found) if len(found) > 1 else found[0]))
        return where

    def queue_page(self, query: QueueQuery) -> list[QueuedTask]:
        """A keyset page in the order asked: (key, created_at, task_id) compared as one tuple with the cursor
        task's own values, read by the same statement, so a cursor is a task id and a page costs its rows."""
        if not query.places:
            return []
        where = self._queue_where(query)
        key = _queue_key(tasks, query.sort, self.sql.queue_due)
        order = (key, tasks.c.created_at, tasks.c.task_id)
        if query.after is not None:
            other = tasks.alias("cursor")
            last = other.c.task_id == query.after
            theirs = tuple_(
                select(_queue_key(other, query.sort, self.sql.queue_due, cursor=True)).where(last).scalar_subquery(),
                select(other.c.created_at).where(last).scalar_subquery(),
                query.after,
            )
            mine = tuple_(*order)
            where.append(mine < theirs if query.descending else mine > theirs)
        statement = (
            select(tasks)
            .where(*where)
            .order_by(*(c.desc() if query.descending else c for c in order))
            .limit(max(query.limit, 0))
        )
        at = query.at or now()
        with self._errors(), self._reader() as conn:
            rows = conn.execute(statement).all()
            ids = [r.task_id for r in rows]
            named: dict[str, dict[str, str]] = {}
            heads: dict[str, Event] = {}
            claims: dict[str, WorkClaim] = {}
            if ids:
                fields_of = select(task_fields).where(task_fields.c.task_id.in_(ids)).order_by(task_fields.c.name)
                for f in conn.execute(fields_of):
                    named.setdefault(f.task_id, {})[f.name] = f.value
                at_head = select(events).where(
                    tuple_(events.c.task_id, events.c.seq).in_([(r.task_id, r.seq) for r in rows])
                )
                for e in conn.execute(at_head):
                    heads[e.task_id] = _event(e)
                live = select(task_claims).where(task_claims.c.task_id.in_(ids), task_claims.c.expires_at > at)
                for c in conn.execute(live):
                    claims[c.task_id] = _claim(c)
        return [
            QueuedTask(
                _task_row(r),
                r.started_by,
                named.get(r.task_id, {}),
                heads.get(r.task_id),
                claims[r.task_id] if r.task_id in claims and claims[r.task_id].seq == r.seq else None,
            )
            for r in rows
        ]

    def queue_counts(self, query: QueueQuery) -> dict[tuple[str, int, str], int]:
        """The sums of `blocked_counts`, which the database keeps per place and tenant (migration 0016): a few
        rows whatever the queue holds. A search or an age filter narrows the tasks first: those are counted with
        one GROUP BY over the partial index of blocked tasks."""
        if not query.places:
            return {}
        if query.waiting_before is None and not query.id_prefix and not query.field_value:
            c = blocked_counts.c
            kept = select(c.workflow, c.version, c.state, func.sum(c.tasks).label("n")).where(
                tuple_(c.workflow, c.version, c.state).in_(list(query.places))
            )
            if query.tenants is not None:
                kept = kept.where(c.tenant.in_(list(query.tenants)))
            statement = kept.group_by(c.workflow, c.version, c.state)
        else:
            statement = (
                select(tasks.c.workflow, tasks.c.version, tasks.c.place.label("state"), func.count().label("n"))
                .where(*self._queue_where(query))
                .group_by(tasks.c.workflow, tasks.c.version, tasks.c.place)
            )
        with self._errors(), self._reader() as conn:
            return {(r.workflow, int(r.version), r.state): int(r.n) for r in conn.execute(statement) if r.n}

    def claim_work(
        self, task_id: str, actor: str, *, at: datetime, until: datetime, take_over: str | None = None
    ) -> WorkClaim | None:
        """An UPDATE that wins only over a claim that is over (expired, or of a seq the task left), `actor`'s own,
        or, with a reason, anyone's; else an INSERT, whose key makes the second of two claimers lose; the claim
        that holds is then read back. Both databases decide the race on the row, so one claimer wins."""
        for _ in range(2):
            try:
                with self._errors(), self._writer() as conn:
                    seq = conn.execute(select(tasks.c.seq).where(tasks.c.task_id == task_id)).scalar()
                    if seq is None:
                        return None
                    held = conn.execute(select(task_claims).where(task_claims.c.task_id == task_id)).first()
                    # Live: not expired, and nothing but notes and claims (`engine.core.remarks`) since its seq. A
                    # claim's own event lands after the claim and is carried to it after that: a second claimer
                    # between the two must still lose.
                    live = (
                        held is not None
                        and utc(held.expires_at) > at
                        and (held.seq == seq or not _decided_since(conn, task_id, held.seq))
                    )
                    other = held.actor if live and held is not None and held.actor != actor else None
                    if other is not None and take_over is None and held is not None:
                        return _claim(held)
                    values = {
                        "actor": actor,
                        "seq": seq,
                        "claimed_at": at,
                        "expires_at": until,
                        "taken_from": other,
                        "reason": take_over if other is not None else None,
                    }
                    if held is None:
                        conn.execute(insert(task_claims).values(task_id=task_id, **values))
                    else:
                        # The row as read: a claim that moved meanwhile (another claimer's) is not overwritten.
                        same = (
                            task_claims.c.task_id == task_id,
                            task_claims.c.actor == held.actor,
                            task_claims.c.claimed_at == held.claimed_at,
                        )
                        if conn.execute(update(task_claims).where(*same).values(**values)).rowcount != 1:
                            continue
                    return WorkClaim(task_id, actor, seq, at, until, values["taken_from"], values["reason"])
            except StoreError as refused:
                if refused.code is not Code.DATABASE_ERROR:
                    raise
                continue  # another claimer inserted first (the key refused this one): read what holds now
        with self._errors(), self._reader() as conn:
            found = conn.execute(select(task_claims).where(task_claims.c.task_id == task_id)).first()
        return _claim(found) if found is not None else None

    def release_work(self, task_id: str, actor: str) -> bool:
        with self._errors(), self._writer() as conn:
            gone = conn.execute(
                delete(task_claims).where(task_claims.c.task_id == task_id, task_claims.c.actor == actor)
            )
            return gone.rowcount == 1

    def carry_claim(self, task_id: str, from_seq: int, to_seq: int) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(
                update(task_claims)
                .where(task_claims.c.task_id == task_id, task_claims.c.seq == from_seq)
                .values(seq=to_seq)
            )

    # -- worker reports -------------------------------------------------
    def report_worker(self, report: WorkerReport) -> None:
        """Insert or refresh a worker's row (it reports on every heartbeat and once when it stops)."""
        values = {
            "name": report.name,
            "host": report.host,
            "pid": report.pid,
            "concurrency": report.concurrency,
            "started_at": report.started_at,
            "seen_at": report.seen_at,
            "stopped_at": report.stopped_at,
            "counts": canonical_json(report.counts),
        }
        statement = self.sql.upsert(workers, values, "name", ("seen_at", "stopped_at", "counts", "concurrency"))
        with self._errors(), self._writer() as conn:
            conn.execute(statement)

    def workers(self, *, seen_since: datetime, stopped: bool = False) -> list[WorkerReport]:
        """Workers that reported since `seen_since` and have not stopped (with `stopped`, those that have too)."""
        query = select(workers).where(workers.c.seen_at >= seen_since).order_by(workers.c.name)
        if not stopped:
            query = query.where(workers.c.stopped_at.is_(None))
        with self._errors(), self._reader() as conn:
            rows = conn.execute(query).all()
        return [
            WorkerReport(
                r.name,
                r.host,
                r.pid,
                r.concurrency,
                utc(r.started_at),
                utc(r.seen_at),
                None if r.stopped_at is None else utc(r.stopped_at),
                json.loads(r.counts),
            )
            for r in rows
        ]

    @staticmethod
    def _events(conn: Connection, task_id: str, after: int, upto: int | None) -> list[Event]:
        query = select(events).where(events.c.task_id == task_id, events.c.seq > after).order_by(events.c.seq)
        if upto is not None:
            query = query.where(events.c.seq <= upto)
        return [_event(r) for r in conn.execute(query)]

    # -- capabilities ---------------------------------------------------
    def wakeups(self, wake: Callable[[], None], workflows: Sequence[str] | None = None) -> Listener:
        """A LISTEN connection that calls `wake` when a task of `workflows` becomes claimable (PostgreSQL)."""
        if not self.supports_notify:
            raise StoreError(
                f"{self.engine.dialect.name} sends no notifications: its workers poll", code=Code.DATABASE_ERROR
            )
        return Listener(self.url, wake, workflows)

    def after_fork(self) -> None:
        """In a forked process: open connections of its own from here on, and never close the parent's."""
        # The parent's pool stays referenced, so that it is never garbage-collected here: closing a driver
        # connection in a child would end the parent's session on the socket they share.
        self._inherited.append(self.engine.pool)
        self.engine.dispose(close=False)

    # -- plumbing -------------------------------------------------------
    def _writer(self) -> AbstractContextManager[Connection]:
        return writing(self.engine)

    def _reader(self) -> AbstractContextManager[Connection]:
        return reading(self.engine)

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Map driver errors (raw, or wrapped by SQLAlchemy) to our codes; the raw text goes to the log only."""
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            yield
        except RailyardError:
            raise
        except sa_exc.DBAPIError as exc:
            raise _store_error(exc.orig, dbapi, self.url) from None
        except dbapi.Error as exc:
            raise _store_error(exc, dbapi, self.url) from None


def _store_error(orig: BaseException | None, dbapi: Any, url: str) -> StoreError:
    """The one mapping from a driver error to a code, cut to 200 characters in the log (it may hold data)."""
    reaching = connection_problem(url, orig)
    if reaching is not None:  # not reaching the database says where and why, on the line the user sees
        log.error("database error: %s", reaching.message)
        reaching.transient = reaching.code is Code.DATABASE_UNREACHABLE
        return reaching
    if isinstance(orig, dbapi.IntegrityError):
        log.warning("integrity error: %.200s", orig)
        return StoreError("the database refused the write (constraint violated)", code=Code.DATABASE_ERROR)
    text = str(orig).lower()
    log.error("database error: %.200s", orig)
    if "no such table" in text or ("relation" in text and "does not exist" in text):
        return StoreError("the database has no Railyard schema; run `railyard db upgrade`", code=Code.SCHEMA_MISSING)
    error = StoreError(f"database error ({type(orig).__name__})", code=Code.DATABASE_ERROR)
    # A connection the server closed or that broke (psycopg's OperationalError, InterfaceError): the same write
    # may go through on the next connection.
    error.transient = isinstance(orig, dbapi.OperationalError | dbapi.InterfaceError)
    return error


def _keyset(after: str, *, before: bool) -> ColumnElement[bool]:
    """Rows before (or after) task `after` in (created_at, task_id) order; its created_at is read by the same
    statement, so a cursor is just a task id."""
    created = select(tasks.c.created_at).where(tasks.c.task_id == after).scalar_subquery()
    mine = tuple_(tasks.c.created_at, tasks.c.task_id)
    theirs = tuple_(created, after)
    return mine < theirs if before else mine > theirs


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
        "next_run_at": row.next_run_at,
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


def _loaded(rows: list[Any]) -> Loaded | None:
    """A `Loaded` from the rows of one task's `LOAD` (none: the task does not exist)."""
    if not rows or rows[0][0] != 0:
        return None
    _, seq, workflow, digest, state, status, last_hash, task_id, _, version, created, updated = rows[0]
    row = TaskRow(
        task_id,
        workflow,
        version,
        digest,
        state,
        status,
        seq,
        last_hash,
        read_instant(created),
        read_instant(updated),
    )
    snap = None
    tail: list[Event] = []
    for r in rows[1:]:
        if r[0] == 1:
            snap = Snapshot(task_id, r[1], r[2], r[3])
        else:
            tail.append(
                Event(
                    task_id,
                    r[1],
                    read_instant(r[10]),
                    r[2],
                    r[3],
                    r[4],
                    r[5],
                    stored_data(r[6], task_id, r[1]),
                    r[7],
                    r[8],
                )
            )
    return Loaded(row, snap, tail)


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
        next_run_at=utc(r.next_run_at) if r.next_run_at is not None else None,
        lease_owner=r.lease_owner,
        lease_expires_at=utc(r.lease_expires_at) if r.lease_expires_at is not None else None,
        lease_epoch=r.lease_epoch,
        failures=r.failures,
        tenant=r.tenant,
        priority=r._mapping.get("priority"),
    )


def in_log_order(events: Generator[Any], snapshots: Generator[Any], place: dict[str, int]) -> Generator[Any]:
    """A page's event rows and snapshot rows, each ordered by task then seq, as one stream in log order.

    A snapshot comes right after the event at its seq (k orders them: 0 before 1). Tasks are
    compared by their `place` in the page, which the database ordered in its own collation,
    never as Python strings. A seq SQLite holds as something other than an integer (an edited
    row) sorts as SQLite sorts it (`_sqlite_seq`).
    """
    try:
        snap = next(snapshots, None)
        snap_place, snap_seq = _log_position(snap, place)
        current, here = None, -1
        for row in events:
            tid, seq = row[1], row[2]
            if tid != current:
                found = place.get(tid)
                if found is None:
                    raise StoreError(
                        f"audit read: an event of task {tid}, which is not in its page", code=Code.DATABASE_ERROR
                    )
                current, here = tid, found
            if type(seq) is not int:
                seq = _sqlite_seq(seq)
            while snap is not None and (snap_place < here or (snap_place == here and snap_seq < seq)):
                yield snap
                snap = next(snapshots, None)
                snap_place, snap_seq = _log_position(snap, place)
            yield row
        if snap is not None:
            yield snap
            yield from snapshots
    finally:
        try:
            events.close()
        finally:
            snapshots.close()


def _log_position(snap: Any, place: dict[str, int]) -> tuple[int, Any]:
    if snap is None:
        return -1, 0
    found = place.get(snap[1])
    if found is None:
        raise StoreError(
            f"audit read: a snapshot of task {snap[1]}, which is not in its page", code=Code.DATABASE_ERROR
        )
    seq = snap[2]
    return found, seq if type(seq) is int else _sqlite_seq(seq)


def _sqlite_seq(value: Any) -> Any:
    """A seq that is not an integer, as SQLite orders it: a REAL among the integers, text after every number
    (by its bytes: UTF-8 keeps code point order), a blob after text."""
    if isinstance(value, float):
        return value
    return _AfterNumbers(1 if isinstance(value, str) else 2, value)


@dataclass(frozen=True, slots=True)
class _AfterNumbers:
    """Sorts after every number, and among its own kind by (rank, value)."""

    rank: int
    value: Any

    def __gt__(self, other: Any) -> bool:
        if isinstance(other, _AfterNumbers):
            return (self.rank, self.value) > (other.rank, other.value)
        return True

    def __lt__(self, other: Any) -> bool:
        if isinstance(other, _AfterNumbers):
            return (self.rank, self.value) < (other.rank, other.value)
        return False


def _queue_key(
    table: Any, sort: str, due: Callable[[ColumnElement[Any]], ColumnElement[Any]], *, cursor: bool = False
) -> ColumnElement[Any]:
    """The column a work queue sorts by: no deadline sorts after every real one (a far-off instant stands in for
    it), so the keyset stays one tuple comparison. Each order has a partial index of blocked tasks that ends in
    (created_at, task_id) (migration 0014), so a page reads its rows from the index, not every waiting task.

    While blocked, `waiting_since` is `updated_at` and `place` is `state` (migration 0018): the indexed copies the
    page's rows are read by. The `cursor` task's own values are read from its row by key, from the columns
    themselves: a cursor task that has moved on since its page is no longer blocked, and its copies are NULL."""
    if sort == "deadline":
        return due(table.c.next_run_at)
    column: ColumnElement[Any] = {
        "waiting": table.c.updated_at if cursor else table.c.waiting_since,
        "created": table.c.created_at,
        "workflow": table.c.workflow,
        "state": table.c.state if cursor else table.c.place,
    }[sort]
    return column


def _decided_since(conn: Connection, task_id: str, seq: int) -> bool:
    """Whether an event other than a note or a claim came after `seq`: what ends a claim made at `seq`."""
    found = conn.execute(
        select(events.c.seq)
        .where(events.c.task_id == task_id, events.c.seq > seq, events.c.trigger.not_in(sorted(REMARKS)))
        .limit(1)
    ).first()
    return found is not None


def _claim(r: Row[Any]) -> WorkClaim:
    return WorkClaim(r.task_id, r.actor, int(r.seq), utc(r.claimed_at), utc(r.expires_at), r.taken_from, r.reason)


def _event(r: Row[Any]) -> Event:
    return Event(
        task_id=r.task_id,
        seq=r.seq,
        at=utc(r.at),
        actor=r.actor,
        from_state=r.from_state,
        trigger=r.trigger,
        to_state=r.to_state,
        data=stored_data(r.data, r.task_id, r.seq),
        prev_hash=r.prev_hash,
        hash=r.hash,
    )
