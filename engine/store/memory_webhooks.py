"""The webhook verbs of the memory store, with the semantics of `engine.store.sql_webhooks`.

A mixin of `engine.store.memory.MemoryStore`: it shares the store's lock, so the messages an `append` brings are
written under the same lock as its events (all or nothing, like the SQL store's transaction).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from engine.core.canonical import utc
from engine.core.webhooks import DELIVERED, FAILED, PENDING, Delivery, Outgoing, Secret, Subscription


class MemoryWebhooks:
    """Subscriptions and the outbox in memory."""

    _lock: threading.Lock

    def __init__(self) -> None:
        self._subscriptions: dict[str, Subscription] = {}
        self._outbox: dict[str, Delivery] = {}

    def _enqueue_locked(self, messages: Sequence[Outgoing]) -> int:
        """Under the store's lock: write the messages not written yet."""
        n = 0
        for m in messages:
            if m.id not in self._outbox:
                at = utc(m.created_at)
                self._outbox[m.id] = Delivery(replace(m, created_at=at), PENDING, 0, at, at)
                n += 1
        return n

    def add_webhook(self, sub: Subscription) -> None:
        with self._lock:
            self._subscriptions[sub.id] = sub

    def webhooks(self) -> list[Subscription]:
        with self._lock:
            return sorted(self._subscriptions.values(), key=lambda s: s.created_at)

    def remove_webhook(self, subscription_id: str) -> bool:
        with self._lock:
            gone = self._subscriptions.pop(subscription_id, None)
            for key, d in self._outbox.items():
                if d.message.subscription_id == subscription_id and d.status == PENDING:
                    self._outbox[key] = replace(
                        d, status=FAILED, last_error="the subscription was removed", lease_owner=None
                    )
            return gone is not None

    def set_webhook_secrets(self, subscription_id: str, secrets: Sequence[Secret]) -> bool:
        with self._lock:
            sub = self._subscriptions.get(subscription_id)
            if sub is None:
                return False
            self._subscriptions[subscription_id] = replace(sub, secrets=tuple(secrets))
            return True

    def enqueue_webhooks(self, messages: Sequence[Outgoing]) -> int:
        with self._lock:
            return self._enqueue_locked(messages)

    def lease_deliveries(self, owner: str, *, limit: int, lease_seconds: float, at: datetime) -> list[Delivery]:
        with self._lock:
            due = sorted(
                (
                    d
                    for d in self._outbox.values()
                    if d.status == PENDING
                    and d.next_attempt_at is not None
                    and d.next_attempt_at <= at
                    and (d.lease_expires_at is None or d.lease_expires_at < at)
                ),
                key=lambda d: (d.next_attempt_at or at, d.message.id),
            )[:limit]
            until = at + timedelta(seconds=lease_seconds)
            leased = [replace(d, lease_owner=owner, lease_expires_at=until, attempts=d.attempts + 1) for d in due]
            for d in leased:
                self._outbox[d.message.id] = d
            return leased

    def _settle(self, message_id: str, owner: str, **values: object) -> bool:
        with self._lock:
            d = self._outbox.get(message_id)
            if d is None or d.lease_owner != owner or d.status != PENDING:
                return False
            self._outbox[message_id] = replace(d, lease_owner=None, lease_expires_at=None, **values)  # type: ignore[arg-type]
            return True

    def delivery_done(self, message_id: str, owner: str, at: datetime) -> bool:
        return self._settle(message_id, owner, status=DELIVERED, delivered_at=at, last_error=None)

    def delivery_retry(self, message_id: str, owner: str, until: datetime | None, error: str) -> bool:
        if until is None:
            return self._settle(message_id, owner, status=FAILED, last_error=error[:2000])
        return self._settle(message_id, owner, next_attempt_at=until, last_error=error[:2000])

    def deliveries(
        self,
        *,
        subscription_id: str | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = 100,
    ) -> list[Delivery]:
        with self._lock:
            found = [
                d
                for d in self._outbox.values()
                if (subscription_id is None or d.message.subscription_id == subscription_id)
                and (status is None or d.status == status)
                and (ids is None or d.message.id in ids)
            ]
        found.sort(key=lambda d: d.message.id)
        found.sort(key=lambda d: d.message.created_at, reverse=True)
        return found[:limit]

    def replay_delivery(self, message_id: str, at: datetime) -> bool:
        with self._lock:
            d = self._outbox.get(message_id)
            if d is None:
                return False
            self._outbox[message_id] = replace(
                d,
                status=PENDING,
                attempts=0,
                since=at,
                next_attempt_at=at,
                lease_owner=None,
                lease_expires_at=None,
                delivered_at=None,
            )
            return True
