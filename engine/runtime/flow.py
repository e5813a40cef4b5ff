"""Flow control around each model call: the shared circuit breaker, the shared quotas, the queue for quota.

The agent runner hands each call to `Flow.call`. Before the call: the breaker of its (provider, model) must let
it through, and its quota bucket must give it a request and its estimated tokens (taken in one statement;
`engine.store.protocol.FlowStore`). After: the breaker hears how it went, and the reservation is settled with the
tokens the provider reported (or, on a 429, every worker pauses for the provider's `retry-after`).

A call that may not go yet never waits in a worker: `FlowWait` says when to look again, and the worker puts the
task off until then, releasing its lease (`engine.runtime.worker`); no event is written, since nothing happened
to the task. `Engine.run` holds no lease and serves one caller: there the wait is a sleep.

The decisions (when a breaker opens, what a bucket holds, who is served first) are `engine.core.flow`'s; this
module is the I/O and the process's short memory of the breakers it read (`BREAKER_REFRESH`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Literal

from engine.core.canonical import now
from engine.core.flow import (
    Amounts,
    BreakerRow,
    FlowSettings,
    Limits,
    affordable,
    breaker_admits,
    counts_for_breaker,
    estimate,
    merged,
    quota_key,
    quota_wait,
    remaining,
    settlement,
    slot_seconds,
)
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelAdapter, ModelRequest, ModelResponse
from engine.core.profiles import flow_tables
from engine.core.webhooks import Outgoing
from engine.observability import hooks
from engine.providers.transport import QUOTA_HEADERS
from engine.runtime import config
from engine.runtime.leases import held
from engine.runtime.offload import Offload
from engine.store.protocol import FlowStore

log = logging.getLogger("railyard.flow")

#: How long a process trusts the breaker it last read before reading it again: a breaker another worker opened
#: stops this one's calls within this long, and a closed breaker costs one read a second, not one per call.
BREAKER_REFRESH = 1.0
#: Seconds beyond an adapter's timeout a call counts as in flight (a dead worker's slot frees after this).
HOLD_MARGIN = 30.0
#: The API key variables the SDKs read when an adapter was given none (for quotas kept per key).
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}

Reason = Literal["breaker", "quota"]

#: How long the model call just let through waited for flow control, in seconds (None: it went through none): the
#: breaker's cool-down and the queue for quota, from the task's first place in line (on an earlier claim, or
#: another worker's) to the call. Read for the call's trace span (`engine.runtime.agent`).
WAITED: ContextVar[float | None] = ContextVar("railyard_flow_waited", default=None)


class FlowWait(Exception):
    """A model call may not go yet: the breaker of its model is open, or its quota is short. `until` is when to
    look again; `position` the task's place in the queue for quota (0: next)."""

    def __init__(self, reason: Reason, key: str, until: datetime, position: int | None = None) -> None:
        super().__init__(f"{reason} of {key}: look again at {until.isoformat()}")
        self.reason: Reason = reason
        self.key = key
        self.until = until
        self.position = position


def flow_settings(given: Mapping[str, Any] | None = None) -> FlowSettings:
    """The flow settings this process runs with: the command line's (`given`, e.g. `railyard worker --quotas`)
    over the environment over the profiles file over the defaults."""
    return merged(flow_tables(), config.flow_settings(), given=given)


@dataclass
class _Ticket:
    """What admission gave one call, for what happens after it."""

    breaker_key: str
    probe: bool
    quota_key: str | None = None
    limits: Limits | None = None
    reserved: Amounts | None = None
    waited: float = 0.0


