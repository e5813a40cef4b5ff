"""Failures on demand: a test or the demo arms one, the next call of that operation suffers it.

Faults are rows in the shared database, so a fault armed by a test reaches a
worker running in another process. Each names where in the call it strikes:

- before the remote acts: `timeout` (no answer until past the caller's timeout),
  `unavailable` (connection refused), `remote_error` (a clear refusal: nothing
  happened), `crash_before` (the calling process dies: SIGKILL);
- after the remote acted: `lost_reply` (the answer never arrives), `crash_after`
  (the calling process dies before it can record the answer);
- held: `hold_before` and `hold_after` keep the call waiting, before or after the
  remote acts, until a test calls `release` (or most of the caller's timeout has
  passed), so a test can act while the call is in flight; `held` says when one is.

The crash faults kill the process that calls the fake, so arm them only for a
worker running in a process of its own.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Literal

from sqlalchemy import insert, select, update

from workflows.fakes.backend import Backend
from workflows.fakes.errors import Declined
from workflows.fakes.schema import faults

Fault = Literal[
    "timeout", "unavailable", "remote_error", "lost_reply", "crash_before", "crash_after", "hold_before", "hold_after"
]
FAULTS: tuple[Fault, ...] = (
    "timeout",
    "unavailable",
    "remote_error",
    "lost_reply",
    "crash_before",
    "crash_after",
    "hold_before",
    "hold_after",
)
#: A held call lets go by itself after this share of the caller's timeout, so it still answers in time.
HOLD_SHARE = 0.9
#: Marker rows (never taken as faults: nothing remains of them): a call is held; a test released it.
_HELD, _RELEASED = "held", "released"
#: The operations a fault can be armed on.
OPERATIONS = ("orders.get", "payments.refund", "payments.lookup", "tickets.get")
#: How far past the caller's timeout a `timeout` fault keeps it waiting.
OVERRUN_SECONDS = 0.5


def arm(backend: Backend, operation: str, fault: Fault, times: int = 1) -> None:
    """The next `times` calls of `operation` suffer `fault` (after any fault already armed on it)."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; one of {OPERATIONS}")
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
    if times < 1:
        raise ValueError("times must be >= 1")
    with backend.write() as conn:
        conn.execute(insert(faults).values(operation=operation, fault=fault, remaining=times))


def take(backend: Backend, operation: str) -> Fault | None:
    """Consume one armed fault of `operation`, oldest first; None when nothing is armed."""
    with backend.write() as conn:
        row = conn.execute(
            select(faults.c.id, faults.c.fault)
            .where(faults.c.operation == operation, faults.c.remaining > 0)
            .order_by(faults.c.id)
            .limit(1)
            .with_for_update()
        ).first()
        if row is None:
            return None
        conn.execute(update(faults).where(faults.c.id == row.id).values(remaining=faults.c.remaining - 1))
        return row.fault  # type: ignore[no-any-return]


def strike_before(fault: Fault | None, timeout: float) -> None:
    """Act out a fault that strikes before the remote does anything."""
    if fault == "timeout":
        time.sleep(timeout + OVERRUN_SECONDS)
        raise TimeoutError("the remote did not answer")
    if fault == "unavailable":
        raise ConnectionRefusedError("the remote refused the connection")
    if fault == "remote_error":
        raise Declined("remote_error", "the remote answered 503: try again later")
    if fault == "crash_before":
        os.kill(os.getpid(), signal.SIGKILL)


def strike_after(fault: Fault | None) -> None:
    """Act out a fault that strikes after the remote acted: the caller never learns that it did."""
    if fault == "lost_reply":
        raise ConnectionResetError("the connection was reset before the reply arrived")
    if fault == "crash_after":
        os.kill(os.getpid(), signal.SIGKILL)


def hold(backend: Backend, operation: str, timeout: float) -> None:
    """Wait, saying so, until a test releases `operation` or most of `timeout` is gone."""
    with backend.write() as conn:
        conn.execute(insert(faults).values(operation=operation, fault=_HELD, remaining=0))
    until = time.monotonic() + timeout * HOLD_SHARE
    while time.monotonic() < until:
        with backend.read() as conn:
            found = conn.execute(
                select(faults.c.id).where(faults.c.operation == operation, faults.c.fault == _RELEASED)
            ).first()
        if found is not None:
            return
        time.sleep(0.01)


def held(backend: Backend, operation: str) -> bool:
    """Whether a call of `operation` is being held now (or was, and has not been released)."""
    with backend.read() as conn:
        return (
            conn.execute(select(faults.c.id).where(faults.c.operation == operation, faults.c.fault == _HELD)).first()
            is not None
        )


def release(backend: Backend, operation: str) -> None:
    """Let the held call of `operation` go on."""
    with backend.write() as conn:
        conn.execute(insert(faults).values(operation=operation, fault=_RELEASED, remaining=0))
