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
"""

from __future__ import annotations

from typing import Any

from engine.core.definition import CALL, DEMOTE, RECONCILE, REPAIR, Agent, Tool, Workflow
from engine.core.effects import CANCEL_REQUESTED, SETTLE
from engine.core.payloads import EventData

#: Records made about a task where it stands (a cancel request, an operator's assertion): they do not start a visit.
_NOTES = frozenset({CANCEL_REQUESTED, SETTLE})


def next_visit(
    definition: Workflow,
    visit: dict[str, Any],
    trigger: str,
    to_state: str,
    data: EventData,
    from_state: str | None = None,
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
    if trigger in (REPAIR, DEMOTE):
        out = dict(visit)
        out["demoted"] = demoted
        if trigger == REPAIR:
            out["repairs"] = int(visit.get("repairs", 0)) + 1
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
    if trigger == RECONCILE:
        return {**visit, "reconciles": int(visit.get("reconciles", 0)) + 1}
    target = definition.state(to_state)
    if isinstance(target, Agent):
        return {"repairs": 0, "mode": None, "messages": [], "demoted": demoted, **remembered}
    if isinstance(target, Tool):
        return {"calls": 0, "reconciles": 0, "pending": None, "demoted": demoted, **remembered}
    return {**({"demoted": demoted} if demoted else {}), **remembered}
