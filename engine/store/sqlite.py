"""The hot-path SQL, written out by hand and run on the driver connection.

A transition's append and a task's load run thousands of times a second, and
building SQLAlchemy statements and result rows costs more than the database
work itself (measured in `bench/append.py`). These statements are fixed text
looked up by name, with the driver's own placeholder style. Everything else
the store does goes through SQLAlchemy Core.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from engine.core.canonical import parse_instant, utc

#: Task row (k = 0), its newest snapshot at or below the row's seq (k = 1) and the events after
#: that snapshot up to the row's seq (k = 2), in one statement: one round trip and one consistent
#: view, so a writer cannot slip in between the reads. Named parameter: task_id.
_LOAD = """
WITH t AS (
    SELECT task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at
    FROM tasks WHERE task_id = {task_id}
), s AS (
    SELECT seq, hash, doc FROM snapshots
    WHERE task_id = {task_id} AND seq <= (SELECT seq FROM t)
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
WHERE e.task_id = {task_id} AND e.seq > COALESCE((SELECT seq FROM s), 0) AND e.seq <= (SELECT seq FROM t)
ORDER BY 1, 2
"""

LOAD_SQLITE = _LOAD.format(task_id=":task_id")
LOAD_POSTGRES = _LOAD.format(task_id="%(task_id)s")

# SQLite: one BEGIN IMMEDIATE transaction of these.
# A task that ends drops its lease in the same write: nothing is left held by a worker that dies right after.
MOVE_TASK_SQLITE = (
    "UPDATE tasks SET seq = ?, state = ?, status = ?, last_hash = ?, updated_at = ?, next_run_at = ?,"
    " lease_owner = CASE WHEN ? = 'terminal' THEN NULL ELSE lease_owner END,"
    " lease_expires_at = CASE WHEN ? = 'terminal' THEN NULL ELSE lease_expires_at END"
    " WHERE task_id = ? AND seq = ? AND (? IS NULL OR lease_epoch = ?)"
)
INSERT_EVENT_SQLITE = (
    "INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_SNAPSHOT_SQLITE = "INSERT INTO snapshots (task_id, seq, hash, doc, created_at) VALUES (?, ?, ?, ?, ?)"
TASK_SEQ_SQLITE = "SELECT seq, lease_epoch FROM tasks WHERE task_id = ?"
TASK_SEQ_POSTGRES = "SELECT seq, lease_epoch FROM tasks WHERE task_id = %s"


@lru_cache(maxsize=32)
def append_postgres(n_events: int, with_snapshot: bool) -> str:
    """One statement that moves the task row and inserts the events (and a snapshot), or does nothing.

    The UPDATE ... WHERE seq = expected gates the INSERTs, which select from it:
    if another writer moved the row first, no row is updated and nothing is
    inserted. Data-modifying CTEs run exactly once, in one transaction
    (autocommit), in one round trip. It returns the number of events written.
    Parameters: seq, state, status, last_hash, updated_at, next_run_at, status twice (a terminal task drops
    its lease), task_id, expected_seq, lease_epoch twice (None: no fence), then 9 per event, then 4 for the
    snapshot.
    """
    row = "(%s::int, %s::timestamptz, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text, %s::text)"
    snapshot = (
        ", snap AS (INSERT INTO snapshots (task_id, seq, hash, doc, created_at)"
        " SELECT upd.task_id, %s::int, %s::text, %s::text, %s::timestamptz FROM upd)"
        if with_snapshot
        else ""
    )
    return (
        "WITH upd AS (UPDATE tasks SET seq = %s, state = %s, status = %s, last_hash = %s, updated_at = %s,"
        " next_run_at = %s::timestamptz,"
        " lease_owner = CASE WHEN %s::text = 'terminal' THEN NULL ELSE lease_owner END,"
        " lease_expires_at = CASE WHEN %s::text = 'terminal' THEN NULL ELSE lease_expires_at END"
        " WHERE task_id = %s AND seq = %s AND (%s::int IS NULL OR lease_epoch = %s::int) RETURNING task_id),"
        " ev AS (INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
        " SELECT upd.task_id, v.seq, v.at, v.actor, v.from_state, v.trigger, v.to_state, v.data, v.prev_hash, v.hash"
        f" FROM upd CROSS JOIN (VALUES {', '.join([row] * n_events)})"
        " AS v(seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash) RETURNING 1)"
        f"{snapshot} SELECT count(*) FROM ev"
    )


#: How SQLAlchemy's SQLite dialect stores a DateTime; the raw path writes the same text so both read alike.
_SQLITE_INSTANT = "%Y-%m-%d %H:%M:%S.%f"


def sqlite_instant(at: datetime) -> str:
    return utc(at).strftime(_SQLITE_INSTANT)


def read_instant(value: datetime | str) -> datetime:
    """A timestamp as the driver returned it (aware from psycopg, text from sqlite3), as aware UTC."""
    return parse_instant(value) if isinstance(value, str) else utc(value)


#: Claim up to N due tasks whose lease is free or expired: one statement; SKIP LOCKED lets many workers
#: claim at once without waiting on each other's rows. Each claim bumps the epoch (the fencing token).
CLAIM_POSTGRES = """
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


#: SQLite: the same selection inside BEGIN IMMEDIATE (the write lock serialises claimers).
@lru_cache(maxsize=16)
def due_sqlite(n_workflows: int) -> str:
    """Due, unleased tasks (of `n_workflows` named workflows, if any), oldest first. Parameters: now, names, limit."""
    only = f" AND workflow IN ({', '.join('?' * n_workflows)})" if n_workflows else ""
    return (
        "SELECT task_id, next_run_at FROM tasks"
        " WHERE status <> 'terminal' AND next_run_at IS NOT NULL AND next_run_at <= ?"
        f" AND (lease_expires_at IS NULL OR lease_expires_at < ?){only}"
        " ORDER BY next_run_at LIMIT ?"
    )


CLAIM_ONE_SQLITE = (
    "UPDATE tasks SET lease_owner = ?, lease_expires_at = ?, lease_epoch = lease_epoch + 1 WHERE task_id = ?"
    " RETURNING lease_epoch"
)


# -- audit reads (replay, export, as-of) -------------------------------------------------------------
#: Rows of a page of tasks and of their logs arrive in the same `ORDER BY task_id`, so a reader pairs them by
#: equality alone and never compares ids in Python (whose string order may differ from the database collation).
AUDIT_TASK_COLUMNS = "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at"


def _ids_in(postgres: bool, n_ids: int) -> str:
    """`task_id` among a page of ids: on PostgreSQL one array parameter (`audit_ids` passes the list), not
    hundreds of placeholders the driver would rewrite on every page."""
    return "task_id = ANY(%s)" if postgres else f"task_id IN ({', '.join('?' * n_ids)})"


def audit_ids(postgres: bool, ids: list[str]) -> list[Any]:
    """The parameters that stand for `ids` in `audit_page` and `audit_logs`."""
    return [ids] if postgres else list(ids)


@lru_cache(maxsize=64)
def audit_page(postgres: bool, n_ids: int, after: bool, workflow: bool, since: bool) -> str:
    """A keyset page of task rows. Positional parameters, in order: ids, after, workflow, since, limit."""
    mark = "%s" if postgres else "?"
    where = []
    if n_ids:
        where.append(_ids_in(postgres, n_ids))
    if after:
        where.append(f"task_id > {mark}")
    if workflow:
        where.append(f"workflow = {mark}")
    if since:
        where.append(f"updated_at >= {mark}")
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {AUDIT_TASK_COLUMNS} FROM tasks{condition} ORDER BY task_id LIMIT {mark}"


@lru_cache(maxsize=64)
def audit_logs(postgres: bool, n_ids: int, snapshots: bool, upto: bool, lower: bool = False) -> str:
    """The events (k = 0), or the snapshots (k = 1), of `n_ids` tasks in the same row shape, by task then seq.

    Two queries, not one `UNION ALL ... ORDER BY`: each is an ordered index scan, and the
    store merges them (`store.in_log_order`). PostgreSQL before 17 cannot merge the two
    scans of a union in index order; it sorts the whole page of logs instead, on disk for a
    long one. Positional parameters: the ids, then the lowest seq wanted (with `lower`) and
    the highest (with `upto`).
    """
    mark = "%s" if postgres else "?"
    limit = (f" AND seq >= {mark}" if lower else "") + (f" AND seq <= {mark}" if upto else "")
    columns = (
        "1, task_id, seq, NULL, NULL, NULL, NULL, NULL, doc, NULL, hash FROM snapshots"
        if snapshots
        else "0, task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash FROM events"
    )
    return f"SELECT {columns} WHERE {_ids_in(postgres, n_ids)}{limit} ORDER BY task_id, seq"


#: Give a lease back: only while still held at the claimed epoch (a lease taken over is not ours to free);
#: a step that went through also clears the count of consecutive failures. Parameters: succeeded, task, epoch.
RELEASE_POSTGRES = (
    "UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,"
    " failures = CASE WHEN %s THEN 0 ELSE failures END WHERE task_id = %s AND lease_epoch = %s"
)
RELEASE_SQLITE = (
    "UPDATE tasks SET lease_owner = NULL, lease_expires_at = NULL,"
    " failures = CASE WHEN ? THEN 0 ELSE failures END WHERE task_id = ? AND lease_epoch = ?"
)
