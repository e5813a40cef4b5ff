"""Advance a task in a fan-out (a child state with `each`): start one child per item exactly once, wait holding
nothing, decide the join, cancel what it no longer needs, record the end once every child has ended.

The protocol and its crash points are `engine.core.fanout`'s docstring; this module follows it with the single
child's runner (`engine.runtime.children.ChildRunner`), whose ways of making, finding and cancelling a child it
uses for each of the N. All of it is store work: a step runs on the `Offload`'s store side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.canonical import now
from engine.core.children import deadline_at, next_look
from engine.core.decide import validate_payload
from engine.core.definition import EXPIRED, SPAWN, SPAWNED, Child
from engine.core.errors import Code, Refused
from engine.core.fanout import budget_refusal, ended, intent, join_outcome, pending_fan_out, spawned_data
from engine.core.payloads import FanOutRecord
from engine.core.task import TaskState
from engine.runtime.leases import current_epoch

if TYPE_CHECKING:
    from engine.runtime.children import ChildRunner

ACTOR = "system:children"


def step(runner: ChildRunner, task: TaskState, state: Child) -> TaskState:
    """One pass of the fan-out's protocol; the task as it now stands (waiting in the state, or moved on)."""
    fan = pending_fan_out(task)
    if fan is None:
        task = _spawn(runner, task, state)
        fan = pending_fan_out(task)
        assert fan is not None
    if not task.visit.get("spawned"):
        for record in fan["children"]:  # those a dead worker made are found: each id is the store's key
            runner.ensure_child(task, record)
        task = runner.engine.commit_system(task, SPAWNED, spawned_data(fan), actor=ACTOR)
    return _look(runner, task, state, fan)


def _spawn(runner: ChildRunner, task: TaskState, state: Child) -> TaskState:
    """Record the intent for every item, after checking the inputs (code's) and N against the child budget: a
    refusal records nothing, so no child starts."""
    engine = runner.engine
    child = engine.registry.get(state.workflow, state.version)
    assert state.each is not None
    try:
        inputs = []
        for built in state.each(task):
            _, input_json = validate_payload(child.input, f"{child.ref} input", dict(built))
            inputs.append(input_json or {})
    except Exception as error:  # the builder is the workflow's code: whatever it raises is its mistake
        raise Refused(
            f"task {task.task_id}: the inputs state {task.state!r} builds for {child.ref} are refused: "
            f"{getattr(error, 'message', type(error).__name__)}",
            code=Code.CHILD_INPUT_INVALID,
            task_id=task.task_id,
            child_workflow=child.ref,
        ) from None
    refusal = budget_refusal(engine.definition_of(task), task, len(inputs))
    if refusal is not None:
        raise Refused(
            f"task {task.task_id}: state {task.state!r} would start {len(inputs)} children of {child.ref}; the task "
            f"has started {refusal.get('used')} of the {refusal.get('limit')} its budget allows",
            code=Code.CHILD_BUDGET_EXCEEDED,
            task_id=task.task_id,
            children=len(inputs),
            used=refusal.get("used"),
            limit=refusal.get("limit"),
        )
    return engine.commit_system(task, SPAWN, intent(task, state, child, inputs, now()), actor=ACTOR)


def _look(runner: ChildRunner, task: TaskState, state: Child, fan: FanOutRecord) -> TaskState:
    """Read the children's states; record the end once all ended; else cancel what the join no longer needs,
    fire the deadline, or put the next look off (and look once more, for an end that came meanwhile)."""
    engine = runner.engine
    ends = _ends(runner, fan)
    decided = join_outcome(state, ends)
    stop = task.cancel_requested is not None or decided is not None
    if stop and state.on_parent_end == "cancel" and any(end is None for end in ends):
        why = "was cancelled" if task.cancel_requested is not None else f"no longer needs it (join {decided})"
        for record, end in zip(fan["children"], ends, strict=True):
            if end is None:
                runner.cancel_child(task, record, f"its parent {task.task_id} {why}")
        ends = _ends(runner, fan)
    if all(end is not None for end in ends):
        return _record_end(runner, task, state, fan)
    deadline = deadline_at(state, task)
    if deadline is not None and now() >= deadline:
        if state.on_parent_end == "cancel":
            for record, end in zip(fan["children"], ends, strict=True):
                if end is None:
                    runner.cancel_child(task, record, f"its parent {task.task_id} stopped waiting (deadline)")
        return engine.transition(task, EXPIRED, actor="system:timer", system=True)
    epoch = current_epoch(task.task_id)
    if epoch is None:
        return task  # not under a worker's lease (`Engine.run`): the task stays due, for a worker
    engine.store.postpone(task.task_id, epoch, next_look(state, task, now(), runner.recheck))
    if all(end is not None for end in _ends(runner, fan)):  # the last ended meanwhile: its wake-up may be lost
        return _record_end(runner, task, state, fan)
    return task


def _ends(runner: ChildRunner, fan: FanOutRecord) -> list[str | None]:
    """Each child's terminal state, in the order of the items (None: still running)."""
    out: list[str | None] = []
    for record in fan["children"]:
        row = runner.child_row(record)
        out.append(row.state if row.status == "terminal" else None)
    return out


def _record_end(runner: ChildRunner, task: TaskState, state: Child, fan: FanOutRecord) -> TaskState:
    children = [runner.engine.load(record["task_id"]) for record in fan["children"]]
    trigger, data = ended(state, fan, children)
    return runner.engine.commit_system(task, trigger, data, actor=ACTOR)
