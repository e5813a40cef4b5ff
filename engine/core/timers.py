"""When a worker should next look at a task: a pure function of the state it just entered."""

from __future__ import annotations

from datetime import datetime

from engine.core.definition import Approval, Child, Wait, Workflow
from engine.core.task import Status


def next_run_at(definition: Workflow, state: str, entered_at: datetime, due: datetime | None = None) -> datetime | None:
    """Runnable now, or at `due` when a backoff put the next call off (`engine.core.retries`); a child state now;
    blocked until its deadline (if it has one); otherwise never (a human or signal moves it)."""
    if definition.status_of(state) is Status.RUNNABLE:
        return due if due is not None and due > entered_at else entered_at
    spec = definition.state(state)
    if isinstance(spec, Child):
        # Due at once after each of its events: the worker that holds it starts the child, or finds it, or records
        # its end, and only then puts the next look off (`engine.runtime.children`). A worker that dies before
        # leaves it due, so another one takes it up when the lease runs out.
        return entered_at
    if isinstance(spec, Approval | Wait) and spec.deadline is not None:
        return entered_at + spec.deadline
    return None
