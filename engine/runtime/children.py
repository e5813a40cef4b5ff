"""Advance a task in a child state: start its child exactly once, wait holding nothing, record the child's end.

The protocol and its crash points are `engine.core.children`'s docstring; this module follows it:

1. no intent yet: build the child's input by code, check it against the child's input model, record `spawn`
   (a conflict propagates: nothing is started for a task that moved);
2. intent without `spawned`: create the child under the derived id, unless it exists (a create that fails
   because another worker made it meanwhile finds it), then record `spawned`;
3. waiting: a child that ended is recorded (`child_<state>`); a deadline that passed fires `expired`; else the
   next look is put off (`engine.core.children.next_look`) and the child looked at once more, so a child that
   ended between the first look and the postponement is not left to the timer.

All of it is store work (no model, no tool): a step runs on the `Offload`'s store side.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from engine.core import commands
from engine.core.canonical import now
from engine.core.children import (
    deadline_at,
    ended,
    intent,
    intent_seq,
    is_spawned,
    next_look,
    parent_link,
    pending_child,
)
from engine.core.decide import decide, validate_payload
from engine.core.definition import CANCEL, EXPIRED, SPAWN, SPAWNED, Child, Workflow
from engine.core.errors import Code, ConcurrencyConflict, IntegrityError, RailyardError, Refused
from engine.core.payloads import ChildRecord
from engine.core.rows import TaskRow
from engine.core.task import TaskState
from engine.runtime import config, fanout
from engine.runtime.leases import current_epoch
from engine.runtime.offload import INLINE, Offload

if TYPE_CHECKING:
    from engine.runtime.engine import Engine

log = logging.getLogger("railyard.children")

ACTOR = "system:children"


class ChildRunner:
    """Runs a task's child state, following the intent / child / end protocol."""

    def __init__(self, engine: Engine, *, io: Offload = INLINE, recheck: timedelta | None = None) -> None:
        self.engine = engine
        self.io = io
        self.recheck = recheck if recheck is not None else timedelta(seconds=config.child_recheck_seconds())

    async def advance(self, task: TaskState) -> TaskState:
        """One pass of the protocol; returns the task as it now stands (waiting in the state, or moved on)."""
        return await self.io.store(lambda: self.step(task))

    def step(self, task: TaskState) -> TaskState:
        definition = self.engine.definition_of(task)
        state = definition.state(task.state)
        if not isinstance(state, Child) or task.terminal:
            raise Refused(
                f"task {task.task_id} is in {task.state!r}, not a child state",
                code=Code.TRIGGER_NOT_ALLOWED,
                task_id=task.task_id,
            )
        if state.fans_out:
            return fanout.step(self, task, state)
        record = pending_child(task)
        if record is None:
            task = self._spawn(task, state)
            record = pending_child(task)
            assert record is not None
        if not is_spawned(task):
            self.ensure_child(task, record)
            task = self.engine.commit_system(
                task, SPAWNED, {"child": {"task_id": record["task_id"], "action_id": record["action_id"]}}, actor=ACTOR
            )
            if task.cancel_requested is not None and not state.holds_child:
                return self._complete_cancel(task)  # a cancel waited for the start; the child is abandoned to itself
        return self._look(task, state, record)

    def _spawn(self, task: TaskState, state: Child) -> TaskState:
        """Record the intent: the child's pinned version, its input (built by code, checked here), its ids."""
        child = self.engine.registry.get(state.workflow, state.version)
        assert state.input is not None  # the definition does not validate without one
        try:
            built = dict(state.input(task))
            _, input_json = validate_payload(child.input, f"{child.ref} input", built)
        except Exception as error:  # the builder is the workflow's code: whatever it raises is its mistake
            raise Refused(
                f"task {task.task_id}: the input state {task.state!r} builds for {child.ref} is refused: "
                f"{getattr(error, 'message', type(error).__name__)}",
                code=Code.CHILD_INPUT_INVALID,
                task_id=task.task_id,
                child_workflow=child.ref,
            ) from None
        data = intent(task, child, input_json or {}, now(), holds=state.holds_child)
        return self.engine.commit_system(task, SPAWN, data, actor=ACTOR)

    def ensure_child(self, task: TaskState, record: ChildRecord) -> None:
        """Make the child the intent names, unless it exists: its id is the store's key, so there is one."""
        store = self.engine.store
        if store.row(record["task_id"]) is not None:
            return
        child = self._pinned(record)
        created = commands.start_child(child, task, record, parent_link(task, record, intent_seq(task)), at=now())
        try:
            self.engine.create(child, created)
        except RailyardError:
            if store.row(record["task_id"]) is None:
                raise
            log.info("task %s: child %s was started by another worker meanwhile", task.task_id, record["task_id"])

    def _pinned(self, record: ChildRecord) -> Workflow:
        """The child's definition, as the intent pinned it (version and digest)."""
        name, _, version = str(record.get("workflow", "")).rpartition("@")
        return self.engine.pinned_definition(name, int(version), str(record.get("digest")))

    def _look(self, task: TaskState, state: Child, record: ChildRecord) -> TaskState:
        if task.cancel_requested is not None and state.on_parent_end == "cancel":
            # The parent's cancel waits for its child's end: ask the child to stop first. Every look asks again
            # until it has ended, so a worker that died after the parent's request and before the child's is covered.
            self.cancel_child(task, record, f"its parent {task.task_id} was cancelled")
        child = self._ended(record)
        if child is not None:
            return self._record_end(task, state, record, child)
        deadline = deadline_at(state, task)
        if deadline is not None and now() >= deadline:
            if state.on_parent_end == "cancel":  # before the parent leaves: a crash between leaves the parent due
                self.cancel_child(task, record, f"its parent {task.task_id} stopped waiting (deadline)")
            return self.engine.transition(task, EXPIRED, actor="system:timer", system=True)
        epoch = current_epoch(task.task_id)
        if epoch is None:
            return task  # not under a worker's lease (`Engine.run`): the task stays due, for a worker
        self.engine.store.postpone(task.task_id, epoch, next_look(state, task, now(), self.recheck))
        child = self._ended(record)  # ended between the first look and the postponement: its wake-up may be lost
        return self._record_end(task, state, record, child) if child is not None else task

    def cancel_child(self, task: TaskState, record: ChildRecord, why: str) -> None:
        """Request the cancel of a running child, under the rules of any cancel (a write it has in flight settles
        first, and its end, the payment's effect with it, is then recorded in the parent too). On the parent's
        authority: the engine holds the child workflow's cancel role for it. Asked once: a child that ended or
        already has a cancel waiting is left as it is."""
        try:
            child = self.engine.load(record["task_id"])
        except RailyardError as error:
            log.warning(
                "task %s: its child %s could not be read to cancel it: %s", task.task_id, record["task_id"], error
            )
            return
        if child.terminal or child.cancel_requested is not None:
            return
        definition = self.engine.definition_of(child)
        held = definition.operator_of(CANCEL)
        reason = f"{why}: {(task.cancel_requested or {}).get('reason') or ''!s}".rstrip(": ")[:500]
        try:
            decision = decide(
                definition, child, CANCEL, {"reason": reason}, actor=ACTOR, roles=frozenset({held} if held else ())
            )
            self.engine.commit(child, decision, actor=ACTOR)
        except ConcurrencyConflict:
            log.info("task %s: its child %s moved meanwhile; the next look asks again", task.task_id, child.task_id)

    def child_row(self, record: ChildRecord) -> TaskRow:
        """The row of a child recorded as started: that it is missing is an integrity error (CHILD_MISSING)."""
        row = self.engine.store.row(record["task_id"])
        if row is None:
            raise IntegrityError(
                f"child task {record['task_id']} is recorded as started and is not in the database",
                code=Code.CHILD_MISSING,
                task_id=record["task_id"],
            )
        return row

    def _ended(self, record: ChildRecord) -> TaskState | None:
        """The child, folded, if it has ended; None while it runs."""
        row = self.child_row(record)
        if row.status != "terminal":
            return None
        return self.engine.load(record["task_id"])

    def _record_end(self, task: TaskState, state: Child, record: ChildRecord, child: TaskState) -> TaskState:
        trigger, data = ended(state, record, child)
        return self.engine.commit_system(task, trigger, data, actor=ACTOR)

    def _complete_cancel(self, task: TaskState) -> TaskState:
        """The start a cancel waited for is settled: the parent is cancelled, as its requester's (the end policy then
        cancels the child it just made, `Engine`)."""
        decision, requester = commands.requested_cancel(self.engine.definition_of(task), task, ACTOR)
        return self.engine.commit(task, decision, actor=requester)
