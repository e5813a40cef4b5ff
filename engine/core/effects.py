"""What a task's write calls have come to, and the cancel requested while one was in flight: pure, folded from the log.

A write is *unsettled* from the event that records its intent (`call`) until an
outcome says what the remote did: `succeeded` or `failed` from the call or from
`reconcile(action_id)`, a reconciled `not_found`, or an operator's recorded
assertion (`settle`: executed, or not executed). An `unknown` outcome leaves it
unsettled. While a write is unsettled the task cannot become terminal: a
`cancel` is recorded as `cancel_requested` and takes effect when the write
settles (to `cancelled` if nothing happened, to the workflow's
`effect_after_cancel` state if the effect did happen).

The built-in guards below route those transitions. Their names are recorded in
the log and checked by replay, so they are given names that do not depend on
the module they live in.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.core.canonical import format_instant, parse_instant
from engine.core.events import Event
from engine.core.payloads import EventData

#: The built-in triggers of this module: a cancel recorded while a write is unsettled, and an operator's assertion.
CANCEL_REQUESTED = "cancel_requested"
SETTLE = "settle"
#: The statuses of a write that leave its outcome open.
OPEN = frozenset({"pending", "unknown", "running"})
#: A write's status, after the last event about its action id. A child's start is `pending` until `spawned`, then
#: `running` until its end is recorded when the parent holds it (`Child.holds_child`), and `abandoned` when the
#: parent's deadline ended the wait first.
Status = Literal["pending", "unknown", "succeeded", "failed", "executed", "not_executed", "running", "abandoned"]


class SettleArgs(BaseModel):
    """What an operator verified about a write whose outcome is unknown, and where the proof is."""

    model_config = ConfigDict(extra="forbid")
    outcome: Literal["executed", "not_executed"]
    evidence: str = Field(min_length=1, max_length=500, description="Where the verification can be checked.")


def is_open(effect: dict[str, Any] | None) -> bool:
    """Whether `effect` (a `TaskState.effect`) is a write whose outcome is not settled."""
    return isinstance(effect, dict) and isinstance(status := effect.get("status"), str) and status in OPEN


def may_still_land(effect: dict[str, Any] | None) -> bool:
    """Whether the write's last attempt may still reach the remote: its intent has no outcome (its worker may live
    on), or it timed out (its thread goes on). Then reconciling, or an operator's settlement, must wait until
    the attempt's time is up (`requested_at` + the tool's timeout + the engine's margin)."""
    if not is_open(effect) or effect is None:
        return False
    return effect.get("status") == "pending" or effect.get("code") == "TOOL_TIMEOUT"


def lands_until(effect: dict[str, Any] | None, timeout: float, margin: float) -> datetime | None:
    """Until when the write's last attempt may still reach the remote (`may_still_land`), or None if it cannot:
    its intent's time plus the tool's `timeout` plus the engine's `margin`."""
    requested = effect.get("requested_at") if effect is not None and may_still_land(effect) else None
    if not isinstance(requested, str):
        return None
    return parse_instant(requested) + timedelta(seconds=timeout + margin)


def next_effect(effect: dict[str, Any] | None, event: Event) -> dict[str, Any] | None:
    """The newest write's record after `event`: its action id, tool, the tool state that made it, and its status."""
    data, trigger = event.data, event.trigger
    if trigger == "call":
        intent = data["intent"]
        if intent.get("kind") != "write":
            return effect
        return {
            "action_id": intent["action_id"],
            "tool": intent["tool"],
            "state": event.from_state,
            "status": "pending",
            "requested_at": data.get("requested_at"),
        }
    if trigger == "spawn" and "fan_out" in data:  # a fan-out's starts: one effect, open until every child's end
        fan = data["fan_out"]
        return {
            "action_id": fan["action_id"],
            "tool": f"child:{fan.get('workflow', '')}",
            "state": event.from_state,
            "status": "pending",
            "requested_at": data.get("requested_at"),
            "child": [c["task_id"] for c in fan["children"]],
            "holds": True,
        }
    if trigger == "spawn":  # a child's start is an effect too (`engine.core.children`): open until `spawned`
        child = data["child"]
        return {
            "action_id": child["action_id"],
            "tool": f"child:{child.get('workflow', '')}",
            "state": event.from_state,
            "status": "pending",
            "requested_at": data.get("requested_at"),
            "child": child["task_id"],
            **({"holds": True} if child.get("holds") else {}),
        }
    if effect is None:
        return effect
    if "child" in effect:
        return _next_child_effect(effect, event)

    action = data.get("action_id")
    if (action if action is not None else _action_of(data)) != effect["action_id"]:  # most events: one lookup
        return effect
    if trigger in ("succeeded", "failed", "unknown"):
        outcome = data.get("outcome")
        code = outcome.get("code") if outcome is not None else None
        return {**effect, "status": trigger, "code": code} if code else {**effect, "status": trigger}
    reconciled = data.get("reconciled")
    if trigger == "reconcile" and isinstance(reconciled, dict) and reconciled.get("outcome") == "not_found":
        return {**effect, "status": "not_executed"}
    settled = data.get("settled")
    if trigger == SETTLE and isinstance(settled, dict):
        verified = settled["outcome"]
        if verified not in ("executed", "not_executed"):
            raise ValueError(f"a settlement says {verified!r}, not executed or not_executed")
        return {**effect, "status": verified, "evidence": settled.get("evidence"), "by": event.actor}
    return effect


