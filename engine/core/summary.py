"""One line per event for people: what the step was about, read from its typed payload.

The CLI's history, the API's timeline and inbox, the demo and the transition log
all show an event through `summarise`, so a step reads the same everywhere. The
log passes `values=False`: it names tools, actions, codes and people but never
prints arguments, inputs, results or comments (they may hold personal data).
"""

from __future__ import annotations

import json
from typing import Any

from engine.core.definition import FORK, MIGRATE, REDRIVE, START
from engine.core.effects import CANCEL_REQUESTED
from engine.core.events import Event
from engine.core.payloads import EventData


def compact(value: Any, width: int | None = None) -> str:
    """`value` as one line of JSON, cut to `width` characters with an ellipsis."""
    return clip(json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str), width)


def clip(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def summarise(event: Event, width: int | None = None, *, values: bool = True) -> str:
    """What `event` was about, in a few words (the code, when it has one, is shown beside it by the caller)."""
    return clip(_describe(event.trigger, event.actor, event.data, values), width)


def _describe(trigger: str, actor: str, data: EventData, values: bool) -> str:
    if trigger == START:
        return compact(data.get("input", {})) if values else f"started on {data.get('workflow')}"
    if trigger == FORK:
        origin = data.get("forked_from")
        source, seq = (origin.get("task_id"), origin.get("seq")) if isinstance(origin, dict) else (None, None)
        reason = f": {data.get('reason')}" if values and data.get("reason") else ""
        return f"forked from {source} at seq {seq} onto {data.get('workflow')}{reason}"
    if trigger == REDRIVE:
        reason = f": {data.get('reason')}" if values and data.get("reason") else ""
        return f"redriven by {actor}, budgets reset{reason}"
    if trigger == MIGRATE:
        reason = f": {data.get('reason')}" if values and data.get("reason") else ""
        return f"migrated {data.get('from')} -> {data.get('to')}{reason}"
    if (approval := data.get("approval")) is not None:
        comment = f": {approval.get('comment')}" if values and approval.get("comment") else ""
        return f"{approval.get('decision')} by {approval.get('actor')} as {approval.get('role')}{comment}"
    if (settled := data.get("settled")) is not None:
        evidence = f" (evidence: {settled.get('evidence')})" if values else ""
        return f"settled {settled.get('tool')} as {settled.get('outcome')} by {actor}{evidence}"
    if (turn := data.get("turn")) is not None:
        head = f"model turn ({turn.get('strategy')})"
        proposal = data.get("proposal")
        if proposal is not None:  # the action is the trigger: what it was fired with says the most
            if values and "args" in data:
                return compact(data["args"])
            return f"{head}: proposed {proposal.get('action')}"
        if (escalated := turn.get("escalated")) is not None:  # what the next attempt changes
            nxt = "reminder restated" if escalated.get("step") == "reminder" else f"escalates to {escalated.get('to')}"
            return f"{head}: {turn.get('code')}; {nxt}"
        return f"{head}: {turn.get('code')}" if turn.get("code") else head
    if (intent := data.get("intent")) is not None:
        arguments = f" {compact(intent.get('arguments'))}" if values else ""
        action = str(intent.get("action_id"))[:12]
        return f"call {intent.get('tool')}{arguments} (attempt {data.get('attempt')}, action {action})"
    if (outcome := data.get("outcome")) is not None:
        result = data.get("tool_result")
        tool = result.get("tool") if result is not None else None
        line = f"{tool or 'tool'}: {outcome.get('outcome')}"
        if values and outcome.get("result") is not None:
            line += f" {compact(outcome.get('result'))}"
        if data.get("reconciled") is True:
            line += " (reconciled)"
        if (asserted := data.get("asserted")) is not None:
            line += f" (asserted by {asserted.get('by')})"
        return line
    reconciled = data.get("reconciled")
    if isinstance(reconciled, dict):
        return f"reconcile action {str(reconciled.get('action_id'))[:12]}: {reconciled.get('outcome')}"
    if "budget" in data:
        used = f" (used {data['used']} of {data['limit']})" if "used" in data and "limit" in data else ""
        return f"budget {data['budget']} ran out{used}"
    if "failures" in data:
        return f"{data.get('error')} in {data['failures']} attempts in a row"
    if trigger == CANCEL_REQUESTED:
        why = (data.get("args") or {}).get("reason")
        return f"cancel requested by {actor}" + (f": {why}" if values and why else "")
    if not values:
        return ""
    if "args" in data:
        return compact(data["args"])
    shown = {k: v for k, v in data.items() if k not in ("guards", "requested_at_seq")}
    return compact(shown) if shown else ""
