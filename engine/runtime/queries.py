"""The read side the shells use: what the API, the pages and the CLI read beyond the engine's own verbs, and
which tasks a caller may see, asked of the one authorisation point.

`engine.cli` and `engine.api` read the store only through here (an import-linter
contract in `pyproject.toml` keeps them from importing `engine.store`; the app's
start-up checks and the page-session store are the named exceptions).

Every interface that reads for a person (the API, the pages) narrows what it
reads here, with the caller's roles and tenants (`engine.core.access.read_scope`),
so that what a person may not read is absent: a task of a workflow they hold no
role in, or of another tenant, answers exactly as a task that does not exist
(TASK_NOT_FOUND, the same words), lists leave it out, and the work queue neither
shows nor counts it. The trusted process itself (the Python API, the CLI) passes
no caller and reads everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from engine.core.access import Caller, Scope, read_scope, readable_workflows
from engine.core.errors import Code, Refused
from engine.core.events import Event
from engine.core.rows import TaskRow, WorkerReport
from engine.runtime.engine import Engine
from engine.store.protocol import ListedTask, TaskQuery

__all__ = [
    "ListedTask",
    "TaskQuery",
    "blocked_in",
    "events_after",
    "exists",
    "list_tasks",
    "readable",
    "require_visible",
    "resolve",
    "row",
    "scope",
    "status_counts",
    "workers",
]


def readable(engine: Engine, caller: Caller | None) -> frozenset[str] | None:
    """The names of the workflows whose tasks `caller` may read (None: all of them)."""
    return readable_workflows(engine.registry, caller)


def scope(engine: Engine, caller: Caller | None) -> Scope:
    """The tasks `caller` may read: by workflow and by tenant (no bound for the trusted process)."""
    return read_scope(engine.registry, caller)


def _sorted(names: frozenset[str] | None) -> list[str] | None:
    return sorted(names) if names is not None else None


def require_visible(engine: Engine, task_id: str, caller: Caller | None) -> None:
    """Refuse a task `caller` may not read as if it did not exist; a task that does not exist is left to the read
    that follows, which says so in the same words."""
    _within(engine, task_id, scope(engine, caller))


def _within(engine: Engine, task_id: str, bounds: Scope) -> None:
    if bounds == Scope():
        return
    row = engine.store.row(task_id)
    if row is not None and not bounds.sees(row.workflow, row.tenant):
        raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)


def resolve(engine: Engine, text: str, caller: Caller | None) -> str:
    """The id of the task `text` names (a whole id, or a prefix of one among the tasks `caller` may read), once it
    is checked that `caller` may read it (`require_visible`)."""
    bounds = scope(engine, caller)
    resolved = engine.resolve_task_id(text, _sorted(bounds.workflows), _sorted(bounds.tenants))
    _within(engine, resolved, bounds)
    return resolved


def exists(engine: Engine, task_id: str, caller: Caller | None = None) -> bool:
    """Whether a task by that id is in the database and `caller` may read it (a list's cursor must name one)."""
    found = engine.store.row(task_id)
    return found is not None and scope(engine, caller).sees(found.workflow, found.tenant)


def row(engine: Engine, task_id: str) -> TaskRow | None:
    """The task's row: its head, status, timers and lease, as the last append left them."""
    return engine.store.row(task_id)


def list_tasks(engine: Engine, query: TaskQuery, caller: Caller | None = None) -> list[ListedTask]:
    """One keyset page of tasks, newest first (`Store.list_tasks`), of those `caller` may read."""
    bounds = scope(engine, caller)
    return engine.store.list_tasks(replace(query, workflows=_sorted(bounds.workflows), tenants=_sorted(bounds.tenants)))


def blocked_in(
    engine: Engine,
    states: Sequence[tuple[str, int, str]],
    *,
    caller: Caller | None = None,
    after: str | None = None,
    limit: int | None = None,
    by_deadline: bool = False,
    waiting_before: datetime | None = None,
) -> list[str]:
    """The ids of blocked tasks standing in one of `states` (`Store.blocked_in`), of the tenants `caller` may read
    (the states are the caller's to choose: they name workflows it may read)."""
    tenants = caller.tenants if caller is not None else None
    return engine.store.blocked_in(
        states,
        after=after,
        limit=limit,
        by_deadline=by_deadline,
        waiting_before=waiting_before,
        tenants=_sorted(tenants),
    )


def events_after(engine: Engine, task_id: str, seq: int) -> list[Event]:
    """The task's events after `seq`: what a command just wrote."""
    return engine.store.events(task_id, after_seq=seq)


def status_counts(engine: Engine, at: datetime) -> list[dict[str, Any]]:
    """Per workflow and status: how many tasks, how many leased, the oldest due time (`railyard status`)."""
    return engine.store.status_counts(at)


def workers(engine: Engine, seen_since: datetime) -> list[WorkerReport]:
    """The worker processes seen since `seen_since`."""
    return engine.store.workers(seen_since=seen_since)
