"""The task list behind `GET /api/tasks` and the tasks page: one bounded read of the `tasks` rows.

A back-office list must stay one round trip however many tasks exist, so it
reads the heads of the logs (`Store.recent`), never the events, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.api.views import when
from engine.store import Store

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
    rows = store.recent(
        workflow=where.workflow, state=where.state, status=where.status, limit=max(1, min(where.limit, MAX_LIMIT))
    )
    return [
        ListedTask(r.task_id, r.workflow, r.version, r.state, r.status, r.seq, when(r.created_at), when(r.updated_at))
        for r in rows
    ]
