"""The current visit of an agent or tool state, folded from the log.

Agent states: the model's conversation and its repair count. Tool states: how
many attempts were made, and whether an intent is pending (recorded, with no
outcome yet: the worker died mid-call, and a write must be reconciled).

A visit starts when a task enters an agent state and lasts through its
`repair` and `demote` self-transitions; any other transition ends it. The
messages of a visit (reminders, the model's calls, the errors fed back) are
recorded in each turn's event, so a worker that resumes a task rebuilds the
exact conversation, reminders included (provider prefix caches stay valid),
without calling the model again. `demoted` outlives visits: a request shape a
provider refused is not sent again for this task; so does `worked`, the rungs
that worked after escalating, where later visits start. Within a visit, `rung`
is where escalation moved the task and `escalations` how many steps it took.

A `backoff` (a provider call that failed in a way calling again may fix) also
continues the visit: `retries` counts them since the model last answered,
`retrying_since` is when the first of them was recorded, and `due_at` is when
the next call may be made. Any later event of the visit clears `due_at`; an
answer (`repair`) clears all three, so the state's retry budget starts afresh.
"""

from __future__ import annotations

from typing import Any

from engine.core.definition import (
    BACKOFF,
    CALL,
    COMMENT,
    DEMOTE,
    RECONCILE,
    REPAIR,
    SPAWN,
    SPAWNED,
    WORK_CLAIMED,
    WORK_RELEASED,
    Agent,
    Tool,
    Workflow,
)
from engine.core.effects import CANCEL_REQUESTED, SETTLE
from engine.core.payloads import EventData

#: Records made about a task where it stands (a cancel request, an operator's assertion, a person's note or claim):
#: they do not start a visit.
_NOTES = frozenset({CANCEL_REQUESTED, SETTLE, COMMENT, WORK_CLAIMED, WORK_RELEASED})


def next_visit(
    definition: Workflow,
    visit: dict[str, Any],
    trigger: str,
    to_state: str,
    data: EventData,
    from_state: str | None = None,
    seq: int = 0,
) -> dict[str, Any]:
    """The visit after an event: continued on `repair`/`demote`, restarted on entering an agent state.

    The lists in a visit are never changed in place, so a visit may share them with the one before.
    """
    if trigger in _NOTES and to_state == from_state:
        return visit
    demoted = list(visit.get("demoted", []))  # a list of its own, for the visits that take it
    worked = list(visit.get("worked", []))
    turn = data.get("turn")
    if turn and turn.get("demoted") and turn["demoted"] not in demoted:
        demoted.append(turn["demoted"])
    if turn and turn.get("worked") and turn["worked"] not in worked:
        worked.append(turn["worked"])
    # Only when there is something: the visits of logs without escalations fold exactly as they always did.
    remembered = {"worked": worked} if worked else {}
    if trigger == BACKOFF:
        retry: dict[str, Any] = dict(data.get("retry") or {})  # the runner always writes one; a log without it folds
        out = {k: v for k, v in visit.items() if k != "due_at"}
        out["retries"] = int(visit.get("retries", 0)) + 1
        if "since" in retry:
            out["retrying_since"] = visit.get("retrying_since", retry["since"])
        if "due_at" in retry:
            out["due_at"] = retry["due_at"]
        return out
    if trigger in (REPAIR, DEMOTE):
        out = dict(visit)
        out["demoted"] = demoted
        out.pop("due_at", None)
        if trigger == REPAIR:
            out["repairs"] = int(visit.get("repairs", 0)) + 1
            out.pop("retries", None)
            out.pop("retrying_since", None)
        if turn:
            out["messages"] = [*visit.get("messages", []), *turn.get("messages", [])]
            out["mode"] = turn.get("mode", visit.get("mode"))
            if escalated := turn.get("escalated"):
                out["rung"] = escalated["to"]
                out["escalations"] = int(visit.get("escalations", 0)) + 1
        return out
    if trigger == CALL:  # a tool's intent: one more attempt, pending until its outcome
        return {
            **visit,
            "calls": int(visit.get("calls", 0)) + 1,
            "pending": data["intent"]["action_id"],
            "pending_at": data.get("requested_at"),
        }
    if trigger == SPAWN and "fan_out" in data:  # a fan-out's intent: every child's id, version and input
        return {"fan_out": dict(data["fan_out"]), "spawned_at": data.get("requested_at"), "spawn_seq": seq}
    if trigger == SPAWN:  # a child's intent: the child's id, and the time its deadline counts from
        child = data["child"]
        return {
            "child": dict(child),  # what a worker that resumes makes the child from: its id, version and input
            "spawned_at": data.get("requested_at"),
            "spawn_seq": seq,
        }
    if trigger == SPAWNED:
        return {**visit, "spawned": True}
    if trigger == RECONCILE:
        return {**visit, "reconciles": int(visit.get("reconciles", 0)) + 1}
    target = definition.state(to_state)
    if isinstance(target, Agent):
        return {"repairs": 0, "mode": None, "messages": [], "demoted": demoted, **remembered}
    if isinstance(target, Tool):
        return {"calls": 0, "reconciles": 0, "pending": None, "demoted": demoted, **remembered}
    return {**({"demoted": demoted} if demoted else {}), **remembered}
