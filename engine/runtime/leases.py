"""The lease a worker holds on a task, carried to every append it makes as a fencing token.

A context variable, so the runners (agent turns, tool calls) need not pass it
along: each worker thread sets it around the task it holds, and
`Engine.commit` sends its epoch with the append. An append under a lease that
was taken over is refused (`LEASE_LOST`) even when its `expected_seq` matches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Lease:
    task_id: str
    owner: str
    epoch: int
    #: How long an append under this lease keeps trying while the database does not answer (the lease's length):
    #: a model's answer is kept and written once the database is back, rather than paid for again.
    patience: float = 0.0


_current: ContextVar[Lease | None] = ContextVar("railyard_lease", default=None)


def current_epoch(task_id: str) -> int | None:
    """The epoch to fence an append on `task_id` with, if this thread holds its lease."""
    lease = _current.get()
    return lease.epoch if lease is not None and lease.task_id == task_id else None


def current_patience(task_id: str) -> float:
    """How long an append on `task_id` may keep trying through a database that does not answer (0: not at all)."""
    lease = _current.get()
    return lease.patience if lease is not None and lease.task_id == task_id else 0.0


@contextmanager
def holding(lease: Lease) -> Iterator[Lease]:
    token = _current.set(lease)
    try:
        yield lease
    finally:
        _current.reset(token)


def held() -> Lease | None:
    """The lease this context holds, if any: a worker's step has one, `Engine.run`'s has none."""
    return _current.get()
