"""One line per event for people: what the step was about, read from its typed payload.

The CLI's history, the API's timeline and inbox, the demo and the transition log
all show an event through `summarise`, so a step reads the same everywhere. The
log passes `values=False`: it names tools, actions, codes and people but never
prints arguments, inputs, results or comments (they may hold personal data).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.core.definition import COMMENT, FORK, MIGRATE, REDRIVE, SPAWN, SPAWNED, START, WORK_CLAIMED, WORK_RELEASED
from engine.core.effects import CANCEL_REQUESTED
from engine.core.events import Event
from engine.core.payloads import ChildRecord, EventData, FanOutRecord


def compact(value: Any, width: int | None = None) -> str:
    """`value` as one line of JSON, cut to `width` characters with an ellipsis."""
    return clip(json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str), width)


def clip(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _child_line(trigger: str, child: ChildRecord, values: bool) -> str:
    """A child state's step, naming the child (`engine.core.children`)."""
    if trigger == SPAWN:
        action = str(child.get("action_id"))[:12]
        return f"starting child {child.get('task_id')} on {child.get('workflow')} (action {action})"
    if trigger == SPAWNED:
        return f"child {child.get('task_id')} started"
    result = f", result {compact(child.get('result'))}" if values and child.get("result") is not None else ""
    return f"child {child.get('task_id')} ended {child.get('state')}{result}"


def _fan_out_line(trigger: str, fan: FanOutRecord) -> str:
    """A fan-out's step: how many children, and the join's outcome (`engine.core.fanout`)."""
    n = len(fan.get("children", []))
    if trigger == SPAWN:
        return (
            f"starting {n} children on {fan.get('workflow')}, join {fan.get('join')} (action {fan['action_id'][:12]})"
        )
    if trigger == SPAWNED:
        return f"{n} children started"
    ends = [str(c.get("state")) for c in fan.get("children", [])]
    counted = ", ".join(f"{ends.count(e)} {e}" for e in dict.fromkeys(ends))
    return f"{n} children ended ({counted}): {fan.get('outcome')}"


def summarise(event: Event, width: int | None = None, *, values: bool = True) -> str:
    """What `event` was about, in a few words (the code, when it has one, is shown beside it by the caller)."""
    return clip(_describe(event.trigger, event.actor, event.data, values), width)


def _describe(trigger: str, actor: str, data: EventData, values: bool) -> str:
    if trigger == START:
        parent = data.get("parent")
        by = f" (child of {parent.get('task_id')}, its seq {parent.get('seq')})" if parent is not None else ""
        return (compact(data.get("input", {})) if values else f"started on {data.get('workflow')}") + by
    if (child := data.get("child")) is not None:
        return _child_line(trigger, child, values)
    if trigger == COMMENT:
        note = data.get("note")
        text = note.get("text") if note is not None else None
        return f"note by {actor}" + (f": {text}" if values and text else "")
    if trigger == WORK_CLAIMED:
        claim = data.get("claim") or {}
        taken = f", taken over from {claim.get('taken_from')}" if claim.get("taken_from") else ""
        said = f": {claim.get('reason')}" if values and claim.get("reason") else ""
        return f"{actor} is on it until {claim.get('until')}{taken}{said}"
    if trigger == WORK_RELEASED:
        return f"{actor} is off it"
    if (fan := data.get("fan_out")) is not None:
        return _fan_out_line(trigger, fan)
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
        if (retry := data.get("retry")) is not None:  # a backoff: when the next call is due
            return f"{head}: {turn.get('code')}; next try at {retry.get('due_at')} (retry {retry.get('n')})"
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
        if data.get("reconciled") is True:  # before the result, so a line cut short (`history`: 60) still says it
            line += ", recovered by reconciliation"
        if values and outcome.get("result") is not None:
            line += f" {compact(outcome.get('result'))}"
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


