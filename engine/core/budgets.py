"""Task budgets: a pure check of the counters the fold keeps against the workflow's limits."""

from __future__ import annotations

from datetime import datetime

from engine.core.canonical import parse_instant
from engine.core.definition import Workflow
from engine.core.fold import TaskState, call_key
from engine.core.payloads import EventData, PreparedCallData


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
        return None
    if int(usage.get("calls", 0)) >= budgets.tool_calls:
        return {"budget": "tool_calls", "used": usage.get("calls", 0), "limit": budgets.tool_calls}
    if int(usage.get("repeats", {}).get(call_key(next_call), 0)) >= budgets.repeats:
        return {"budget": "repeats", "tool": next_call["tool"], "limit": budgets.repeats}
    return None