def _next_child_effect(effect: dict[str, Any], event: Event) -> dict[str, Any]:
    """A child's start after `event`: `spawned` settles it (or makes it `running` while the parent holds the child),
    the record of the child's end settles it, and `expired` ends the parent's wait (the policy was applied)."""
    child = event.data.get("child") or event.data.get("fan_out")
    ours = child is not None and child.get("action_id") == effect["action_id"]
    if event.trigger == "spawned" and ours:
        return {**effect, "status": "running" if effect.get("holds") else "succeeded"}
    if event.trigger.startswith("child_") and ours:
        return {**effect, "status": "succeeded"}
    if event.trigger == "expired" and event.from_state == effect.get("state") and is_open(effect):
        return {**effect, "status": "abandoned"}
    return effect


def _action_of(data: EventData) -> str | None:
    """The action id a `reconcile` or `settle` event names (they carry it inside their own record)."""
    reconciled = data.get("reconciled")
    if isinstance(reconciled, dict):
        return reconciled.get("action_id")
    settled = data.get("settled")
    return settled.get("action_id") if isinstance(settled, dict) else None


def next_cancel_request(
    request: dict[str, Any] | None, event: Event, effect: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Who asked for the cancel that waits for a write to settle, why, and when (None: no cancel waits).

    `effect` is the write's record after `event`. The request is answered by the transition that leaves the
    state once the write is settled (to `cancelled`, or to the workflow's `effect_after_cancel` state); until
    then it stands, through an `unknown` outcome and a retry too.
    """
    if event.trigger == CANCEL_REQUESTED:
        args = event.data.get("args") or {}
        return {
            "actor": event.actor,
            "reason": args.get("reason", ""),
            "seq": event.seq,
            "at": format_instant(event.at),
        }
    answered = event.to_state != event.from_state or event.trigger == SETTLE
    if request is not None and not is_open(effect) and answered:
        return None
    return request


# -- built-in guards: module and name fixed, because the log records them -----------------------------------------
def _builtin(fn: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    fn.__module__ = "railyard"
    fn.__qualname__ = fn.__name__
    return fn


@_builtin
def write_unsettled(ctx: Any) -> str | None:
    """A cancel becomes a request, and a settlement is possible, only while a write's outcome is open."""
    return None if is_open(ctx.task.effect) else "no write of this task is waiting for its outcome"


@_builtin
def cancel_was_requested(ctx: Any) -> str | None:
    """The outcome of a write in flight when a cancel was requested leads where the cancel says."""
    effect = ctx.task.effect
    if ctx.task.cancel_requested is None or not is_open(effect) or effect.get("state") != ctx.task.state:
        return "no cancel waits for a write of this state"
    return None


@_builtin
def cancel_requested_and_executed(ctx: Any) -> str | None:
    if ctx.task.cancel_requested is None or not is_open(ctx.task.effect):
        return "no cancel waits for this write"
    return None if getattr(ctx.args, "outcome", None) == "executed" else "the write was not executed"


@_builtin
def cancel_requested_and_not_executed(ctx: Any) -> str | None:
    if ctx.task.cancel_requested is None or not is_open(ctx.task.effect):
        return "no cancel waits for this write"
    return None if getattr(ctx.args, "outcome", None) == "not_executed" else "the write was executed"
