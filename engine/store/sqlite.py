"""SQLite's SQL for the store, under the same names as `engine.store.postgres` (`engine.store.sql.Dialect`).

A transition's append and a task's load run thousands of times a second, and
building SQLAlchemy statements and result rows costs more than the database
work itself (measured in `bench/append.py`). These statements are fixed text
with sqlite3's `?` placeholders, run on the driver connection; a write takes
the write lock up front (`BEGIN IMMEDIATE`), so it never fails on a lock
upgrade halfway through. Times are stored as the text SQLAlchemy's SQLite
dialect writes (`instant`), so both paths read alike.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Boolean, Table, func, literal_column
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.sql import ColumnElement, Executable

from engine.core.canonical import canonical_json, now, utc
from engine.core.events import Event
from engine.core.rows import Claim
from engine.core.webhooks import Outgoing
from engine.store import flow_sql
from engine.store.decode import read_instant
from engine.store.protocol import NO_DEADLINE, conflict

#: SQLite has no notifications: workers poll.
SUPPORTS_NOTIFY = False

#: Every task's head in task id byte order (SQLite's default BINARY collation compares the UTF-8 bytes).
HEADS = "SELECT task_id, seq, last_hash, tenant FROM tasks ORDER BY task_id"
#: Each task's head as its row states it, with the hash of the event at that seq as the log holds it (NULL when
#: it holds none): what a checkpoint's judgement reads, one scan over the primary keys.
LOG_HEADS = (
    "SELECT t.task_id, t.seq, t.last_hash, t.tenant, e.hash FROM tasks t "
    "LEFT JOIN events e ON e.task_id = t.task_id AND e.seq = t.seq ORDER BY t.task_id"
)

#: Task row (k = 0), its newest snapshot at or below the row's seq (k = 1) and the events after
#: that snapshot up to the row's seq (k = 2), in one statement: one round trip and one consistent
#: view, so a writer cannot slip in between the reads. Named parameter: task_id.
LOAD = """
WITH t AS (
    SELECT task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at
    FROM tasks WHERE task_id = :task_id
), s AS (
    SELECT seq, hash, doc FROM snapshots
    WHERE task_id = :task_id AND seq <= (SELECT seq FROM t)
    ORDER BY seq DESC LIMIT 1
)
SELECT 0 AS k, seq, workflow, digest, state, status, last_hash, task_id, CAST(NULL AS TEXT), version,
       created_at, updated_at
