"""Records people make about a task where it stands: a note (`comment`), and who is on its work item
(`work_claimed`, `work_released`).

They are events like any other (the next seq, chained by hash, replayed), so an auditor reads who said what and
who held the item when a decision was made. They are *remarks*, not transitions: the task stays in its state,
its visit, budgets and timers are untouched, and they never make a pending decision stale. A person who decided
on seq 6 is refused only when an event after 6 that is not a remark exists (`decisive_after`): a colleague's
note or claim at seq 7 changes nothing they were shown. Nothing is recorded on a task that ended: "no event
after a terminal state" holds for remarks too (TASK_TERMINAL).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from engine.core.access import Caller, may_read
from engine.core.canonical import format_instant
from engine.core.decide import Decision
from engine.core.definition import COMMENT, WORK_CLAIMED, WORK_RELEASED, Workflow
from engine.core.errors import Code, Refused
from engine.core.events import Event
from engine.core.payloads import ClaimRecord
from engine.core.task import TaskState

#: The triggers that record a remark: never a transition, never what makes a decision stale.
REMARKS = frozenset({COMMENT, WORK_CLAIMED, WORK_RELEASED})
#: The longest note kept: a note is a few lines for colleagues, not a document.
NOTE_MAX = 2000


def busy_refusal(
    task_id: str, lease_owner: str | None, lease_expires_at: datetime | None, at: datetime
) -> Refused | None:
    """Why no remark may be written now (None: it may): a worker holds the task's lease and is running its step.
    A remark is an event like any other, so the worker's own append would then conflict and the model answer or
    tool outcome it holds would be thrown away and paid for again (TASK_BUSY)."""
    if lease_owner is None or lease_expires_at is None or lease_expires_at <= at:
        return None
    return Refused(
        f"task {task_id} is in the hands of worker {lease_owner}, which is running its step: try again once the "
        f"step is recorded (its lease runs until {format_instant(lease_expires_at)} at the latest)",
        code=Code.TASK_BUSY,
        task_id=task_id,
        worker=lease_owner,
    )


def is_remark(event: Event) -> bool:
    """Whether `event` is a remark recorded where the task stood (its trigger, and no state change)."""
    return event.trigger in REMARKS and event.from_state == event.to_state


def decisive_after(events: Iterable[Event], seq: int) -> Event | None:
    """The first event after `seq` that is not a remark: what made a decision taken on `seq` stale (None: only
    remarks were added since, and the decision still stands on what the person saw)."""
    return next((e for e in events if e.seq > seq and not is_remark(e)), None)


def _may_remark(definition: Workflow, task: TaskState, caller: Caller, what: str) -> None:
    may_remark(definition, task.task_id, task.state, task.terminal, caller, what)


def may_remark(definition: Workflow, task_id: str, state: str, ended: bool, caller: Caller, what: str) -> None:
    """Refuse a remark (`what`: a note, a claim) by an auditor, who acts on nothing, by someone who may not read
    the workflow's tasks (to them there is no such task), or on a task that has ended. `Engine.claim_work` asks it
    of the task's row before the claim's side table is written, so a refused claimer leaves no claim behind."""
    if caller.read_only:
        raise Refused(f"{caller.actor!r} reads and never acts: it makes no {what}", code=Code.FORBIDDEN)
    if not may_read([definition], caller):
        raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
    if ended:
        raise Refused(
            f"task {task_id} has ended (in {state!r}): nothing is recorded after a terminal state",
            code=Code.TASK_TERMINAL,
            task_id=task_id,
            state=state,
        )


def comment(definition: Workflow, task: TaskState, *, caller: Caller, text: str) -> Decision:
    """A note by anyone who may read the task and acts (not an auditor), on a task that has not ended: 1 to
    `NOTE_MAX` characters once trimmed, else PAYLOAD_INVALID."""
    _may_remark(definition, task, caller, "note")
    kept = text.strip() if isinstance(text, str) else ""
    if not kept or len(kept) > NOTE_MAX:
        raise Refused(f"a note is 1 to {NOTE_MAX} characters of text", code=Code.PAYLOAD_INVALID, task_id=task.task_id)
    return Decision(COMMENT, task.state, task.state, {"note": {"text": kept}})


def claimed(
    definition: Workflow,
    task: TaskState,
    *,
    caller: Caller,
    until: datetime,
    taken_from: str | None = None,
    reason: str | None = None,
) -> Decision:
    """The record of a claim the queue's side table granted (`Engine.claim_work`); a take-over names whom from
    and why."""
    _may_remark(definition, task, caller, "claim")
    record: ClaimRecord = {"until": format_instant(until)}
    if taken_from is not None:
        record["taken_from"] = taken_from
        record["reason"] = reason or ""
    return Decision(WORK_CLAIMED, task.state, task.state, {"claim": record})


def released(task: TaskState) -> Decision:
    """The record of a person leaving the work item they held (not recorded on an ended task: its claim ended
    with it)."""
    return Decision(WORK_RELEASED, task.state, task.state, {"claim": {}})
