"""The task list behind `GET /api/tasks` and the tasks page: one bounded query over the `tasks` rows.

`Store.task_ids` has no state filter and no limit, and a back-office list must
stay one round trip however many tasks exist, so this reads the `tasks` table
(the heads of the logs, never the events) directly, newest first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from engine.errors import Code, StoreError
from engine.store import Store
from engine.store.schema import tasks

log = logging.getLogger("railyard.api")

MAX_LIMIT = 500


@dataclass(frozen=True, slots=True)
class TaskFilter:
    workflow: str | None = None
    state: str | None = None
    status: str | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class ListedTask:
    task_id: str
    workflow: str
    version: int
    state: str
    status: str
    seq: int
    created_at: str
    updated_at: str


def list_tasks(store: Store, where: TaskFilter) -> list[ListedTask]:
    query = select(tasks.c.task_id, tasks.c.workflow, tasks.c.version, tasks.c.state, tasks.c.status, tasks.c.seq,
                   tasks.c.created_at, tasks.c.updated_at)
    if where.workflow:
        query = query.where(tasks.c.workflow == where.workflow)
    if where.state:
        query = query.where(tasks.c.state == where.state)
    if where.status:
        query = query.where(tasks.c.status == where.status)
    query = query.order_by(tasks.c.updated_at.desc(), tasks.c.task_id).limit(max(1, min(where.limit, MAX_LIMIT)))
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(query).all()
    except sa_exc.SQLAlchemyError as exc:
        log.error("task list failed: %.200s", exc)
        text = str(exc).lower()
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            raise StoreError("the database has no Railyard schema; run `railyard db upgrade`",
                             code=Code.SCHEMA_MISSING) from None
        raise StoreError(f"database error ({type(exc).__name__})") from None
    return [ListedTask(r.task_id, r.workflow, r.version, r.state, r.status, r.seq, _instant(r.created_at),
                       _instant(r.updated_at)) for r in rows]


def _instant(value: object) -> str:
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)
