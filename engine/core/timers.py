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


def still_due(due: datetime | None, asked: datetime | None, at: datetime) -> datetime | None:
    """The due time a task keeps when an append asks for `asked` at `at`: a task already due since `due` and asked
    to be due now (not later) stays due since `due`.

    So the due time changes only when the task starts or stops being due, or is put off: a task that moves while
    it stays runnable changes no indexed column (migration 0018), and the claims' order, longest-due first, counts
    from when it first became due. The SQL stores write the same rule as a CASE in the append statement.
    """
    if due is not None and asked is not None and due <= asked <= at:
        return due
    return asked


def handed_back(due: datetime | None, at: datetime) -> datetime | None:
    """The due time of a task a worker gives back at `at`: one due since earlier is due from now, at the back of
    the line (it kept its first due time while it moved under the lease, `still_due`, and would otherwise be
    claimed before every task that became due meanwhile); one put off, or not due, keeps its time."""
    if due is not None and due < at:
        return at
    return due