def details(event: Event, width: int | None = 300, *, earlier: Sequence[Event] = ()) -> list[str]:
    """What a person reading the timeline needs beyond `summarise`'s line, one sentence each: a model turn's
    rung, attempts and escalation, the answer the engine refused and the error it fed back; a tool's error; an
    outcome found by reconciliation, and why it had to be (`earlier`, the events before this one: the worker that
    made the call stopped before recording its outcome, or the outcome was not known); an approval's digest.

    The page shows these under the line; `railyard history` prints the line. Values (arguments, answers,
    comments) are included: callers that must not show them use `summarise(values=False)` alone."""
    data = event.data
    out: list[str] = []
    if (stood_in := data.get("stood_in")) is not None:
        out.append(f"{event.actor} fired the model's action in its place, as {stood_in.get('role')}")
    if (turn := data.get("turn")) is not None:
        attempts = turn.get("attempts")
        out.append(
            f"asked {turn.get('model')} on the {turn.get('strategy')} rung"
            + (f" ({attempts} provider calls)" if attempts and attempts > 1 else "")
            + (", thinking" if turn.get("thinking") else "")
        )
        for message in turn.get("messages") or []:
            if message.get("role") != "assistant":
                continue
            said = [str(message["content"])] if message.get("content") else []
            said += [f"{c.get('name')}({c.get('arguments')})" for c in message.get("tool_calls") or []]
            if said:
                verb = "answered" if turn.get("code") is None else "answered, refused"
                out.append(clip(f"the model {verb}: " + " ".join(said), width))
        if turn.get("code") is not None:
            told = "; ".join(str(e.get("msg")) for e in turn.get("errors") or [] if isinstance(e, dict))
            out.append(clip(f"refused with {turn.get('code')}" + (f", fed back: {told}" if told else ""), width))
        if (escalated := turn.get("escalated")) is not None:
            step = escalated.get("step")
            nxt = "restate the reminder" if step == "reminder" else f"force harder on the {escalated.get('to')} rung"
            out.append(f"the answer ignored the {escalated.get('from')} rung: the next attempt will {nxt}")
        if turn.get("worked"):
            out.append(f"the {turn.get('worked')} rung worked after escalating: the next visit starts there")
        if turn.get("demoted"):
            out.append(f"the provider refused the request shape {turn.get('demoted')}: it is not sent again")
        for again in turn.get("retried") or []:
            if isinstance(again, dict):
                out.append(clip(f"retried after {_said(again)}, waiting {again.get('waited')} s", width))
        if turn.get("provider_message"):
            out.append(clip(f"the provider said: {turn.get('provider_message')}", width))
        if (retry := data.get("retry")) is not None:
            budget = retry.get("budget") or {}
            out.append(
                f"calling again may work: retry {retry.get('n')} of {budget.get('count')} (within "
                f"{budget.get('within_seconds')} s of the first, at {retry.get('since')}); the task is put off until "
                f"{retry.get('due_at')}, and any worker makes the next call then"
            )
        if (spent := data.get("retries_spent")) is not None:
            budget = spent.get("budget") or {}
            out.append(
                f"the retry budget ran out after {spent.get('n')} retries since {spent.get('since')} (at most "
                f"{budget.get('count')} within {budget.get('within_seconds')} s)"
            )
    if (outcome := data.get("outcome")) is not None and outcome.get("code"):
        out.append(clip(f"{outcome.get('code')}: {outcome.get('message') or 'no message'}", width))
    if data.get("reconciled") is True:
        action = str(data.get("action_id") or "")[:12]
        why = (
            "the worker that made it stopped before recording its outcome (it crashed, or lost its lease), so the "
            "worker that took the task over"
            if _stranded(earlier, data.get("action_id"))
            else "its outcome was not known (the answer was lost, or did not come in time), so the engine"
        )
        out.append(
            f"recovered by reconciliation: the call (action {action}) was made once; {why} asked the remote what "
            "became of that action id instead of calling again, and this outcome is what it found"
        )
    elif isinstance(reconciled := data.get("reconciled"), dict):
        found = "it never happened: a new attempt may be made" if reconciled.get("outcome") == "not_found" else ""
        out.append(f"asked the remote about action {str(reconciled.get('action_id'))[:12]}: " + (found or "no answer"))
    if (intent := data.get("intent")) is not None and int(data.get("attempt") or 1) > 1:
        out.append(f"attempt {data.get('attempt')} of the same call: the same action id {intent.get('action_id')}")
    if (approval := data.get("approval")) is not None and approval.get("digest"):
        out.append(f"decided on the prepared call with digest {approval.get('digest')}")
    if (settled := data.get("settled")) is not None:
        out.append(f"an operator's assertion: the write was {settled.get('outcome')} (it was {settled.get('was')})")
    if event.trigger == CANCEL_REQUESTED:
        out.append("a write was in flight: the cancel takes effect once its outcome is recorded")
    if event.trigger == MIGRATE and data.get("state_map"):
        out.append(f"state map {compact(data.get('state_map'))}")
    return out


def _stranded(earlier: Sequence[Event], action_id: object) -> bool:
    """Whether the last record of `action_id`'s call before now is its intent, not an outcome: the call was made
    and nothing said what became of it, as when the worker making it dies (asking the remote in between, a
    `reconcile` that found no answer, changes nothing). An `unknown` outcome says it was recorded as not known."""
    for e in reversed(earlier):
        intent = e.data.get("intent")
        if intent is not None and intent.get("action_id") == action_id:
            return True
        if e.data.get("outcome") is not None and e.data.get("action_id") == action_id:
            return False
    return False


def _said(error: dict[str, Any]) -> str:
    """A provider error as a turn's `retried` records it: `RATE_LIMITED (429: Rate limit reached)`."""
    status, message = error.get("status"), error.get("message")
    inside = ": ".join(str(p) for p in (status, message) if p)
    return f"{error.get('code')}" + (f" ({inside})" if inside else "")
