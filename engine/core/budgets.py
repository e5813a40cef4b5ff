"""Task budgets: a pure check of the counters the fold keeps against the workflow's limits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from engine.core.canonical import parse_instant
from engine.core.definition import Agent, Workflow
from engine.core.fold import call_key, turn_tokens
from engine.core.payloads import EventData, PreparedCallData
from engine.core.task import TaskState


def exceeded(
    definition: Workflow, task: TaskState, now: datetime, *, next_call: PreparedCallData | None = None
) -> EventData | None:
    """The budget the next step would break, as the limit event records it, or None.

    Checked before a model turn (`next_call` None) and before a tool call
    (`next_call` the prepared call about to run).
    """
    budgets, usage = definition.budgets, task.usage
    deadline = budgets.deadline
    if deadline is not None and "started_at" in usage and now - parse_instant(usage["started_at"]) >= deadline:
        return {"budget": "deadline", "limit_seconds": deadline.total_seconds()}
    if next_call is None:
        if int(usage.get("turns", 0)) >= budgets.model_turns:
            return {"budget": "model_turns", "used": usage.get("turns", 0), "limit": budgets.model_turns}
        return _tokens_exceeded(definition, task)
    if int(usage.get("calls", 0)) >= budgets.tool_calls:
        return {"budget": "tool_calls", "used": usage.get("calls", 0), "limit": budgets.tool_calls}
    if int(usage.get("repeats", {}).get(call_key(next_call), 0)) >= budgets.repeats:
        return {"budget": "repeats", "tool": next_call["tool"], "limit": budgets.repeats}
    return None


def _tokens_exceeded(definition: Workflow, task: TaskState) -> EventData | None:
    """The token budget the next model turn would break: the task's, or that of the agent state it is in."""
    budgets, usage = definition.budgets, task.usage
    if budgets.tokens is not None and int(usage.get("tokens", 0)) >= budgets.tokens:
        return {"budget": "tokens", "used": int(usage.get("tokens", 0)), "limit": budgets.tokens}
    if budgets.state_tokens is not None:
        state = definition.state(task.state)
        base = state.base if isinstance(state, Agent) else task.state
        used = int(usage.get("state_tokens", {}).get(base, 0))
        if used >= budgets.state_tokens:
            return {"budget": "state_tokens", "agent_state": base, "used": used, "limit": budgets.state_tokens}
    return None


def token_totals(datas: Iterable[EventData]) -> dict[str, int]:
    """What a task's model turns spent, summed over the data of its events: each count the providers reported,
    `total_tokens` (input plus output, what the token budgets count), `turns` and how many of them reported."""
    totals = dict.fromkeys(
        ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens", "total_tokens", "turns", "reported"), 0
    )
    for data in datas:
        turn = data.get("turn")
        if not isinstance(turn, dict):
            continue
        totals["turns"] += 1
        usage = turn.get("usage")
        if not isinstance(usage, dict) or not usage:
            continue
        totals["reported"] += 1
        for key, value in usage.items():
            if key in totals and isinstance(value, int):
                totals[key] += value
        totals["total_tokens"] += turn_tokens(data)
    return totals
