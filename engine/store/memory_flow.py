"""`FlowStore` in the process's memory: the same decisions as the SQL statements (`engine.core.flow`), under a
lock, on the wall clock. For `memory://` and unit tests: one process only, so nothing is shared beyond it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.core.flow import (
    Amounts,
    BreakerRow,
    BreakerSettings,
    Limits,
    Place,
    QuotaRow,
    Waiter,
    adapted,
    breaker_failed,
    breaker_succeeded,
    new_bucket,
    place_in,
    quota_take,
    recent_serves,
    refilled,
    share_window,
)
from engine.core.webhooks import Outgoing

#: As `engine.store.sql_flow.STALE_SECONDS`.
STALE_SECONDS = 120.0


class MemoryFlow:
    """The flow rows of a `MemoryStore`."""

    _tasks: dict[str, Any]

    def __init__(self) -> None:
        self._flow_lock = threading.Lock()
        self._breakers: dict[str, BreakerRow] = {}
        self._buckets: dict[str, QuotaRow] = {}
        self._waits: dict[tuple[str, str], Waiter] = {}
        #: (key, group) -> (window, served in it, served in the one before): `flow_shares`.
        self._shares: dict[tuple[str, str], tuple[int, int, int]] = {}
        #: Seconds added to the wall clock: a test moves time forward without waiting for it.
        self.clock_offset = 0.0

    def flow_clock(self) -> float:
        return time.time() + self.clock_offset

    def breaker(self, key: str) -> BreakerRow | None:
        with self._flow_lock:
            found = self._breakers.get(key)
            return replace(found, at=self.flow_clock()) if found is not None else None

    def breakers(self) -> list[BreakerRow]:
        with self._flow_lock:
            at = self.flow_clock()
            return [replace(self._breakers[k], at=at) for k in sorted(self._breakers)]

    def breaker_failed(
        self, key: str, settings: BreakerSettings, on_open: Callable[[BreakerRow], Sequence[Outgoing]] | None = None
    ) -> BreakerRow:
        with self._flow_lock:
            at = self.flow_clock()
            row = self._breakers[key] = breaker_failed(self._breakers.get(key), key, at, settings)
            seen = replace(row, at=at)
            if on_open is not None and seen.state == "open" and seen.changed_at == at:
                self._on_breaker_open(on_open(seen))
            return seen

    def _on_breaker_open(self, messages: Sequence[Outgoing]) -> None:
        """Write a breaker's webhook messages (the memory store's outbox, `MemoryWebhooks.enqueue_webhooks`)."""
        enqueue = getattr(self, "enqueue_webhooks", None)
        if enqueue is not None and messages:
            enqueue(messages)

    def breaker_probe(self, key: str, probe_seconds: float) -> bool:
        with self._flow_lock:
            at, row = self.flow_clock(), self._breakers.get(key)
            if row is None:
                return False
            due = (row.state == "open" and row.open_until <= at) or (row.state == "half_open" and row.probe_until <= at)
            if due:
                self._breakers[key] = replace(row, state="half_open", probe_until=at + probe_seconds, changed_at=at)
            return due

    def breaker_closed(self, key: str) -> None:
        with self._flow_lock:
            if (row := self._breakers.get(key)) is not None:
                self._breakers[key] = breaker_succeeded(row, key, self.flow_clock())

    def quota_take(self, key: str, limits: Limits, amounts: Amounts, hold_seconds: float) -> tuple[bool, QuotaRow]:
        with self._flow_lock:
            at = self.flow_clock()
            row = self._buckets.get(key) or new_bucket(key, limits, at)
            taken = quota_take(row, limits, amounts.within(limits), at, hold_seconds)
            if taken is None:
                self._buckets[key] = row
                return False, replace(row, at=at)
            self._buckets[key] = taken
            return True, replace(taken, at=at)

    def quota_settle(self, key: str, input_tokens: float, output_tokens: float, *, release: bool = True) -> None:
        with self._flow_lock:
            if (row := self._buckets.get(key)) is not None:
                self._buckets[key] = replace(
                    row,
                    input_tokens=row.input_tokens - input_tokens,
                    output_tokens=row.output_tokens - output_tokens,
                    in_flight=max(row.in_flight - 1, 0) if release else row.in_flight,
                )

    def quota_pause(self, key: str, seconds: float) -> None:
        with self._flow_lock:
            if (row := self._buckets.get(key)) is not None:
                self._buckets[key] = replace(row, paused_until=max(row.paused_until, self.flow_clock() + seconds))

    def quota_adapt(self, key: str, limits: Limits, left: Mapping[str, float]) -> None:
        with self._flow_lock:
            if (row := self._buckets.get(key)) is None:
                return
            at = self.flow_clock()
            elapsed = at - row.refilled_at
            now_row = replace(
                row,
                requests=_level(row.requests, limits.requests_per_minute, limits, elapsed),
                input_tokens=_level(row.input_tokens, limits.input_tokens_per_minute, limits, elapsed),
                output_tokens=_level(row.output_tokens, limits.output_tokens_per_minute, limits, elapsed),
                refilled_at=max(row.refilled_at, at),
            )
            self._buckets[key] = adapted(now_row, _limited(left, limits))

    def wait_join(
        self,
        key: str,
        task_id: str,
        wait: float,
        priorities: Mapping[str, int],
        *,
        lookahead: float,
        grace: float,
    ) -> tuple[Place, QuotaRow | None]:
        with self._flow_lock:
            at = self.flow_clock()
            task = self._tasks.get(task_id)
            own = task.priority if task is not None else None
            workflow = task.workflow if task is not None else ""
            priority = own if own is not None else priorities.get(workflow, 0)
            tenant = task.tenant if task is not None else None
            group = f"tenant:{tenant}" if tenant is not None else f"workflow:{workflow}"
            was = self._waits.get((key, task_id))
            since = was.since if was is not None else at
            self._waits[(key, task_id)] = Waiter(key, task_id, priority, group, since, at + wait)
            for k, w in list(self._waits.items()):
                if w.key == key and w.until < at - STALE_SECONDS:
                    del self._waits[k]
            bucket = self._buckets.get(key)
            waiters = [self._served(w, at) for w in self._waits.values() if w.key == key]
            place = place_in(waiters, task_id, at, lookahead, grace)
            return place, replace(bucket, at=at) if bucket else None

    def _served(self, w: Waiter, at: float) -> Waiter:
        share = self._shares.get((w.key, w.group))
        return replace(w, served=recent_serves(*share, at)) if share is not None else w

    def wait_until(self, key: str, task_id: str, wait: float) -> None:
        with self._flow_lock:
            if (w := self._waits.get((key, task_id))) is not None:
                self._waits[(key, task_id)] = replace(w, until=self.flow_clock() + wait)

    def wait_leave(self, key: str, task_id: str) -> None:
        with self._flow_lock:
            if (left := self._waits.pop((key, task_id), None)) is None:
                return
            win = share_window(self.flow_clock())
            was, served, before = self._shares.get((key, left.group), (win, 0, 0))
            if was >= win:
                self._shares[(key, left.group)] = (was, served + 1, before)
            else:
                self._shares[(key, left.group)] = (win, 1, served if was == win - 1 else 0)

    def waits_of(self, task_id: str) -> tuple[list[Waiter], float]:
        with self._flow_lock:
            at = self.flow_clock()
            keys = {w.key for w in self._waits.values() if w.task_id == task_id}
            return [self._served(w, at) for w in self._waits.values() if w.key in keys], at

    def flow_rows(self) -> tuple[list[BreakerRow], list[QuotaRow], list[Waiter]]:
        with self._flow_lock:
            at = self.flow_clock()
            breakers = [replace(self._breakers[k], at=at) for k in sorted(self._breakers)]
            buckets = [replace(self._buckets[k], at=at) for k in sorted(self._buckets)]
            waits = sorted((self._served(w, at) for w in self._waits.values()), key=lambda w: (w.key, w.since))
            return breakers, buckets, waits


def _level(level: float, per_minute: float | None, limits: Limits, elapsed: float) -> float:
    return refilled(level, per_minute, limits.capacity(per_minute), elapsed) if per_minute is not None else level


def _limited(left: Mapping[str, float], limits: Limits) -> dict[str, float]:
    """Only the measures that have a limit here: a measure without one keeps no level to hold down."""
    rates = {
        "requests": limits.requests_per_minute,
        "input_tokens": limits.input_tokens_per_minute,
        "output_tokens": limits.output_tokens_per_minute,
    }
    return {k: v for k, v in left.items() if rates.get(k) is not None}
