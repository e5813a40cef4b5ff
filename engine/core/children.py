"""Child states: a task starts a task of another workflow, waits for it holding nothing, and is routed by its end.

Pure: what the events of the protocol record, the child's id, what a child's end routes to. The runner that
follows the protocol is `engine.runtime.children`.

A child's start is an effect, under the rules of a write tool call (DESIGN.md, "A child's start is an effect"):

1. `spawn` (a self-loop of the child state) records the intent: the child's `name@version` and digest, its
   input (built by code from the parent's folded state, never by the model), an action id derived from the
   event's seq, and the child's task id derived from (parent id, action id). While it has no `spawned`, the
   start is an open effect (`engine.core.effects`): a cancel waits for it, and the task cannot end.
2. The child task is created under that id; its first event names the parent (task id, the intent's seq, the
   action id). The id is the tasks table's primary key, so a second create of it fails: however many workers
   run step 2 for one intent, one child exists.
3. `spawned` (a self-loop) records that the child exists. The parent is blocked and holds no lease.
4. When the child ends, `child_<its terminal state>` (or `child_unrouted`) records where it ended, its last seq
   and hash and its typed result, and leaves the state (`Child.on`, `Child.otherwise`).

Every crash point leaves something a worker finds: between 1 and 2, the intent without `spawned` (the parent
stays due, `engine.core.timers`), and the worker that claims it makes the child with the recorded id and input
(or finds it); between 2 and 3, the same, and the child is found by its id; between the child's end and 4, the
child's end wakes the parent (`Store.wake`), and a waiting parent is looked at again by a timer in any case
(`engine.runtime.children.RECHECK_SECONDS`), so a lost wake-up costs time, never the parent.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from engine.core.canonical import format_instant, parse_instant, sha256_hex
from engine.core.chain import Finding
from engine.core.definition import SPAWN, SPAWNED, Child, Workflow
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import ChildRecord, EventData, ParentLink
from engine.core.tools.prepared import action_id_for

if TYPE_CHECKING:
    from engine.core.task import TaskState


def child_task_id(parent_id: str, action_id: str) -> str:
    """The id of the child that the intent `action_id` of task `parent_id` starts: the same for every worker and
    every attempt, so the store's primary key is what makes the start happen once."""
    return str(uuid.UUID(hex=sha256_hex(f"railyard-child:{parent_id}:{action_id}")[:32]))


def intent(
    task: TaskState, child: Workflow, input_json: Mapping[str, Any], at: datetime, *, holds: bool = True
) -> EventData:
    """The `spawn` event's data for a task about to start a child of `child` (pinned: version and digest); `holds`:
    the parent holds the child until its end is recorded (`Child.holds_child`)."""
    action_id = action_id_for(task.task_id, task.seq + 1)
    record: ChildRecord = {
        "task_id": child_task_id(task.task_id, action_id),
        "action_id": action_id,
        "workflow": child.ref,
        "digest": child.digest,
        "input": dict(input_json),
    }
    if holds:
        record["holds"] = True
    return {"child": record, "requested_at": format_instant(at)}


def pending_child(task: TaskState) -> ChildRecord | None:
    """The child the current visit of a child state started (its intent), or None before `spawn`."""
    found = task.visit.get("child")
    return cast("ChildRecord", found) if isinstance(found, dict) else None


def is_spawned(task: TaskState) -> bool:
    """Whether the current visit's child is known to exist (`spawned` is recorded)."""
    return bool(task.visit.get("spawned"))


def parent_link(task: TaskState, record: ChildRecord, intent_seq: int) -> ParentLink:
    """What the child's first event says of its parent."""
    return {
        "task_id": task.task_id,
        "seq": intent_seq,
        "action_id": record["action_id"],
        "workflow": task.ref,
        "state": task.state,
    }


def intent_seq(task: TaskState) -> int:
    """The seq of the `spawn` event of the current visit (recorded by the visit)."""
    return int(task.visit["spawn_seq"])


def deadline_at(state: Child, task: TaskState) -> datetime | None:
    """When the wait for the child ends by `expired`: the start's time plus the state's deadline (None: never)."""
    started = task.visit.get("spawned_at")
    if state.deadline is None or not isinstance(started, str):
        return None
    return parse_instant(started) + state.deadline


def next_look(state: Child, task: TaskState, at: datetime, recheck: timedelta) -> datetime:
    """When a worker looks at a waiting parent again if no child's end wakes it first: after `recheck`, or at the
    deadline if that comes first. Never "never": a wake-up lost to a crash costs `recheck`, not the parent."""
    due = at + recheck
    deadline = deadline_at(state, task)
    return min(due, deadline) if deadline is not None else due


def ended(state: Child, record: ChildRecord, child: TaskState) -> tuple[str, EventData]:
    """The trigger and data that record the end of `child` (terminal) in the parent: where it ended, its last seq
    and hash (replay holds the child's log to them), and the typed result read from its final state. A result that
    does not validate is recorded with CHILD_RESULT_INVALID and routes as an end `on` does not name."""
    out: ChildRecord = {
        "task_id": record["task_id"],
        "action_id": record["action_id"],
        "state": child.state,
        "seq": child.seq,
        "hash": child.last_hash,
    }
    trigger = state.route_of(child.state)
    if state.result is not None:
        try:
            out["result"] = read_result(state, child)
        except (ValidationError, ValueError, TypeError, KeyError) as error:
            out["result"] = None
            out["code"] = str(Code.CHILD_RESULT_INVALID)
            trigger = state.route_of("")  # unrouted: the parent's next state would rely on a result it lacks
            del error
    return trigger, {"child": out}


