"""`FlowStore` on SQLite and PostgreSQL: the SQL store's flow-control verbs, each one or two named statements.

A mixin of `engine.store.sql.SqlStore` (which gives it its engine, its dialect's `FLOW` statements and its error
mapping), kept apart so that the 43 verbs of the log store and these stay readable on their own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

from sqlalchemy import Connection, Engine, insert, text

from engine.core.flow import (
    Amounts,
    BreakerRow,
    BreakerSettings,
    Limits,
    Place,
    QuotaRow,
    Waiter,
    new_bucket,
    quota_take,
    recent_serves,
    share_point,
    share_window,
)
from engine.core.webhooks import Outgoing
from engine.store.flow_sql import Statements
from engine.store.schema import webhook_outbox
from engine.store.sql_webhooks import outbox_rows

#: A waiter whose next look is this long past is dropped from the queue (its task ended or moved on).
STALE_SECONDS = 120.0
#: What a limit of "none" becomes in a statement: a bucket too deep to run dry, at no rate.
UNLIMITED = 1e18


def bucket_parameters(limits: Limits) -> dict[str, float]:
    """Each measure's capacity and rate per second (`cap_r`, `rate_r`, ... of `flow_sql`)."""
    values: dict[str, float] = {}
    for measure, per_minute in (
        ("r", limits.requests_per_minute),
        ("i", limits.input_tokens_per_minute),
        ("o", limits.output_tokens_per_minute),
    ):
        values[f"cap_{measure}"] = limits.capacity(per_minute) if per_minute is not None else UNLIMITED
        values[f"rate_{measure}"] = per_minute / 60.0 if per_minute is not None else 0.0
    return values


def limits_text(limits: Limits) -> str:
    """The limits as `railyard status` shows them (a bucket's row keeps the last ones applied)."""
    return json.dumps({k: v for k, v in asdict(limits).items() if v is not None}, sort_keys=True)


def affords(row: QuotaRow, limits: Limits, amounts: Amounts, hold_seconds: float) -> bool:
    """Whether the bucket as read (at the database's clock, `row.at`) would let the call through."""
    return quota_take(row, limits, amounts, row.at, hold_seconds) is not None


def quota_row(r: Any) -> QuotaRow:
    return QuotaRow(
        r[0],
        float(r[1]),
        float(r[2]),
        float(r[3]),
        int(r[4]),
        float(r[5]),
        float(r[6]),
        float(r[7]),
        float(r[8]),
        str(r[9]) if len(r) > 9 else "",
    )


def breaker_row(r: Any) -> BreakerRow:
    return BreakerRow(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), float(r[5]), float(r[6]))


def waiter(r: Any, at: float) -> Waiter:
    """A waiter row (`flow_sql.WAIT_SELECT`) with its group's recent serves as of the store's clock `at`."""
    served = recent_serves(int(r[6]), int(r[7]), int(r[8]), at) if r[6] is not None else 0.0
    return Waiter(r[0], r[1], int(r[2]), r[3], float(r[4]), float(r[5]), served)


