"""When a worker should next look at a task: a pure function of the state it just entered."""

from __future__ import annotations

from datetime import datetime

from engine.core.definition import Approval, Status, Wait, Workflow


def next_run_at(definition: Workflow, state: str, entered_at: datetime) -> datetime | None:
    """Runnable now; blocked until its deadline (if it has one); otherwise never (a human or signal moves it)."""
    if definition.status_of(state) is Status.RUNNABLE:
        return entered_at
    spec = definition.state(state)
    if isinstance(spec, Approval | Wait) and spec.deadline is not None:
        return entered_at + spec.deadline
    return None
