"""The webhook sender: leases due outbox messages, signs them (Standard Webhooks) and POSTs them, at least once.

A worker runs one `Sender` on a thread of its own (`Worker._serving`). Each round it leases the messages that
are due (`Store.lease_deliveries`, like a task claim: a message leased by a worker that died is taken over once
the lease expires), sends them a few at a time, and records the answer: a 2xx is delivered; anything else is put
off with exponential backoff and jitter (`engine.core.webhooks.next_try`) until the delivery window
(`RAILYARD_WEBHOOK_GIVE_UP_SECONDS`, a day by default) is spent, then marked failed for
`railyard webhooks replay`. A message keeps its id and body on every attempt, so a receiver that got it twice
(the sender died between the send and the record) sees the same `webhook-id` and drops the second.

Every `sweep_seconds` it also writes the `deadline.near` messages of tasks whose deadline came near; their ids
are derived from (subscription, task, deadline, window), so a sweep run again, or by two workers, writes none
twice.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.core.canonical import now
from engine.core.errors import RailyardError
from engine.core.webhooks import Backoff, Delivery, Subscription, deadline_messages, headers, next_try, signing
from engine.store.protocol import Store

log = logging.getLogger("railyard.webhooks")

#: How many messages one round leases, and how many are sent at once.
BATCH = 32
PARALLEL = 4
#: How much of a receiver's answer is kept as the delivery's last error.
ERROR_TEXT = 300


@dataclass(frozen=True, slots=True)
class SenderSettings:
    """The RAILYARD_WEBHOOK_* settings a sender uses (`engine.runtime.config.webhook_settings`)."""

    backoff: Backoff
    timeout_seconds: float = 10.0
    lease_seconds: float = 30.0
    poll_seconds: float = 1.0
    sweep_seconds: float = 60.0

    @classmethod
    def of(cls, values: dict[str, float]) -> SenderSettings:
        return cls(
            Backoff(values["base_seconds"], values["max_seconds"], values["give_up_seconds"]),
            values["timeout_seconds"],
            values["lease_seconds"],
            values["poll_seconds"],
            values["sweep_seconds"],
        )


#: What sends one request: (url, body, headers, timeout) -> the HTTP status. Tests may give another.
Post = Callable[[str, bytes, dict[str, str], float], int]


def post(url: str, body: bytes, sent: dict[str, str], timeout: float) -> int:
    """POST `body`; the status of the answer (an HTTP error's status too). A network failure raises OSError."""
    request = urllib.request.Request(url, data=body, headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


class Sender:
    """Sends the outbox: one per worker, on its own thread (`run`)."""

    def __init__(
        self,
        store: Store,
        owner: str,
        settings: SenderSettings,
        deadlines: Callable[[datetime], list[tuple[str, str, str, datetime]]] | None = None,
        send: Post = post,
    ) -> None:
        self.store = store
        self.owner = owner
        self.settings = settings
        #: The blocked tasks with a deadline before an instant: (task id, workflow, state, deadline).
        self.deadlines = deadlines
        self.send = send
        self._random = random.Random()

    def run(self, done: threading.Event) -> None:
        """Send until `done` is set; a database error waits a poll and tries again (nothing is lost: the outbox
        is the database's)."""
        swept = -float("inf")
        with ThreadPoolExecutor(PARALLEL, thread_name_prefix=f"{self.owner}-webhook") as pool:
            while not done.is_set():
                try:
                    if self.deadlines is not None and time.monotonic() - swept >= self.settings.sweep_seconds:
                        swept = time.monotonic()
                        self.sweep(now())
                    sent = self.round(pool)
                except RailyardError as error:
                    log.warning("webhooks: %s: %s", error.code, error.message)
                    sent = 0
                except Exception:  # a bug must not stop the worker's other threads
                    log.exception("webhooks: the sender's round failed")
                    sent = 0
                if not sent and done.wait(self.settings.poll_seconds):
                    return

    def sweep(self, at: datetime) -> int:
        """Write the `deadline.near` messages now due; how many were new."""
        subscriptions = self.store.webhooks()
        hours = [i.hours for s in subscriptions for i in s.interests if i.hours]
        if not hours or self.deadlines is None:
            return 0
        tasks = self.deadlines(at + timedelta(hours=max(hours)))
        return self.store.enqueue_webhooks(deadline_messages(subscriptions, [t for t in tasks if t[3] > at], at))

    def round(self, pool: ThreadPoolExecutor | None = None) -> int:
        """Lease the due messages and send them; how many were leased."""
        at = now()
        leased = self.store.lease_deliveries(self.owner, limit=BATCH, lease_seconds=self.settings.lease_seconds, at=at)
        if not leased:
            return 0
        by_id = {s.id: s for s in self.store.webhooks()}
        if pool is None:
            for d in leased:
                self.deliver(d, by_id.get(d.message.subscription_id))
        else:
            list(pool.map(lambda d: self.deliver(d, by_id.get(d.message.subscription_id)), leased))
        return len(leased)

    def deliver(self, delivery: Delivery, sub: Subscription | None) -> bool:
        """One attempt at one message; records the outcome. Whether the receiver took it."""
        m = delivery.message
        if sub is None:
            self.store.delivery_retry(m.id, self.owner, None, "the subscription was removed")
            return False
        at = now()
        timestamp = int(at.timestamp())
        sent = headers(signing(sub.secrets, at), m.id, timestamp, m.body)
        try:
            status = self.send(sub.url, m.body.encode(), sent, self.settings.timeout_seconds)
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except (OSError, ValueError) as exc:  # refused, reset, timed out, a name that does not resolve
            error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT]
        if error is None:
            self.store.delivery_done(m.id, self.owner, now())
            log.info("webhook %s delivered to %s (attempt %s)", m.id, sub.id, delivery.attempts)
            return True
        then = next_try(self.settings.backoff, delivery.attempts, delivery.since, now(), self._random.random())
        self.store.delivery_retry(m.id, self.owner, then, error)
        if then is None:
            log.warning("webhook %s to %s gave up after %s attempts: %s", m.id, sub.id, delivery.attempts, error)
        else:
            log.info("webhook %s to %s: %s; next attempt at %s", m.id, sub.id, error, then.isoformat())
        return False


Deadlines = Callable[[datetime], list[tuple[str, str, str, datetime]]]


def deadlines_of(store: Store, states: Sequence[tuple[str, int, str]]) -> Deadlines:
    """The blocked tasks in `states` whose deadline (`next_run_at`) is before an instant, nearest first."""

    def find(before: datetime) -> list[tuple[str, str, str, datetime]]:
        out: list[tuple[str, str, str, datetime]] = []
        after: str | None = None
        while True:
            ids = store.blocked_in(states, after=after, limit=200, by_deadline=True)
            for task_id in ids:
                row = store.row(task_id)
                if row is None or row.status != "blocked" or row.next_run_at is None:
                    continue
                if row.next_run_at >= before:
                    return out
                out.append((row.task_id, row.workflow, row.state, row.next_run_at))
            if len(ids) < 200:
                return out
            after = ids[-1]

    return find
