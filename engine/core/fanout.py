"""Fan-out and join: a child state with `each` starts one child per item and routes on how their ends join.

Pure: what the fan-out's events record, each child's ids, whether the join is decided, and the replay checks. The
runner is `engine.runtime.fanout`; the single child's protocol (`engine.core.children`) is the model, made N:

1. `spawn` records one intent for all the children, before any exists: the items' inputs (built by code from the
   parent's folded state by `Child.each`, never by the model), the pinned `name@version` and digest, the intent's
   action id and, for item `i`, the action id `ACTION.i` and the task id derived from (parent id, that action id).
   The whole of N is checked against the task's `Budgets.children` first (`budget_refusal`): too many is refused
   before anything is recorded, so no child starts.
2. Each child is created under its derived id, its first event naming the parent (task id, the intent's seq, its
   own action id). The id is the tasks table's primary key: a worker that resumes after a crash makes the
   children that are missing and finds the others, so each item has exactly one child.
3. `spawned` records that all of them exist; the parent is blocked and holds no lease.
4. Each look reads the children's states and decides the join (`join_outcome`): `joined` once `Child.needed`
   children ended in a state `succeeds` names; `failed` once that cannot happen (at once under `fail_fast`, after
   every child ended under `collect`). A decided join cancels the children still running (`on_parent_end` cancel,
   through the cancel any child gets); the end is recorded once every child has ended: `child_joined` or
   `child_failed` (or `child_unrouted` when `on` does not name it), with each child's end, in the order of the
   items. Cancels only add failures and successes never disappear, so the outcome decided from the final states
   is the one decided when the join was first met or lost: replay recomputes it from them (`join_findings`).

The intent stays an open effect until the end is recorded (`engine.core.effects`): the parent cannot end, and a
cancel of the parent waits for its children, which it cancels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from engine.core.canonical import format_instant
from engine.core.chain import Finding
from engine.core.children import child_task_id
from engine.core.children import ended as child_ended
from engine.core.definition import Child, Workflow
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import ChildRecord, EventData, FanOutRecord
from engine.core.tools.prepared import action_id_for

if TYPE_CHECKING:
    from engine.core.task import TaskState

JOINED = "joined"
FAILED = "failed"


def item_action_id(action_id: str, index: int) -> str:
    """The action id of item `index`'s child start: the intent's, with the index, the same for every worker."""
    return f"{action_id}.{index}"


def budget_refusal(definition: Workflow, task: TaskState, n: int) -> dict[str, Any] | None:
    """What the task's child budget says of starting `n` more children (None: allowed). Checked whole before the
    intent: a fan-out too big for the budget starts none of its children."""
    used = int(task.usage.get("children", 0))
    limit = definition.budgets.child_limit
    if used + n > limit:
        return {"budget": "children", "used": used, "limit": limit}
    return None


def intent(
    task: TaskState, state: Child, child: Workflow, inputs: Sequence[Mapping[str, Any]], at: datetime
) -> EventData:
    """The `spawn` event's data for a fan-out about to start one child of `child` per input, in order."""
    action_id = action_id_for(task.task_id, task.seq + 1)
    records: list[ChildRecord] = []
    for index, built in enumerate(inputs):
        item = item_action_id(action_id, index)
        records.append(
            {
                "task_id": child_task_id(task.task_id, item),
                "action_id": item,
                "workflow": child.ref,
                "digest": child.digest,
                "input": dict(built),
                "holds": True,
            }
        )
    fan: FanOutRecord = {
        "action_id": action_id,
        "workflow": child.ref,
        "digest": child.digest,
        "join": str(state.join),
        "on_child_failure": state.on_child_failure,
        "children": records,
    }
    return {"fan_out": fan, "requested_at": format_instant(at)}


def pending_fan_out(task: TaskState) -> FanOutRecord | None:
    """The fan-out the current visit of a child state started (its intent), or None before `spawn`."""
    found = task.visit.get("fan_out")
    return cast("FanOutRecord", found) if isinstance(found, dict) else None