class Flow:
    """One process's flow control over a store's shared rows."""

    def __init__(
        self,
        store: FlowStore,
        settings: FlowSettings | None = None,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.settings = settings if settings is not None else flow_settings()
        self.sleep = sleep
        #: The webhook messages a breaker that opens brings (`engine.runtime.outbox.Outbox.for_breaker`), written
        #: in the transaction that opens it; None: none.
        self.breaker_messages: Callable[[BreakerRow], Sequence[Outgoing]] | None = None
        #: The breakers last read: key -> (row or None, the store's clock then, this process's monotonic then).
        self._breakers: dict[str, tuple[BreakerRow | None, float, float]] = {}
        #: The quota keys whose queue held others when last looked at: a call on them queues before it takes.
        self._queued: dict[str, bool] = {}

    # -- the call ---------------------------------------------------------
    async def call(
        self, adapter: ModelAdapter, request: ModelRequest, ask: Callable[[], Awaitable[ModelResponse]], io: Offload
    ) -> ModelResponse:
        """`ask()`, once the breaker and the quota let it through; then tell them how it went."""
        if adapter.provider == "scripted":  # no provider behind it: nothing to protect
            return await ask()
        ticket = await self._admit(adapter, request, io)
        WAITED.set(ticket.waited)
        # Under a quota, the answer's rate-limit headers are kept for it (`transport.keep_quota_headers`).
        headers: dict[str, str] = {}
        kept = QUOTA_HEADERS.set(headers) if ticket.quota_key is not None else None
        try:
            response = await ask()
        except ModelError as error:
            await self._failed(ticket, error, io)
            raise
        except BaseException:
            if ticket.quota_key is not None:  # cancelled or broken mid-call: give its place in flight back
                await self._settle(ticket, None, io)
            raise
        finally:
            if kept is not None:
                QUOTA_HEADERS.reset(kept)
        await self._answered(ticket, response, remaining(headers), io)
        return response

    async def _admit(self, adapter: ModelAdapter, request: ModelRequest, io: Offload) -> _Ticket:
        breaker_key = f"{adapter.provider}:{adapter.model}"
        started = time.monotonic()
        probe = await self._breaker_admits(breaker_key, io)
        ticket = _Ticket(breaker_key, probe)
        limits = self.settings.limits_for(adapter.provider, adapter.model)
        if limits is not None and not limits.empty:
            key = quota_key(adapter.provider, adapter.model, limits, _api_key(adapter))
            amounts = estimate(request)
            hold = float(getattr(adapter, "timeout", 60.0) or 60.0) + HOLD_MARGIN
            try:
                queued = await self._quota_admits(key, limits, amounts, hold, io, probe=probe)
            except BaseException:
                if probe:  # the probe never went: let another caller take it at once
                    self._breakers.pop(breaker_key, None)
                raise
            ticket.quota_key, ticket.limits, ticket.reserved = key, limits, amounts
        else:
            queued = 0.0
        ticket.waited = round(max(time.monotonic() - started, queued), 3)
        if hooks.active:
            hooks.flow_admitted(breaker_key, time.monotonic() - started, ticket.reserved)
        return ticket

    # -- the breaker ------------------------------------------------------
    async def _breaker_admits(self, key: str, io: Offload) -> bool:
        """Return once the breaker lets the call through (True: as its probe); raise `FlowWait` (or sleep, without
        a lease) while it is open."""
        settings = self.settings.breaker
        if settings.failures <= 0:
            return False
        fresh = False
        while True:
            row, at = await self._breaker(key, io)
            verdict, until = breaker_admits(row, at)
            if verdict == "go":
                return False
            if verdict == "probe":
                if await io.store(lambda: self.store.breaker_probe(key, settings.probe_seconds)):
                    self._breakers.pop(key, None)
                    log.info("breaker %s: cool-down over; this call is the probe", key)
                    return True
                self._breakers.pop(key, None)
                if not fresh:  # what this process saw is old: another caller's probe may have closed it already
                    fresh = True
                    continue
                until = at + 1.0  # another caller is probing: look again shortly
            self._breakers.pop(key, None)
            await self._wait("breaker", key, until - at)
            fresh = False

    async def _breaker(self, key: str, io: Offload) -> tuple[BreakerRow | None, float]:
        """The breaker as last read (within `BREAKER_REFRESH`), and the store's clock now as best known."""
        seen = self._breakers.get(key)
        if seen is not None and time.monotonic() - seen[2] < BREAKER_REFRESH:
            return seen[0], seen[1] + (time.monotonic() - seen[2])
        row = await io.store(lambda: self.store.breaker(key))
        at = row.at if row is not None else 0.0
        self._breakers[key] = (row, at, time.monotonic())
        return row, at

    # -- quotas -----------------------------------------------------------
    async def _quota_admits(
        self, key: str, limits: Limits, amounts: Amounts, hold: float, io: Offload, *, probe: bool = False
    ) -> float:
        """Return once the bucket gave the call its share: how long the task stood in line for it (0.0: it did
        not); raise `FlowWait` (or sleep, without a lease) while the quota is short. A worker's task queues for it
        by priority and group (`engine.core.flow.queue`). The breaker's probe does not queue when the bucket can
        pay: every other caller waits for its answer, so a probe sent to the back of the line would hold them all
        (and it gives the probe up, and the next looker's probe waits in line too)."""
        lease = held()
        task_id = lease.task_id if lease is not None else None
        slot = slot_seconds(limits, amounts)
        while True:
            queued = task_id is not None and self._queued.get(key, False) and not probe
            if not queued:
                taken, row = await io.store(lambda: self.store.quota_take(key, limits, amounts, hold))
                if taken:
                    return 0.0
                if task_id is None:
                    await self._wait("quota", key, quota_wait(row, limits, amounts, row.at))
                    continue
            assert task_id is not None
            # Those ahead who are coming for their turn now decide whether this call may take it; all those ahead
            # decide when it looks again, so that the line's order is the order of the looks. The store counts
            # them (`Store.wait_join`): a look reads one row however long the line.
            grace = max(5.0, 2 * slot)
            join = partial(
                self.store.wait_join,
                key,
                task_id,
                2 * slot,
                self.settings.priorities,
                lookahead=2 * slot + 1.0,
                grace=grace,
            )
            place, bucket = await io.store(join)
            at = bucket.at if bucket is not None else await io.store(self.store.flow_clock)
            self._queued[key] = place.others
            coming, ahead = place.coming, place.ahead
            free = affordable(bucket, limits, amounts, at)
            if coming < free:
                taken, bucket = await io.store(lambda: self.store.quota_take(key, limits, amounts, hold))
                if taken:
                    await io.store(lambda: self.store.wait_leave(key, task_id))
                    return max(at - place.since, 0.0)
                free = 0
            assert bucket is not None
            wait = max(quota_wait(bucket, limits, amounts, at), (ahead + 1 - free) * slot)
            await io.store(partial(self.store.wait_until, key, task_id, wait))
            await self._wait("quota", key, wait, ahead)

    async def _settle(self, ticket: _Ticket, response: ModelResponse | None, io: Offload) -> None:
        key, reserved = ticket.quota_key, ticket.reserved
        if key is None or reserved is None or ticket.limits is None:
            return
        din, dout = settlement(reserved, response.usage if response is not None else None)
        limits = ticket.limits
        din = din if limits.input_tokens_per_minute is not None else 0.0
        dout = dout if limits.output_tokens_per_minute is not None else 0.0
        await io.store(lambda: self.store.quota_settle(key, din, dout))
        if hooks.active and response is not None:
            hooks.flow_settled(ticket.breaker_key, reserved, response.usage)

    # -- after the call ---------------------------------------------------
    async def _failed(self, ticket: _Ticket, error: ModelError, io: Offload) -> None:
        await self._settle(ticket, None, io)
        key, limits = ticket.quota_key, ticket.limits
        if key is not None and limits is not None and error.retry_after is not None and error.retry_after > 0:
            seconds = error.retry_after
            await io.store(lambda: self.store.quota_pause(key, seconds))  # the provider said: every worker waits
        settings = self.settings.breaker
        if settings.failures > 0 and counts_for_breaker(error.code, error.status):
            on_open = self.breaker_messages
            row = await io.store(lambda: self.store.breaker_failed(ticket.breaker_key, settings, on_open))
            self._breakers[ticket.breaker_key] = (row, row.at, time.monotonic())
            if row.state == "open" and row.changed_at == row.at:
                log.warning(
                    "breaker %s opened after %s failures in a row (%s); calls wait %.0f s",
                    ticket.breaker_key,
                    row.failures,
                    error.code,
                    settings.cool_down_seconds,
                )
                if hooks.active:
                    hooks.breaker_changed(ticket.breaker_key, "open")
        elif ticket.probe:  # a probe answered by a failure the breaker does not count: the provider is up
            await self._closed(ticket, io)

    async def _answered(self, ticket: _Ticket, response: ModelResponse, left: dict[str, float], io: Offload) -> None:
        await self._settle(ticket, response, io)
        if left and ticket.quota_key is not None and ticket.limits is not None:
            key, limits = ticket.quota_key, ticket.limits
            await io.store(lambda: self.store.quota_adapt(key, limits, left))
        seen = self._breakers.get(ticket.breaker_key)
        if ticket.probe or (
            seen is not None and seen[0] is not None and (seen[0].failures or seen[0].state != "closed")
        ):
            await self._closed(ticket, io)

    async def _closed(self, ticket: _Ticket, io: Offload) -> None:
        await io.store(lambda: self.store.breaker_closed(ticket.breaker_key))
        self._breakers.pop(ticket.breaker_key, None)
        if ticket.probe:
            log.info("breaker %s closed: the probe was answered", ticket.breaker_key)
            if hooks.active:
                hooks.breaker_changed(ticket.breaker_key, "closed")

    async def _wait(self, reason: Reason, key: str, seconds: float, ahead: int | None = None) -> None:
        """Wait `seconds`: by putting the task off (a worker's, `FlowWait`), or asleep (`Engine.run`'s)."""
        seconds = max(seconds, 0.05)
        if hooks.active:
            hooks.flow_waited(key, reason, seconds)
        if held() is not None:
            raise FlowWait(reason, key, now() + timedelta(seconds=seconds), ahead)
        log.info("%s of %s: waiting %.2f s", reason, key, seconds)
        await self.sleep(seconds)


def _api_key(adapter: ModelAdapter) -> str | None:
    given = getattr(adapter, "_api_key", None)
    if isinstance(given, str) and given:
        return given
    variable = KEY_VARIABLES.get(adapter.provider)
    return os.environ.get(variable) if variable else None