FROM t
UNION ALL
SELECT 1, seq, hash, doc, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM s
UNION ALL
SELECT 2, e.seq, e.actor, e.from_state, e.trigger, e.to_state, e.data, e.prev_hash, e.hash, NULL, e.at, NULL
FROM events e
WHERE e.task_id = :task_id AND e.seq > COALESCE((SELECT seq FROM s), 0) AND e.seq <= (SELECT seq FROM t)
ORDER BY 1, 2
"""

TASK_SEQ = "SELECT seq, lease_epoch FROM tasks WHERE task_id = ?"


def shared(url: str) -> bool:
    """A database file is; an in-memory database lives in this process only."""
    return not (":memory:" in url or url.rstrip("/") in ("sqlite:", "sqlite:/"))


def load(cur: Any, task_id: str) -> list[Any]:
    """The rows of `LOAD` for one task."""
    cur.execute(LOAD, {"task_id": task_id})
    rows: list[Any] = cur.fetchall()
    return rows


def load_many(cur: Any, task_ids: Sequence[str]) -> list[list[Any]]:
    """The rows of `LOAD` of each task found: one statement each, in one transaction (one consistent view), since
    an embedded database has no round trips to save."""
    cur.execute("BEGIN")
    try:
        found = [load(cur, task_id) for task_id in task_ids]
    finally:
        cur.execute("ROLLBACK")
    return [rows for rows in found if rows]


# One BEGIN IMMEDIATE transaction of these.
# A task that ends drops its lease in the same write, and its count of failed steps with it: nothing is left held by
# a worker that dies right after, and the worker has nothing to release (`Worker._hold`).
MOVE_TASK = (
    "UPDATE tasks SET seq = ?, state = ?, status = ?, last_hash = ?, updated_at = ?,"
    # A task already due and asked to be due now keeps its due time (`engine.core.timers.still_due`).
    " next_run_at = CASE WHEN next_run_at <= ? AND ? <= ? THEN next_run_at ELSE ? END,"
    " lease_owner = CASE WHEN ? = 'terminal' THEN NULL ELSE lease_owner END,"
    " lease_expires_at = CASE WHEN ? = 'terminal' THEN NULL ELSE lease_expires_at END,"
    " failures = CASE WHEN ? = 'terminal' THEN 0 ELSE failures END"
    " WHERE task_id = ? AND seq = ? AND (? IS NULL OR lease_epoch = ?)"
)
INSERT_EVENT = (
    "INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_SNAPSHOT = "INSERT INTO snapshots (task_id, seq, hash, doc, created_at) VALUES (?, ?, ?, ?, ?)"
#: A webhook message an event brings, due at once (`engine.store.sql_webhooks`); one already written is kept.
INSERT_OUTBOX = (
    "INSERT INTO webhook_outbox (id, subscription_id, kind, task_id, body, created_at, since, next_attempt_at,"
    " status, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0) ON CONFLICT (id) DO NOTHING"
)


def append(
    raw: Any,
    task_id: str,
    expected_seq: int,
    new_events: Sequence[Event],
    status: str,
    snapshot: tuple[int, str, str] | None,
    next_run_at: datetime | None,
    lease_epoch: int | None,
    outbox: Sequence[Outgoing] = (),
) -> None:
    """`Store.append` in one write transaction (the webhook messages the events bring too); on a conflict, the
    same transaction reads which."""
    last = new_events[-1]
    at = instant(now())
    due = instant(next_run_at) if next_run_at is not None else None
    cur: Any = raw.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        cur.execute(
            MOVE_TASK,
            (
                last.seq,
                last.to_state,
                status,
                last.hash,
                at,
                due,
                due,
                at,
                due,
                status,
                status,
                status,
                task_id,
                expected_seq,
                lease_epoch,
                lease_epoch,
            ),
        )
        if cur.rowcount != 1:
            cur.execute(TASK_SEQ, (task_id,))
            raise conflict(task_id, expected_seq, lease_epoch, cur.fetchone())
        cur.executemany(
            INSERT_EVENT,
            [
                (
                    e.task_id,
                    e.seq,
                    instant(e.at),
                    e.actor,
                    e.from_state,
                    e.trigger,
                    e.to_state,
                    canonical_json(e.data),
                    e.prev_hash,
                    e.hash,
                )
                for e in new_events
            ],
        )
        if snapshot is not None:
            cur.execute(INSERT_SNAPSHOT, (task_id, *snapshot, at))
        if outbox:
            cur.executemany(
                INSERT_OUTBOX,
                [(m.id, m.subscription_id, m.kind, m.task_id, m.body, *[instant(m.created_at)] * 3) for m in outbox],
            )
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise


def instant(at: datetime) -> str:
    """A time as SQLite stores it (and as a parameter compared with stored times): UTC text, as SQLAlchemy's SQLite
    dialect stores a DateTime (`YYYY-MM-DD HH:MM:SS.ffffff`), so that both read alike. `isoformat` writes that text
    in half the time `strftime` takes, and an append formats three times."""
    return utc(at).replace(tzinfo=None).isoformat(" ", "microseconds")


#: The claim's selection inside BEGIN IMMEDIATE (the write lock serialises claimers).
@lru_cache(maxsize=16)
def due(n_workflows: int) -> str:
    """Due, unleased tasks (of `n_workflows` named workflows, if any), oldest first. Parameters: now, names, limit."""
    only = f" AND workflow IN ({', '.join('?' * n_workflows)})" if n_workflows else ""
    return (
        "SELECT task_id, next_run_at FROM tasks"
        " WHERE status <> 'terminal' AND next_run_at IS NOT NULL AND next_run_at <= ?"
        f" AND (lease_expires_at IS NULL OR lease_expires_at < ?){only}"
        " ORDER BY next_run_at LIMIT ?"
    )


#: Each claim bumps the epoch (the fencing token).
CLAIM_ONE = (
    "UPDATE tasks SET lease_owner = ?, lease_expires_at = ?, lease_epoch = lease_epoch + 1 WHERE task_id = ?"
    " RETURNING lease_epoch"
)


def claim(
    raw: Any, owner: str, until: datetime, at: datetime, limit: int, workflows: Sequence[str] | None
) -> list[Claim]:
    cur: Any = raw.cursor()
    cur.execute("BEGIN IMMEDIATE")
    try:
        moment = instant(at)
        cur.execute(due(len(workflows) if workflows else 0), (moment, moment, *(workflows or ()), limit))
        found = cur.fetchall()
        claimed = []
        for task_id, due_at in found:
            cur.execute(CLAIM_ONE, (owner, instant(until), task_id))
            claimed.append(Claim(task_id, cur.fetchone()[0], read_instant(due_at)))
        cur.execute("COMMIT")
        return claimed
    except BaseException:
        cur.execute("ROLLBACK")
        raise


#: Give a lease back: only while still held at the claimed epoch (a lease taken over is not ours to free);
#: a step that went through also clears the count of consecutive failures. Parameters: succeeded, task, epoch.
#: A task handed back while still due goes to the back of the line: it kept its first due time while it moved
#: under the lease (`engine.core.timers.still_due`), and is due again from now (`engine.core.timers.handed_back`).
RELEASE = (
    "UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,"
    " failures = CASE WHEN ? THEN 0 ELSE failures END,"
    " next_run_at = CASE WHEN next_run_at < ? THEN ? ELSE next_run_at END"
    " WHERE task_id = ? AND lease_epoch = ?"
)


def upsert(table: Table, values: dict[str, Any], key: str, refresh: Sequence[str]) -> Executable:
    """Insert `values` into `table`, or update the `refresh` columns of the row with the same `key`."""
    statement = insert(table).values(**values)
    return statement.on_conflict_do_update(
        index_elements=[table.c[key]], set_={k: statement.excluded[k] for k in refresh}
    )


# -- audit reads (replay, export, as-of) -------------------------------------------------------------
#: Rows of a page of tasks and of their logs arrive in the same `ORDER BY task_id`, so a reader pairs them by
#: equality alone and never compares ids in Python (whose string order may differ from the database collation).
AUDIT_TASK_COLUMNS = "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at, tenant"


def _ids_in(n_ids: int) -> str:
    return f"task_id IN ({', '.join('?' * n_ids)})"


def audit_ids(ids: list[str]) -> list[Any]:
    """The parameters that stand for `ids` in `audit_page` and `audit_logs`: one placeholder each."""
    return list(ids)


@lru_cache(maxsize=64)
def audit_page(n_ids: int, after: bool, workflow: bool, since: bool) -> str:
    """A keyset page of task rows. Positional parameters, in order: ids, after, workflow, since, limit."""
    where = []
    if n_ids:
        where.append(_ids_in(n_ids))
    if after:
        where.append("task_id > ?")
    if workflow:
        where.append("workflow = ?")
    if since:
        where.append("updated_at >= ?")
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {AUDIT_TASK_COLUMNS} FROM tasks{condition} ORDER BY task_id LIMIT ?"


@lru_cache(maxsize=64)
def audit_logs(n_ids: int, snapshots: bool, upto: bool, lower: bool = False) -> str:
    """The events (k = 0), or the snapshots (k = 1), of `n_ids` tasks in the same row shape, by task then seq.

    Two queries, not one `UNION ALL ... ORDER BY`, as on PostgreSQL: each is an ordered
    index scan, and the store merges them (`engine.store.sql.in_log_order`). Positional
    parameters: the ids, then the lowest seq wanted (with `lower`) and the highest (with `upto`).
    """
    limit = (" AND seq >= ?" if lower else "") + (" AND seq <= ?" if upto else "")
    columns = (
        "1, task_id, seq, NULL, NULL, NULL, NULL, NULL, doc, NULL, hash FROM snapshots"
        if snapshots
        else "0, task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash FROM events"
    )
    return f"SELECT {columns} WHERE {_ids_in(n_ids)}{limit} ORDER BY task_id, seq"


@contextmanager
def audit_session(
    raw: Any,
) -> Iterator[tuple[Callable[[str, list[Any]], list[Any]], Callable[[str, list[Any]], Generator[Any]]]]:
    """One read transaction (WAL: every read in it sees the same snapshot): a `fetch_all(sql, params)` and a
    streaming `stream(sql, params)` in it."""
    cur: Any = raw.cursor()
    cur.execute("BEGIN")
    try:

        def stream(sql: str, params: list[Any]) -> Generator[Any]:
            yield from raw.cursor().execute(sql, params)  # sqlite3 steps rows as they are read

        yield (lambda sql, params: cur.execute(sql, params).fetchall()), stream
    finally:
        cur.execute("ROLLBACK")


# -- the task lists ----------------------------------------------------------------------------------
def id_prefix(column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
    """GLOB, not LIKE: it is case-sensitive, so SQLite serves it from the task id's index (LIKE it would scan)."""
    escaped = "".join(f"[{c}]" if c in "*?[]" else c for c in prefix)
    return column.op("GLOB", return_type=Boolean)(escaped + "*")


#: The flow-control statements (`engine.store.flow_sql`): SQLite's clock in epoch seconds (to the millisecond),
#: its two-argument MIN and MAX.
FLOW = flow_sql.statements("((julianday('now') - 2440587.5) * 86400.0)", "MIN", "MAX")


def queue_due(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A blocked task's deadline for the work queue's order, none sorting after every real one (as stored text)."""
    return func.coalesce(column, literal_column(f"'{instant(NO_DEADLINE)}'"))
