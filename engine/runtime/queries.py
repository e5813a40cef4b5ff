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

import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from engine.core.access import Caller, Scope, read_scope, readable_workflows
from engine.core.approvals import approval_places
from engine.core.canonical import format_instant
from engine.core.definition import Approval
from engine.core.errors import Code, RailyardError, Refused
from engine.core.events import Event
from engine.core.flow import BreakerRow, Limits, Waiter, in_flight_now, parse_limits, queue, refilled
from engine.core.rows import TaskRow, WorkerReport
from engine.runtime import shown
from engine.runtime.engine import Engine, TaskView
from engine.store.protocol import QUEUE_SORTS, FlowStore, ListedTask, QueuedTask, QueueQuery, TaskQuery, WorkClaim

__all__ = [
    "QUEUE_SORTS",
    "ListedTask",
    "QueueQuery",
    "QueuedTask",
    "TaskQuery",
    "WorkClaim",
    "approvals",
    "blocked_in",
    "events_after",
    "exists",
    "list_tasks",
    "queue_counts",
    "queue_page",
    "readable",
    "require_visible",
    "resolve",
    "row",
    "scope",
    "status_counts",
    "waiting_for_quota",
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


def approvals(
    engine: Engine,
    caller: Caller | None = None,
    *,
    role: str | None = None,
    after: str | None = None,
    limit: int | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the tasks waiting for a human decision (of `role`), oldest first, each with the prepared call, as
    `caller` is shown them (`shown.pending`), of the tasks it may read; and the task id the next page starts after
    (None at the end; `limit` None: every one, in one page).

    The page is cut where the store's list is, not where the loaded tasks are: a task skipped on this page (it
    moved since the list was read, or its version's code changed without a new version) does not end the list
    early, so a page may hold fewer than `limit`."""
    places = approval_places(engine.registry, role, readable(engine, caller))
    ids = blocked_in(engine, places, caller=caller, after=after, limit=limit + 1 if limit is not None else None)
    more = limit is not None and len(ids) > limit
    ids = ids[:limit] if limit is not None else ids
    found = []
    for task_id in ids:
        try:
            task = engine.load(task_id)
        except Refused:
            continue  # DEFINITION_CHANGED: the code of its version changed without a new version
        definition = engine.definition_of(task)
        state = definition.state(task.state)
        if isinstance(state, Approval) and (role is None or state.role == role):  # it may have moved since
            found.append(shown.pending(engine, definition, task, caller))
    return found, (ids[-1] if more and ids else None)


def _in_scope(engine: Engine, query: QueueQuery, caller: Caller | None) -> QueueQuery:
    """The query held to what `caller` may read: its places of readable workflows only, its tenants'."""
    bounds = scope(engine, caller)
    places = [p for p in query.places if bounds.workflows is None or p[0] in bounds.workflows]
    return replace(query, places=places, tenants=_sorted(bounds.tenants))


def queue_page(engine: Engine, query: QueueQuery, caller: Caller | None = None) -> list[QueuedTask]:
    """One keyset page of the work queue (`Store.queue_page`), of the tasks `caller` may read."""
    return engine.store.queue_page(_in_scope(engine, query, caller))


def queue_counts(engine: Engine, query: QueueQuery, caller: Caller | None = None) -> dict[tuple[str, int, str], int]:
    """How many tasks wait in each place the query names (`Store.queue_counts`), of those `caller` may read: what
    a person may not read is not counted either."""
    return engine.store.queue_counts(_in_scope(engine, query, caller))


def events_after(engine: Engine, task_id: str, seq: int) -> list[Event]:
    """The task's events after `seq`: what a command just wrote."""
    return engine.store.events(task_id, after_seq=seq)


def status_counts(engine: Engine, at: datetime) -> list[dict[str, Any]]:
    """Per workflow and status: how many tasks, how many leased, the oldest due time (`railyard status`)."""
    return engine.store.status_counts(at)


def workers(engine: Engine, seen_since: datetime, *, stopped: bool = False) -> list[WorkerReport]:
    """The worker processes seen since `seen_since` and still running (with `stopped`, the stopped ones too)."""
    return engine.store.workers(seen_since=seen_since, stopped=stopped)


#: The waiting tasks `flow_status` lists per quota, first in line first (every one is counted).
SHOWN_WAITING = 50


def flow_status(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """What flow control holds for every worker (`railyard status`): each breaker, each quota bucket (what it has
    left now, its calls in flight, how many wait), and the tasks waiting for quota in the order they will be
    served (`position` 0 is next). Empty lists where the store keeps no flow rows."""
    store = engine.store
    if not isinstance(store, FlowStore):
        return {"breakers": [], "quotas": [], "waiting": []}
    breakers, buckets, waits = store.flow_rows()
    by_key: dict[str, list[Waiter]] = {}
    for w in waits:
        by_key.setdefault(w.key, []).append(w)
    shown_breakers = [_shown_breaker(b) for b in breakers]
    quotas = []
    for q in buckets:
        limits = _limits_of(q.limits)
        left: dict[str, float | None] = {}
        for measure, level, per_minute in (
            ("requests", q.requests, limits.requests_per_minute),
            ("input_tokens", q.input_tokens, limits.input_tokens_per_minute),
            ("output_tokens", q.output_tokens, limits.output_tokens_per_minute),
        ):
            now_level = refilled(level, per_minute, limits.capacity(per_minute), q.at - q.refilled_at)
            left[measure] = round(now_level, 1) if per_minute is not None else None
        quotas.append(
            {
                "quota": q.key,
                "limits": {k: v for k, v in asdict(limits).items() if v is not None and v is not False},
                "left": left,
                "in_flight": in_flight_now(q, q.at),
                "waiting": len(by_key.get(q.key, [])),
                "paused_for_seconds": round(max(q.paused_until - q.at, 0.0), 1),
            }
        )
    waiting = [
        {
            "task_id": w.task_id,
            "quota": key,
            "position": place,
            "priority": w.priority,
            "group": w.group,
            "waiting_seconds": round(max(store_at - w.since, 0.0), 1),
        }
        for key, ws in sorted(by_key.items())
        for place, w in enumerate(queue(ws)[:SHOWN_WAITING])
        for store_at in [max((q.at for q in buckets if q.key == key), default=w.since)]
    ]
    return {"breakers": shown_breakers, "quotas": quotas, "waiting": waiting}


def paused_models(engine: Engine) -> list[dict[str, Any]]:
    """The breakers not closed, as `flow_status` shows them: every page names the models whose calls are paused
    (open) or let through one probe at a time (half open), since tasks on them are slow for a reason no task shows.
    Reads the breaker rows only, never the queues for quota."""
    store = engine.store
    if not isinstance(store, FlowStore):
        return []
    return [_shown_breaker(b) for b in store.breakers() if b.state != "closed"]


def _shown_breaker(b: BreakerRow) -> dict[str, Any]:
    return {
        "model": b.key,
        "state": b.state,
        "failures_in_a_row": b.failures,
        "open_for_seconds": round(max(b.open_until - b.at, 0.0), 1) if b.state == "open" else None,
        "changed_seconds_ago": round(max(b.at - b.changed_at, 0.0), 1),
    }


#: Seconds past its look after which a place in a queue for quota is not shown as a wait.
STALE_LOOK = 30.0


def waiting_for_quota(engine: Engine, view: TaskView) -> TaskView:
    """`view` with its place in the queue for quota, when its task waits in one (`railyard show`, the API's task,
    the task page): which quota, its place (0: next) among how many, since when and when it looks again. A wait
    is not an event (nothing happened to the task), so it is read from the flow rows every worker shares."""
    store = engine.store
    if view.status != "runnable" or not isinstance(store, FlowStore):
        return view
    found, at = store.waits_of(view.task_id)
    # A place whose look is long overdue is not a wait: its task got its call on another path, or its worker died
    # (the workers drop such rows as they queue, `STALE_LOOK` seconds on).
    waiters = [w for w in found if w.until >= at - STALE_LOOK]
    for key in sorted({w.key for w in waiters if w.task_id == view.task_id}):
        line = queue([w for w in waiters if w.key == key])
        place = next(i for i, w in enumerate(line) if w.task_id == view.task_id)
        own = line[place]
        return replace(
            view,
            waiting_for_quota={
                "quota": key,
                "position": place,
                "waiting": len(line),
                "priority": own.priority,
                "since": format_instant(datetime.fromtimestamp(own.since, UTC)),
                "looks_again_at": format_instant(datetime.fromtimestamp(max(own.until, at), UTC)),
            },
        )
    return view


def _limits_of(text: str) -> Limits:
    """The limits a bucket's row last had applied (written by the workers that use it)."""
    try:
        return parse_limits(json.loads(text or "{}"), "a quota row")
    except (ValueError, RailyardError):
        return Limits()