class SqlFlow:
    """The flow-control verbs over the SQL store's engine."""

    # The SqlStore's: its engine, its dialect module, its transactions and its error mapping.
    engine: Engine
    sql: Any
    _writer: Callable[[], AbstractContextManager[Connection]]
    _reader: Callable[[], AbstractContextManager[Connection]]
    _errors: Callable[[], AbstractContextManager[None]]

    @property
    def _flow(self) -> Statements:
        flow: Statements = self.sql.FLOW
        return flow

    def flow_clock(self) -> float:
        with self._errors(), self._reader() as conn:
            return float(conn.execute(text(self._flow.NOW)).scalar_one())

    # -- breakers -------------------------------------------------------
    def breaker(self, key: str) -> BreakerRow | None:
        with self._errors(), self._reader() as conn:
            found = conn.execute(text(self._flow.BREAKER), {"key": key}).first()
        return breaker_row(found) if found is not None else None

    def breakers(self) -> list[BreakerRow]:
        with self._errors(), self._reader() as conn:
            return [breaker_row(r) for r in conn.execute(text(self._flow.ALL_BREAKERS))]

    def breaker_failed(
        self, key: str, settings: BreakerSettings, on_open: Callable[[BreakerRow], Sequence[Outgoing]] | None = None
    ) -> BreakerRow:
        params = {"key": key, "threshold": settings.failures, "cool": settings.cool_down_seconds}
        with self._errors(), self._writer() as conn:
            row = breaker_row(conn.execute(text(self._flow.BREAKER_FAILED), params).one())
            outbox = on_open(row) if on_open is not None and row.state == "open" and row.changed_at == row.at else []
            if outbox:
                conn.execute(insert(webhook_outbox), outbox_rows(outbox))
            return row

    def breaker_probe(self, key: str, probe_seconds: float) -> bool:
        with self._errors(), self._writer() as conn:
            return conn.execute(text(self._flow.BREAKER_PROBE), {"key": key, "probe": probe_seconds}).rowcount == 1

    def breaker_closed(self, key: str) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(text(self._flow.BREAKER_CLOSED), {"key": key})

    # -- quotas ---------------------------------------------------------
    def quota_take(self, key: str, limits: Limits, amounts: Amounts, hold_seconds: float) -> tuple[bool, QuotaRow]:
        amounts = amounts.within(limits)
        params: dict[str, Any] = {
            "key": key,
            **bucket_parameters(limits),
            "take_r": amounts.requests if limits.requests_per_minute is not None else 0.0,
            "take_i": amounts.input_tokens if limits.input_tokens_per_minute is not None else 0.0,
            "take_o": amounts.output_tokens if limits.output_tokens_per_minute is not None else 0.0,
            "concurrent": limits.concurrent_calls if limits.concurrent_calls is not None else 2**31 - 1,
            "hold": hold_seconds,
        }
        with self._errors(), self._writer() as conn:
            taken = conn.execute(text(self._flow.QUOTA_TAKE), params).first()
            if taken is not None:
                return True, quota_row(taken)
            found = conn.execute(text(self._flow.QUOTA_READ), {"key": key}).first()
            if found is not None and affords(quota_row(found), limits, amounts, hold_seconds):
                # The row was made by another worker's first call between our take and this read: the take found
                # no row, not an empty bucket. Take again rather than refuse a call the bucket can afford.
                taken = conn.execute(text(self._flow.QUOTA_TAKE), params).first()
                if taken is not None:
                    return True, quota_row(taken)
                found = conn.execute(text(self._flow.QUOTA_READ), {"key": key}).one()
            if found is None:  # the first call on this key anywhere: a full bucket, then the take
                full = new_bucket(key, limits, 0.0)
                conn.execute(
                    text(self._flow.QUOTA_ENSURE),
                    {
                        "key": key,
                        "requests": full.requests,
                        "input_tokens": full.input_tokens,
                        "output_tokens": full.output_tokens,
                        "limits": limits_text(limits),
                    },
                )
                taken = conn.execute(text(self._flow.QUOTA_TAKE), params).first()
                if taken is not None:
                    return True, quota_row(taken)
                found = conn.execute(text(self._flow.QUOTA_READ), {"key": key}).one()
            return False, quota_row(found)

    def quota_settle(self, key: str, input_tokens: float, output_tokens: float, *, release: bool = True) -> None:
        params = {"key": key, "input_tokens": input_tokens, "output_tokens": output_tokens, "release": int(release)}
        with self._errors(), self._writer() as conn:
            conn.execute(text(self._flow.QUOTA_SETTLE), params)

    def quota_pause(self, key: str, seconds: float) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(text(self._flow.QUOTA_PAUSE), {"key": key, "seconds": seconds})

    def quota_adapt(self, key: str, limits: Limits, left: Mapping[str, float]) -> None:
        params: dict[str, Any] = {
            "key": key,
            **bucket_parameters(limits),
            "left_r": left.get("requests", UNLIMITED) if limits.requests_per_minute is not None else UNLIMITED,
            "left_i": left.get("input_tokens", UNLIMITED) if limits.input_tokens_per_minute is not None else UNLIMITED,
            "left_o": (
                left.get("output_tokens", UNLIMITED) if limits.output_tokens_per_minute is not None else UNLIMITED
            ),
        }
        with self._errors(), self._writer() as conn:
            conn.execute(text(self._flow.QUOTA_ADAPT), params)

    # -- the queue ------------------------------------------------------
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
        flow = self._flow
        with self._errors(), self._writer() as conn:
            found = conn.execute(text(flow.TASK_PRIORITY), {"task_id": task_id}).first()
            own, tenant, workflow = found if found is not None else (None, None, "")
            priority = own if own is not None else priorities.get(workflow, 0)
            group = f"tenant:{tenant}" if tenant is not None else f"workflow:{workflow}"
            conn.execute(
                text(flow.WAIT_JOIN),
                {"key": key, "task_id": task_id, "priority": priority, "grp": group, "wait": wait},
            )
            conn.execute(text(flow.WAIT_PURGE), {"key": key, "stale": STALE_SECONDS})
            bucket = conn.execute(text(flow.QUOTA_READ), {"key": key}).first()
            at = float(bucket[-1]) if bucket is not None else float(conn.execute(text(flow.NOW)).scalar_one())
            win, still = share_point(at)
            params = {
                "key": key,
                "task_id": task_id,
                "win": win,
                "still": still,
                "at": at,
                "grace": grace,
                "lookahead": min(lookahead, UNLIMITED),
            }
            coming, ahead, count, since = conn.execute(text(flow.WAIT_PLACE), params).one()
        place = Place(int(coming), int(ahead), int(count) > 1, float(since) if since is not None else at)
        return place, quota_row(bucket) if bucket is not None else None

    def wait_until(self, key: str, task_id: str, wait: float) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(text(self._flow.WAIT_UNTIL), {"key": key, "task_id": task_id, "wait": wait})

    def wait_leave(self, key: str, task_id: str) -> None:
        flow = self._flow
        with self._errors(), self._writer() as conn:
            group = conn.execute(text(flow.WAIT_LEAVE), {"key": key, "task_id": task_id}).scalar()
            if group is not None:
                win = share_window(float(conn.execute(text(flow.NOW)).scalar_one()))
                conn.execute(text(flow.SHARE_CHARGE), {"key": key, "grp": group, "win": win})

    def waits_of(self, task_id: str) -> tuple[list[Waiter], float]:
        flow = self._flow
        with self._errors(), self._reader() as conn:
            at = float(conn.execute(text(flow.NOW)).scalar_one())
            waiters = [waiter(r, at) for r in conn.execute(text(flow.WAITS_OF), {"task_id": task_id})]
        return waiters, at

    def flow_rows(self) -> tuple[list[BreakerRow], list[QuotaRow], list[Waiter]]:
        flow = self._flow
        with self._errors(), self._reader() as conn:
            breakers = [breaker_row(r) for r in conn.execute(text(flow.ALL_BREAKERS))]
            quotas = [quota_row(r) for r in conn.execute(text(flow.ALL_QUOTAS))]
            at = float(conn.execute(text(flow.NOW)).scalar_one())
            waits = [waiter(r, at) for r in conn.execute(text(flow.ALL_WAITS))]
        return breakers, quotas, waits


def finite(value: float) -> float | None:
    """A level for people: None where the measure has no limit."""
    return value if math.isfinite(value) and value < UNLIMITED / 2 else None
