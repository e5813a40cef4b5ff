"""What the read side shows a caller of one task: the task and its log without the fields its workflow restricts.

`engine.core.access.sees_restricted` decides who sees them and `engine.core.visibility` what the others are
shown; here the engine finds what those pure functions need (the task's definition, its events). The API, the
pages, the CLI's `--as` reads and the export all come through here, so a restricted value is withheld the same
way on each. None as the caller is the trusted process itself: it is shown everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from engine.core.access import Caller, Scope, sees_restricted
from engine.core.approvals import pending_view
from engine.core.definition import Workflow
from engine.core.errors import RailyardError
from engine.core.events import Event
from engine.core.rows import Snapshot, TaskRow
from engine.core.task import TaskState
from engine.core.visibility import Withholding, withholding
from engine.runtime.engine import Engine, TaskView

__all__ = [
    "definition_named",
    "events",
    "pending",
    "readable_logs",
    "task",
    "view",
    "withheld_from",
    "withholding_for",
]


def definition_named(engine: Engine, workflow: str, version: int) -> Workflow | None:
    """The definition whose restrictions govern a task of `workflow@version`: that version as this process has it,
    else the newest version of the workflow (what is restricted is not in a digest, so a task whose code changed
    is still shown as its workflow says); None for a workflow this process does not know."""
    found = engine.registry.find(workflow, version)
    if found is not None:
        return found
    try:
        return engine.registry.get(workflow)
    except RailyardError:
        return None


def withheld_from(
    engine: Engine, caller: Caller | None, task: TaskState, log: Sequence[Event] | None = None
) -> Withholding | None:
    """What `caller` may not be shown of `task` (None: all of it may be), having learned the restricted values of
    its whole log (`log` if the caller has it, else read here)."""
    definition = definition_named(engine, task.workflow, task.version)
    if definition is None or sees_restricted(definition, caller):
        return None
    return withholding(definition, caller, log if log is not None else engine.events_of(task), task)


def task(engine: Engine, found: TaskState, caller: Caller | None) -> TaskState:
    """`found` as `caller` is shown it."""
    hidden = withheld_from(engine, caller, found)
    return hidden.task(found) if hidden is not None else found


def view(engine: Engine, found: TaskState, caller: Caller | None) -> TaskView:
    """What `Engine.view` answers, as `caller` is shown it: the body of every API answer that is a task."""
    return engine.view(task(engine, found, caller))


def events(engine: Engine, task_id: str, caller: Caller | None) -> list[Event]:
    """The task's history (`Engine.history`) as `caller` is shown it; the events keep their stored hashes."""
    log = engine.history(task_id)
    if caller is None or not log:
        return log
    row = engine.store.row(task_id)
    definition = definition_named(engine, row.workflow, row.version) if row is not None else None
    if definition is None or sees_restricted(definition, caller):
        return log
    hidden = withholding(definition, caller, log)
    assert hidden is not None
    return hidden.events(log)


def pending(engine: Engine, definition: Workflow, task: TaskState, caller: Caller | None) -> dict[str, Any]:
    """An approval waiting (`engine.core.approvals.pending_view`, `queries.approvals`) as `caller` is shown it: the
    task as just loaded, so that a restricted reader's view costs its events, not a second load."""
    item = pending_view(definition, task)
    if caller is None or sees_restricted(definition, caller):
        return item
    hidden = withholding(definition, caller, engine.events_of(task), task)
    return hidden.pending(item) if hidden is not None else item


def withholding_for(engine: Engine, caller: Caller | None, row: TaskRow) -> Withholding | None:
    """What `caller` may not be shown of the task `row` heads, to be learned as its log streams past (an export)."""
    definition = definition_named(engine, row.workflow, row.version)
    return withholding(definition, caller) if definition is not None else None


def readable_logs(items: Iterable[TaskRow | Event | Snapshot], bounds: Scope) -> Iterator[TaskRow | Event]:
    """A stream of task rows each followed by its events (`Auditor.logs`), without the tasks outside `bounds` (what
    a reader may read, `queries.scope`): what an export made for them leaves out, as if those tasks did not exist."""
    keep = True
    for item in items:
        if isinstance(item, TaskRow):
            keep = bounds.sees(item.workflow, item.tenant)
        if keep and isinstance(item, TaskRow | Event):
            yield item