def read_result(state: Child, child: TaskState) -> dict[str, Any]:
    """The child's typed result: `state.read` of its final state (default: the fields of the result model found in
    its facts, newest last, and `state`), validated by `state.result`, as JSON."""
    assert state.result is not None
    if state.read is not None:
        values = dict(state.read(child))
    else:
        values = {}
        for fact in child.facts.values():
            if isinstance(fact, dict):
                values.update(fact)
        values["state"] = child.state
        values = {k: v for k, v in values.items() if k in state.result.model_fields}
    return state.result.model_validate(values).model_dump(mode="json")


def result_fact(record: ChildRecord) -> dict[str, Any]:
    """What the parent's facts keep of a child's end (`facts["child:STATE"]`): what guards and the model read."""
    return {"task_id": record["task_id"], "state": record.get("state"), "result": record.get("result")}


# -- replay: the links checked both ways -----------------------------------------------------------------------
def parent_findings(first: Event, parent: Sequence[Event] | None) -> list[Finding]:
    """Judge a child's first event (`first`, naming its parent) against the parent's log (`parent`, None when the
    parent is in neither the database nor the archives): the parent's event at the named seq must be the intent
    that starts exactly this task, with this version, digest and input, from the named state."""
    link = first.data.get("parent")
    if not isinstance(link, dict):
        return [Finding(Code.CHILD_LINK_MISMATCH, 1, "the task names a parent its first event does not describe")]
    where = f"parent {link.get('task_id')} seq {link.get('seq')}"
    if parent is None:
        return [Finding(Code.CHILD_MISSING, 1, f"{where}: the parent is not in the database or its archives")]
    seq = link.get("seq")
    spawn = next((e for e in parent if e.seq == seq), None) if type(seq) is int else None
    record = spawn.data.get("child") if spawn is not None and spawn.trigger == SPAWN else None
    fan = spawn.data.get("fan_out") if spawn is not None and spawn.trigger == SPAWN else None
    if record is None and isinstance(fan, dict):  # a fan-out's intent: this child's item, found by its action id
        record = next((c for c in fan.get("children", []) if c.get("action_id") == link.get("action_id")), None)
    if spawn is None or not isinstance(record, dict):
        return [Finding(Code.CHILD_LINK_MISMATCH, 1, f"{where} is not an intent to start a child")]
    problems = [
        name
        for name, ours, theirs in (
            ("task id", first.task_id, record.get("task_id")),
            ("action id", link.get("action_id"), record.get("action_id")),
            ("workflow", first.data.get("workflow"), record.get("workflow")),
            ("digest", first.data.get("digest"), record.get("digest")),
            ("input", first.data.get("input"), record.get("input")),
            ("state", link.get("state"), spawn.from_state),
            ("parent's workflow", link.get("workflow"), parent[0].data.get("workflow") if parent else None),
        )
        if ours != theirs
    ]
    if problems:
        return [Finding(Code.CHILD_LINK_MISMATCH, 1, f"{where} starts another child: {', '.join(problems)} differ")]
    return []


def child_findings(
    event: Event, rules: Workflow | None, child: Sequence[Event] | None, final: TaskState | None
) -> list[Finding]:
    """Judge a parent's event that names a child (`spawned`, or the record of its end) against the child's log
    (`child`, None when it is in neither the database nor the archives) and, for an end, the child's fold up to the
    seq the parent recorded (`final`, None when it could not be folded): the child must name this parent and this
    action id; the end must be the child's terminal event, and the result what the state's result model reads."""
    record = event.data.get("child")
    if not isinstance(record, dict):
        return [Finding(Code.CHILD_LINK_MISMATCH, event.seq, f"{event.trigger!r} names no child")]
    child_id = record.get("task_id")
    if child is None or not child:
        return [Finding(Code.CHILD_MISSING, event.seq, f"child {child_id} is not in the database or its archives")]
    link = child[0].data.get("parent")
    if (
        not isinstance(link, dict)
        or link.get("task_id") != event.task_id
        or link.get("action_id") != record.get("action_id")
    ):
        return [Finding(Code.CHILD_LINK_MISMATCH, event.seq, f"child {child_id} does not name this task as its parent")]
    if event.trigger == SPAWNED:
        return []
    seq = record.get("seq")
    found = next((e for e in child if e.seq == seq), None) if type(seq) is int else None
    if found is None or found.hash != record.get("hash") or found.to_state != record.get("state"):
        return [
            Finding(
                Code.CHILD_RESULT_MISMATCH,
                event.seq,
                f"child {child_id} holds no event at seq {seq} with the recorded hash and end {record.get('state')!r}",
            )
        ]
    source = event.from_state or ""
    state = rules.state(source) if rules is not None and rules.has_state(source) else None
    if not isinstance(state, Child) or final is None:
        return []  # the routes and the result cannot be judged without the rules: the replay says why elsewhere
    if not final.terminal:
        return [Finding(Code.CHILD_RESULT_MISMATCH, event.seq, f"child {child_id} had not ended at seq {seq}")]
    trigger, data = ended(state, record, final)
    if (trigger, data["child"].get("result"), data["child"].get("code")) != (
        event.trigger,
        record.get("result"),
        record.get("code"),
    ):
        return [
            Finding(
                Code.CHILD_RESULT_MISMATCH,
                event.seq,
                f"the end recorded of child {child_id} ({event.trigger}, result {record.get('result')}) is not "
                f"what its final state reads ({trigger}, result {data['child'].get('result')})",
            )
        ]
    return []
