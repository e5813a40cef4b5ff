"""PostgreSQL's SQL for the store, under the same names as `engine.store.sqlite` (`engine.store.sql.Dialect`).

Every write is one statement on an autocommit connection (data-modifying CTEs),
so an append or a claim costs one round trip and no BEGIN/COMMIT. The hot
statements (load, append) are prepared on the driver connection: building
SQLAlchemy statements and result rows costs more than the database work itself
(measured in `bench/append.py`). Parameters use psycopg's `%s` style.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Table, func, literal_column
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql import ColumnElement, Executable

from engine.core.canonical import canonical_json, now, utc
from engine.core.events import Event
from engine.core.rows import Claim
from engine.core.webhooks import Outgoing
from engine.store import flow_sql
from engine.store.protocol import conflict

#: The database sends `railyard_runnable` when a task becomes claimable (migration 0004, `engine.store.wakeups`).
SUPPORTS_NOTIFY = True

#: Log rows per round trip of an audit read's server-side cursor.
AUDIT_FETCH = 5000

#: Every task's head in task id byte order: the database's collation may follow a locale, "C" compares bytes.
HEADS = 'SELECT task_id, seq, last_hash, tenant FROM tasks ORDER BY task_id COLLATE "C"'
#: Each task's head as its row states it, with the hash of the event at that seq as the log holds it (NULL when
#: it holds none): what a checkpoint's judgement reads, one scan over the primary keys.
LOG_HEADS = (
    "SELECT t.task_id, t.seq, t.last_hash, t.tenant, e.hash FROM tasks t "
    'LEFT JOIN events e ON e.task_id = t.task_id AND e.seq = t.seq ORDER BY t.task_id COLLATE "C"'
)

#: Task row (k = 0), its newest snapshot at or below the row's seq (k = 1) and the events after
#: that snapshot up to the row's seq (k = 2), in one statement: one round trip and one consistent
#: view, so a writer cannot slip in between the reads. When the snapshot is the row's head there are
#: no such events, and the last condition, which names no column of `events`, is a one-time filter
#: that skips the descent of their primary key (4 of a load's 15 buffers at 10,000,000 events).
#: Named parameter: task_id.
LOAD = """
WITH t AS (
    SELECT task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at
    FROM tasks WHERE task_id = %(task_id)s
), s AS (
    SELECT seq, hash, doc FROM snapshots
    WHERE task_id = %(task_id)s AND seq <= (SELECT seq FROM t)
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
WHERE e.task_id = %(task_id)s AND e.seq > COALESCE((SELECT seq FROM s), 0) AND e.seq <= (SELECT seq FROM t)
  AND COALESCE((SELECT seq FROM s), 0) < (SELECT seq FROM t)
ORDER BY 1, 2
"""

#: `LOAD` for many tasks at once, each row led by its task's id: what a worker reads for the tasks one claim
#: gave it, in the round trip after the claim's instead of one per task (issue #18). The newest snapshot of each
#: is found by the same index probe as `LOAD`'s (`LATERAL ... LIMIT 1`). Named parameter: ids (a text array).
LOAD_MANY = """
WITH t AS (
    SELECT task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at
    FROM tasks WHERE task_id = ANY(%(ids)s::text[])
), s AS (
    SELECT t.task_id, n.seq, n.hash, n.doc FROM t CROSS JOIN LATERAL (
        SELECT seq, hash, doc FROM snapshots
        WHERE snapshots.task_id = t.task_id AND snapshots.seq <= t.seq
        ORDER BY seq DESC LIMIT 1
    ) n
)
SELECT task_id AS id, 0 AS k, seq, workflow, digest, state, status, last_hash, task_id, CAST(NULL AS TEXT),
       version, created_at, updated_at
FROM t
UNION ALL
SELECT task_id, 1, seq, hash, doc, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM s
UNION ALL
SELECT e.task_id, 2, e.seq, e.actor, e.from_state, e.trigger, e.to_state, e.data, e.prev_hash, e.hash, NULL,
       e.at, NULL
FROM t LEFT JOIN s ON s.task_id = t.task_id
JOIN events e ON e.task_id = t.task_id AND e.seq > COALESCE(s.seq, 0) AND e.seq <= t.seq
WHERE COALESCE(s.seq, 0) < t.seq
ORDER BY 1, 2, 3
"""

TASK_SEQ = "SELECT seq, lease_epoch FROM tasks WHERE task_id = %s"


def shared(url: str) -> bool:
    """A server is open to every process."""
    return True


def load(cur: Any, task_id: str) -> list[Any]:
    """The rows of `LOAD` for one task (a prepared statement: it runs on every step)."""
    cur.execute(LOAD, {"task_id": task_id}, prepare=True)
    rows: list[Any] = cur.fetchall()
    return rows


def load_many(cur: Any, task_ids: Sequence[str]) -> list[list[Any]]:
    """The rows of `LOAD` of each task found, in one statement (a prepared one: a worker runs it after each
    claim)."""
    cur.execute(LOAD_MANY, {"ids": list(task_ids)}, prepare=True)
    return [[row[1:] for row in rows] for _, rows in itertools.groupby(cur.fetchall(), key=lambda row: row[0])]


@lru_cache(maxsize=32)
def append_statement(n_events: int, with_snapshot: bool, n_outbox: int = 0) -> str:
    """One statement that moves the task row and inserts the events (and a snapshot), or does nothing.

    The UPDATE ... WHERE seq = expected gates the INSERTs, which select from it:
    if another writer moved the row first, no row is updated and nothing is
    inserted. Data-modifying CTEs run exactly once, in one transaction
    (autocommit), in one round trip. It returns the number of events written.
    Parameters: seq, state, status, last_hash, updated_at; next_run_at twice, updated_at, next_run_at (the due
    rule, `still_due`); status thrice (a terminal task drops its lease); task_id, expected_seq, lease_epoch twice
    (None: no fence); then 9 per event, then 4 for the snapshot, then 6 per webhook message
    (`engine.store.sql_webhooks`), written only if the row moved.
    """
    row = "(%s::int, %s::timestamptz, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text)"
    snapshot = (
        ", snap AS (INSERT INTO snapshots (task_id, seq, hash, doc, created_at)"
        " SELECT upd.task_id, %s::int, %s::text, %s::text, %s::timestamptz FROM upd)"
        if with_snapshot
        else ""
    )
    message = "(%s::text, %s::text, %s::text, %s::text, %s::text, %s::timestamptz)"
    outbox = (
        ", ob AS (INSERT INTO webhook_outbox (id, subscription_id, kind, task_id, body, created_at, since,"
        " next_attempt_at, status, attempts) SELECT m.id, m.sub, m.kind, m.task, m.body, m.at, m.at, m.at, 'pending', 0"
        f" FROM upd CROSS JOIN (VALUES {', '.join([message] * n_outbox)}) AS m(id, sub, kind, task, body, at)"
        " ON CONFLICT (id) DO NOTHING)"
        if n_outbox
        else ""
    )
    return (
        "WITH upd AS (UPDATE tasks SET seq = %s, state = %s, status = %s, last_hash = %s, updated_at = %s,"
        # A task already due and asked to be due now keeps its due time (`engine.core.timers.still_due`).
        " next_run_at = CASE WHEN next_run_at <= %s::timestamptz AND %s::timestamptz <= %s::timestamptz"
        " THEN next_run_at ELSE %s::timestamptz END,"
        " lease_owner = CASE WHEN %s::text = 'terminal' THEN NULL ELSE lease_owner END,"
        " lease_expires_at = CASE WHEN %s::text = 'terminal' THEN NULL ELSE lease_expires_at END,"
        " failures = CASE WHEN %s::text = 'terminal' THEN 0 ELSE failures END"
        " WHERE task_id = %s AND seq = %s AND (%s::int IS NULL OR lease_epoch = %s::int) RETURNING task_id),"
        " ev AS (INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
        " SELECT upd.task_id, v.seq, v.at, v.actor, v.from_state, v.trigger, v.to_state, v.data, v.prev_hash, v.hash"
        f" FROM upd CROSS JOIN (VALUES {', '.join([row] * n_events)})"
        " AS v(seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash) RETURNING 1)"
        f"{snapshot}{outbox} SELECT count(*) FROM ev"
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
    """`Store.append` in one prepared statement (the webhook messages the events bring too); on a conflict, one
    more read says which."""
    last = new_events[-1]
    at = now()
    params: list[Any] = [
        last.seq,
        last.to_state,
        status,
        last.hash,
        at,
        next_run_at,
        next_run_at,
        at,
        next_run_at,
        status,
        status,
        status,
        task_id,
        expected_seq,
        lease_epoch,
        lease_epoch,
    ]
    for e in new_events:
        params.extend(
            (e.seq, e.at, e.actor, e.from_state, e.trigger, e.to_state, canonical_json(e.data), e.prev_hash, e.hash)
        )
    if snapshot is not None:
        params.extend((*snapshot, at))
    for m in outbox:
        params.extend((m.id, m.subscription_id, m.kind, m.task_id, m.body, m.created_at))
    cur: Any = raw.cursor()  # the driver's own cursor (psycopg accepts prepare=)
    cur.execute(append_statement(len(new_events), snapshot is not None, len(outbox)), params, prepare=True)
    if not cur.fetchone()[0]:
        cur.execute(TASK_SEQ, (task_id,))
        raise conflict(task_id, expected_seq, lease_epoch, cur.fetchone())


#: Claim up to N due tasks whose lease is free or expired: one statement; SKIP LOCKED lets many workers
#: claim at once without waiting on each other's rows. Each claim bumps the epoch (the fencing token).
CLAIM = """
UPDATE tasks SET lease_owner = %(owner)s, lease_expires_at = %(until)s, lease_epoch = lease_epoch + 1
WHERE task_id IN (
    SELECT task_id FROM tasks
    WHERE status <> 'terminal' AND next_run_at IS NOT NULL AND next_run_at <= %(now)s
      AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s)
      AND (%(workflows)s::text[] IS NULL OR workflow = ANY(%(workflows)s::text[]))
    ORDER BY next_run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING task_id, lease_epoch, next_run_at
"""


def claim(
    raw: Any, owner: str, until: datetime, at: datetime, limit: int, workflows: Sequence[str] | None
) -> list[Claim]:
    cur: Any = raw.cursor()
    cur.execute(
        CLAIM,
        {
            "owner": owner,
            "until": until,
            "now": at,
            "limit": limit,
            "workflows": list(workflows) if workflows else None,
        },
    )
    return [Claim(r[0], r[1], utc(r[2])) for r in cur.fetchall()]


#: Give a lease back: only while still held at the claimed epoch (a lease taken over is not ours to free);
#: a step that went through also clears the count of consecutive failures. Parameters: succeeded, task, epoch.
#: A task handed back while still due goes to the back of the line: it kept its first due time while it moved
#: under the lease (`engine.core.timers.still_due`), and is due again from now (`engine.core.timers.handed_back`).
RELEASE = (
    "UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,"
    " failures = CASE WHEN %s THEN 0 ELSE failures END,"
    " next_run_at = CASE WHEN next_run_at < %s THEN %s ELSE next_run_at END"
    " WHERE task_id = %s AND lease_epoch = %s"
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

#: `task_id` among a page of ids: one array parameter (`audit_ids` passes the list), not hundreds of
#: placeholders the driver would rewrite on every page.
_IDS_IN = "task_id = ANY(%s)"


def audit_ids(ids: list[str]) -> list[Any]:
    """The parameters that stand for `ids` in `audit_page` and `audit_logs`."""
    return [ids]


def instant(at: datetime) -> Any:
    """A time as an audit read's parameter: psycopg sends a datetime as timestamptz."""
    return at


@lru_cache(maxsize=64)
def audit_page(n_ids: int, after: bool, workflow: bool, since: bool) -> str:
    """A keyset page of task rows. Positional parameters, in order: ids, after, workflow, since, limit."""
    where = []
    if n_ids:
        where.append(_IDS_IN)
    if after:
        where.append("task_id > %s")
    if workflow:
        where.append("workflow = %s")
    if since:
        where.append("updated_at >= %s")
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {AUDIT_TASK_COLUMNS} FROM tasks{condition} ORDER BY task_id LIMIT %s"


@lru_cache(maxsize=64)
def audit_logs(n_ids: int, snapshots: bool, upto: bool, lower: bool = False) -> str:
    """The events (k = 0), or the snapshots (k = 1), of `n_ids` tasks in the same row shape, by task then seq.

    Two queries, not one `UNION ALL ... ORDER BY`: each is an ordered index scan, and the
    store merges them (`engine.store.sql.in_log_order`). PostgreSQL before 17 cannot merge
    the two scans of a union in index order; it sorts the whole page of logs instead, on
    disk for a long one. Positional parameters: the ids, then the lowest seq wanted (with
    `lower`) and the highest (with `upto`).
    """
    limit = (" AND seq >= %s" if lower else "") + (" AND seq <= %s" if upto else "")
    columns = (
        "1, task_id, seq, NULL, NULL, NULL, NULL, NULL, doc, NULL, hash FROM snapshots"
        if snapshots
        else "0, task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash FROM events"
    )
    return f"SELECT {columns} WHERE {_IDS_IN}{limit} ORDER BY task_id, seq"


@contextmanager
def audit_session(
    raw: Any,
) -> Iterator[tuple[Callable[[str, list[Any]], list[Any]], Callable[[str, list[Any]], Generator[Any]]]]:
    """One REPEATABLE READ, read-only transaction: a `fetch_all(sql, params)` and a streaming `stream(sql, params)`
    (a server-side cursor) in it."""
    pg: Any = raw.driver_connection
    with pg.transaction():
        pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        # Times arrive as UTC already (psycopg then gives `datetime.UTC`): no conversion per event.
        pg.execute("SET LOCAL TIME ZONE 'UTC'")

        names = itertools.count()

        def stream(sql: str, params: list[Any]) -> Generator[Any]:
            with pg.cursor(name=f"railyard_audit_{next(names)}", binary=True) as cur:
                cur.execute(sql, params)
                while rows := cur.fetchmany(AUDIT_FETCH):  # a list each: no call into the cursor per row
                    yield from rows

        yield (lambda sql, params: pg.execute(sql, params).fetchall()), stream


# -- the task lists ----------------------------------------------------------------------------------
def id_prefix(column: ColumnElement[str], prefix: str) -> ColumnElement[bool]:
    """LIKE 'prefix%', served by ix_tasks_task_id_pattern (varchar_pattern_ops) whatever the collation."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return column.like(escaped + "%", escape="\\")


#: The flow-control statements (`engine.store.flow_sql`): the statement's start in epoch seconds, LEAST, GREATEST.
FLOW = flow_sql.statements("extract(epoch from statement_timestamp())::float8", "LEAST", "GREATEST")


def queue_due(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A blocked task's deadline for the work queue's order, none sorting after every real one: written as
    migration 0014's `ix_tasks_blocked_due` indexes it (a constant, not a parameter), so the index serves it."""
    return func.coalesce(column, literal_column(f"'{NO_DEADLINE_TEXT}'::timestamptz"))


#: The instant that stands in for "no deadline" (`engine.store.protocol.NO_DEADLINE`) in the index's expression.
NO_DEADLINE_TEXT = "9999-12-31 00:00:00+00"