def spawned_data(fan: FanOutRecord) -> EventData:
    """The `spawned` event's data: every child exists."""
    return {
        "fan_out": {
            "action_id": fan["action_id"],
            "children": [{"task_id": c["task_id"], "action_id": c["action_id"]} for c in fan["children"]],
        }
    }


def join_outcome(state: Child, ends: Sequence[str | None]) -> str | None:
    """How the join stands, given each child's terminal state (None: still running): `joined`, `failed`, or None
    while it is undecided. Monotone: once decided, later ends of the children still running do not change it."""
    needed = state.needed(len(ends))
    ok = sum(1 for end in ends if end is not None and end in state.succeeds)
    running = sum(1 for end in ends if end is None)
    if ok >= needed:
        return JOINED
    if ok + running < needed and (state.on_child_failure == "fail_fast" or running == 0):
        return FAILED
    return None


def ended(state: Child, fan: FanOutRecord, children: Sequence[TaskState]) -> tuple[str, EventData]:
    """The trigger and data that record a fan-out's end, every child having ended (`children`, in the order of the
    items): each child's end as a single child's is recorded (its state, last seq and hash, typed result), and the
    join's outcome, which routes the parent."""
    records = [
        child_ended(state, record, child)[1]["child"] for record, child in zip(fan["children"], children, strict=True)
    ]
    outcome = join_outcome(state, [child.state for child in children])
    assert outcome is not None, "every child ended: the join is decided"
    data: FanOutRecord = {"action_id": fan["action_id"], "outcome": outcome, "children": records}
    return state.route_of(outcome), {"fan_out": data}


def result_fact(fan: FanOutRecord) -> dict[str, Any]:
    """What the parent's facts keep of a fan-out's end (`facts["children:STATE"]`): the outcome and, in the order
    of the items, each child's id, end and result (what guards and the model read)."""
    return {
        "outcome": fan.get("outcome"),
        "children": [
            {"task_id": c["task_id"], "state": c.get("state"), "result": c.get("result")} for c in fan["children"]
        ],
    }


def child_records(data: Mapping[str, Any]) -> list[ChildRecord]:
    """The children an event names: a single child state's one, or a fan-out's, in order (empty: none)."""
    single = data.get("child")
    if isinstance(single, dict):
        return [cast("ChildRecord", single)]
    fan = data.get("fan_out")
    if isinstance(fan, dict) and isinstance(fan.get("children"), list):
        return [cast("ChildRecord", c) for c in fan["children"] if isinstance(c, dict)]
    return []


def join_findings(event: Event, rules: Workflow | None, spawn: Event | None) -> list[Finding]:
    """Judge a fan-out's end against its intent and the children's ends it records: the same children in the same
    order as the intent started, and the trigger and outcome the recorded ends decide. (Each recorded end is held to
    its child's log by `engine.core.children.child_findings`.)"""
    fan = event.data.get("fan_out")
    if not isinstance(fan, dict):
        return [Finding(Code.CHILD_RESULT_MISMATCH, event.seq, f"{event.trigger!r} names no fan-out")]
    started = spawn.data.get("fan_out") if spawn is not None else None
    ids = [c.get("task_id") for c in fan.get("children", [])]
    if not isinstance(started, dict) or [c.get("task_id") for c in started.get("children", [])] != ids:
        return [
            Finding(
                Code.CHILD_LINK_MISMATCH,
                event.seq,
                f"the fan-out's end does not name the children its intent started, in their order ({len(ids)} named)",
            )
        ]
    source = event.from_state or ""
    state = rules.state(source) if rules is not None and rules.has_state(source) else None
    if not isinstance(state, Child) or not state.fans_out:
        return []
    ends = [c.get("state") for c in fan["children"]]
    outcome = join_outcome(state, [e if isinstance(e, str) else None for e in ends])
    if outcome is None or (outcome, state.route_of(outcome)) != (fan.get("outcome"), event.trigger):
        return [
            Finding(
                Code.CHILD_RESULT_MISMATCH,
                event.seq,
                f"the fan-out's join is recorded as {fan.get('outcome')!r} ({event.trigger}); its children's ends "
                f"decide {outcome!r}",
            )
        ]
    return []
