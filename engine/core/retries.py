"""Durable retries of a failing provider: when the next call is due, and when the state's budget says stop.

A runner first retries a transient failure in its own process, for waits of a
few seconds (`RetryPolicy` in the agent runner). When those run out, or the
provider asks for a longer wait than a process should sleep through, the
retry becomes a `backoff` event: a self-loop on the agent state that records
the code, the provider's words and `retry.due_at`. The task's row is put off
until then, its lease is given back, and whichever worker claims it when it is
due makes the next call. A crash in between loses nothing: the timer is in the
log, not in a process.

These functions decide it from the visit the log folds (`engine.core.visit`):
how many backoffs it holds, since when, and until when it waits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from engine.core.canonical import format_instant, parse_instant
from engine.core.definition import RetryBudget
from engine.core.payloads import RetryRecord

#: The first durable wait is drawn from [BASE/2, BASE] seconds, the next from [BASE, 2 BASE], and so on, up to CAP.
BASE_SECONDS = 2.0
CAP_SECONDS = 300.0


def durable_delay(
    n: int,
    retry_after: float | None,
    *,
    base: float = BASE_SECONDS,
    cap: float = CAP_SECONDS,
    draw: Callable[[], float] = random.random,
) -> float:
    """Seconds before the `n`th durable retry (from 1): exponential with "equal jitter" (half fixed, half drawn),
    so waits grow and workers that failed together do not call together again; never sooner than the
    provider's `retry_after`."""
    ceiling = min(cap, base * 2.0 ** max(n - 1, 0))
    return float(max(ceiling / 2 + draw() * ceiling / 2, retry_after or 0.0))


def next_retry(budget: RetryBudget, visit: dict[str, Any], at: datetime, delay: float) -> RetryRecord | None:
    """The `retry` record of the next backoff from `at`, or None when the state's budget is spent: the visit
    already holds `budget.count` backoffs, or the next call would be due later than `budget.within` after
    the visit's first one."""
    n = int(visit.get("retries", 0)) + 1
    if n > budget.count:
        return None
    since = parse_instant(visit["retrying_since"]) if "retrying_since" in visit else at
    due = at + timedelta(seconds=delay)
    if due - since > budget.within:
        return None
    return {
        "n": n,
        "due_at": format_instant(due),
        "since": format_instant(since),
        "budget": budget.spec(),
    }


def due_at(visit: dict[str, Any]) -> datetime | None:
    """When the visit's pending backoff lets the next call be made (None: nothing pending)."""
    due = visit.get("due_at")
    return parse_instant(due) if isinstance(due, str) else None


def waiting(visit: dict[str, Any], at: datetime) -> float:
    """Seconds still to wait at `at` before the next call (0: it may be made now)."""
    due = due_at(visit)
    return max((due - at).total_seconds(), 0.0) if due is not None else 0.0
