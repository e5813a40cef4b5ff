"""Advance a task in a tool state: intent first, then the call, then its outcome as the next transition.

The protocol that makes a write happen at most once per action id:

1. `call` records the prepared call as the intent, before the tool runs.
2. The tool runs (no database transaction is open meanwhile).
3. `succeeded`, `failed` or `unknown` records the outcome and leaves the state.

A task found with an intent and no outcome (its worker died between 1 and 3)
is never simply called again if the tool writes: `reconcile(action_id)` asks
the remote what happened; `succeeded`/`failed` record that outcome, only
`not_found` permits a new attempt with the same action id, and a remote that
still cannot tell after the budget leaves the task `unknown`
(TOOL_EXECUTION_UNKNOWN), for a human. The same holds for a retry after an
`unknown` outcome: it reconciles first. A write whose remote can neither
deduplicate nor reconcile is settled only by an operator's recorded assertion
(`Engine.settle`). A read tool may simply run again, up to its `max_attempts`.

An outcome is never dropped: if a person wrote while the tool ran (a cancel,
which becomes `cancel_requested` while the write is open), the outcome is
decided again on the task as it is then and recorded, leading where the cancel
says (`cancelled`, or the workflow's `effect_after_cancel` state if the effect
happened).

A step is a coroutine, like an agent turn: its appends go to the `Offload`'s
store work and the tool's call (and a reconciliation) to its slow work, so in a
worker a tool that takes seconds holds a thread but no database connection.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from engine.core import commands
from engine.core.budgets import exceeded
from engine.core.canonical import format_instant, now
from engine.core.definition import CALL, LIMIT, RECONCILE, Tool
from engine.core.effects import lands_until
from engine.core.errors import Code, ConcurrencyConflict, LeaseLost, Refused
from engine.core.payloads import Asserted, EventData
from engine.core.task import TaskState
from engine.core.tools.call import Acting, PreparedToolCall, ToolKind
from engine.core.tools.catalog import ToolDef
from engine.observability import hooks
from engine.runtime.execute import ToolOutcome, execute, outcome_of, reconcile
from engine.runtime.offload import INLINE, Offload
from engine.runtime.port import TaskPort

log = logging.getLogger("railyard.tools")

ACTOR = "system:tools"
#: How long past a write's timeout its stranded attempt is assumed over, before reconciliation is trusted.
SETTLE_MARGIN_SECONDS = 1.0
#: How many times an outcome is decided again on a task people keep writing to (each a cancel request, say).
LATE_OUTCOME_ATTEMPTS = 5


class AttemptInFlight(Refused):
    """A stranded write attempt may still be running: look again at `settle_after`, do nothing now.

    A worker postpones the task until then; a caller of `Engine.run` is refused (OUTCOME_UNSETTLED).
    """

    def __init__(self, task_id: str, settle_after: datetime) -> None:
        super().__init__(
            f"task {task_id}: the last attempt of its write may still be running until "
            f"{format_instant(settle_after)}: it is reconciled after that (a worker does so by itself)",
            code=Code.OUTCOME_UNSETTLED,
            task_id=task_id,
            settle_after=format_instant(settle_after),
        )
        self.task_id = task_id
        self.settle_after = settle_after


class ToolRunner:
    """Runs the tool of a task's tool state, following the intent/outcome protocol."""

    def __init__(self, engine: TaskPort, *, reconcile_attempts: int = 3, io: Offload = INLINE) -> None:
        self.engine = engine
        self.reconcile_attempts = reconcile_attempts
        self.io = io

    async def advance(self, task: TaskState) -> TaskState:
        """One step of the protocol; returns the task as it now stands (moved on, or still in the state)."""
        definition = self.engine.definition_of(task)
        state = definition.state(task.state)
        if not isinstance(state, Tool) or task.terminal:
            raise Refused(
                f"task {task.task_id} is in {task.state!r}, not a tool state",
                code=Code.TRIGGER_NOT_ALLOWED,
                task_id=task.task_id,
            )
        if definition.tools is None or state.tool not in definition.tools:
            # The deployment lacks the tool: a configuration error, not the task's failure (it is left as it is).
            raise Refused(
                f"{definition.ref} state {task.state!r} names tool {state.tool!r}, which its catalog does not have",
                code=Code.TOOL_NOT_FOUND,
                task_id=task.task_id,
                tool=state.tool,
            )
        tool = definition.tools.get(state.tool)
        if not task.prepared or task.prepared.get("tool") != tool.name:
            return await self._outcome(
                task, ToolOutcome("failed", None, Code.TOOL_NOT_ALLOWED, "no prepared call for this tool", 0)
            )
        prepared = PreparedToolCall.from_dict(task.prepared)
        if tool.kind is ToolKind.READ:
            if not task.visit.get("pending") or int(task.visit.get("calls", 0)) < tool.max_attempts:
                return await self._attempt(task, tool, prepared)
            return await self._outcome(
                task, ToolOutcome("failed", None, Code.TOOL_TIMEOUT, f"no answer after {tool.max_attempts} attempts", 0)
            )
        effect = task.effect if task.effect and task.effect.get("action_id") == prepared.action_id else None
        status = effect.get("status") if effect is not None else None
        if status in (None, "failed", "not_executed"):
            # Never sent, refused by the remote, or established not to have happened: sending it is safe.
            if task.cancel_requested is not None:
                return await self._complete_cancel(task)
            return await self._attempt(task, tool, prepared)
        if status == "executed" and effect is not None:  # an operator verified it happened: record, never resend
            asserted: Asserted = {"by": str(effect.get("by")), "evidence": str(effect.get("evidence"))}
            return await self._outcome(task, ToolOutcome("succeeded", None, None, None, 0), asserted=asserted)
        # An intent without an outcome (its worker died, or this is a retry after `unknown`), or a retry of a
        # write that succeeded: what the remote did must be established before anything is sent.
        if tool.reconcile is None:
            if tool.idempotent_remote:  # the remote deduplicates by the same idempotency key: sending again is safe
                return await self._attempt(task, tool, prepared)
            return await self._outcome(
                task,
                ToolOutcome(
                    "unknown",
                    None,
                    Code.TOOL_EXECUTION_UNKNOWN,
                    "the remote can neither deduplicate nor say what happened: an operator records what they verified "
                    "(railyard settle)",
                    0,
                ),
            )
        # The attempt may still be running (its worker lost the lease but not its life, or it timed out and its
        # thread goes on): a `not_found` now could be followed by the original call landing. Ask only once it can
        # no longer be waited on.
        settle_after = lands_until(effect, tool.timeout, SETTLE_MARGIN_SECONDS)
        if settle_after is not None and now() < settle_after:
            raise AttemptInFlight(task.task_id, settle_after)
        started = time.perf_counter() if hooks.active else 0.0
        answer = await self.io.wait(lambda: reconcile(tool, prepared.action_id))
        settled = outcome_of(answer)
        if hooks.active:
            code = str(answer.code) if answer.code is not None else None
            seconds = time.perf_counter() - started
            hooks.tool_call(task, tool.name, "reconcile", prepared.action_id, answer.outcome, code, seconds)
        if settled is None:  # not_found: it never happened; a new attempt with the same action id
            task = await self._append(
                task, RECONCILE, {"reconciled": {"outcome": "not_found", "action_id": prepared.action_id}}, late=False
            )
            if task.cancel_requested is not None:
                return await self._complete_cancel(task)
            return await self._attempt(task, tool, prepared)
        if settled.outcome == "unknown":
            if int(task.visit.get("reconciles", 0)) + 1 < self.reconcile_attempts:
                return await self._append(
                    task, RECONCILE, {"reconciled": {"outcome": "unknown", "action_id": prepared.action_id}}
                )
            settled = ToolOutcome("unknown", None, Code.TOOL_EXECUTION_UNKNOWN, settled.message, 0)
        return await self._outcome(task, settled, reconciled=True)

    async def _complete_cancel(self, task: TaskState) -> TaskState:
        """The write a cancel waited for is settled and did not happen: the cancel takes effect, as its requester's."""
        if task.unsettled is not None:  # only a settled write lets the cancel through (decide would request again)
            return task
        decision, requester = commands.requested_cancel(self.engine.definition_of(task), task, ACTOR)
        return await self.io.store(lambda: self.engine.commit(task, decision, actor=requester))

    async def _attempt(self, task: TaskState, tool: ToolDef, prepared: PreparedToolCall) -> TaskState:
        over = exceeded(self.engine.definition_of(task), task, now(), next_call=prepared.to_dict())
        if over is not None:
            return await self._append(task, LIMIT, {"code": str(Code.AGENT_STEP_LIMIT_EXCEEDED), **over})
        attempt = int(task.visit.get("calls", 0)) + 1
        # The intent must be on record under this worker's lease before anything runs: if this append is
        # refused (the lease was taken over, the task moved), the call is not made.
        task = await self._append(
            task,
            CALL,
            {"intent": prepared.to_dict(), "attempt": attempt, "requested_at": format_instant(now())},
            late=False,
        )
        acting = Acting(task.started_by, task.prepared_by, task.tenant)
        outcome = await self.io.wait(lambda: execute(tool, prepared, acting))
        if hooks.active:
            code = str(outcome.code) if outcome.code is not None else None
            hooks.tool_call(
                task, tool.name, "execute", prepared.action_id, outcome.outcome, code, outcome.duration_ms / 1000
            )
        return await self._outcome(task, outcome)

    async def _outcome(
        self, task: TaskState, outcome: ToolOutcome, *, reconciled: bool = False, asserted: Asserted | None = None
    ) -> TaskState:
        data: EventData = {"outcome": outcome.to_dict()}
        if task.prepared:
            data["action_id"] = task.prepared.get("action_id")
            if outcome.result is not None:
                data["tool_result"] = {"tool": task.prepared.get("tool"), "result": outcome.result}
            elif outcome.code is not None:  # what the model may see of a failure: the code and a short message
                data["tool_result"] = {
                    "tool": task.prepared.get("tool"),
                    "error": {"code": str(outcome.code), "message": outcome.message},
                }
        if reconciled:
            data["reconciled"] = True
        if asserted is not None:  # the outcome an operator verified (`settle`): who, and where the evidence is
            data["asserted"] = asserted
        return await self._append(task, outcome.outcome, data)

    async def _append(self, task: TaskState, trigger: str, data: EventData, *, late: bool = True) -> TaskState:
        """`_commit` on the store's side of the `Offload`."""
        return await self.io.store(lambda: self._commit(task, trigger, data, late=late))

    def _commit(self, task: TaskState, trigger: str, data: EventData, *, late: bool = True) -> TaskState:
        """Append a protocol step. An intent or a not_found (`late=False`) that conflicts propagates: nothing runs
        on a task that moved. An outcome (`late=True`) is never dropped: if a person wrote meanwhile (a cancel
        request, say), it is decided again on the task as it is now and recorded there."""
        for _attempt in range(LATE_OUTCOME_ATTEMPTS):
            try:
                return self.engine.commit_system(task, trigger, data, actor=ACTOR)
            except LeaseLost:
                # Another worker holds the task now; it finds the intent without an outcome and reconciles it.
                log.warning(
                    "task %s: %s not recorded, the lease was taken over; the holder reconciles action %s",
                    task.task_id,
                    trigger,
                    data.get("action_id"),
                )
                raise
            except ConcurrencyConflict:
                if not late:
                    raise
                moved = self.engine.load(task.task_id)
                pending = moved.visit.get("pending")
                if moved.terminal or moved.state != task.state or pending != task.visit.get("pending"):
                    # The attempt's fate was recorded by another writer (a reconciling worker) if its intent is no
                    # longer open; if it is, nothing may have moved the task, and this outcome says what happened.
                    level = logging.ERROR if moved.unsettled is not None else logging.INFO
                    log.log(
                        level,
                        "task %s: %s for action %s not recorded here: the task is in %s at seq %s (outcome %s)",
                        task.task_id,
                        trigger,
                        data.get("action_id"),
                        moved.state,
                        moved.seq,
                        outcome.get("outcome") if (outcome := data.get("outcome")) is not None else None,
                    )
                    return moved
                task = moved
        raise ConcurrencyConflict(task.task_id, task.seq, None, task.state)
