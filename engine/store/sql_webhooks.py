"""The webhook verbs of the SQL store: subscriptions, the outbox's leases, and what the CLI reads of deliveries.

A mixin of `engine.store.sql.SqlStore`. The outbox rows an event brings are written by `append` and `create`
themselves, in their transaction (`outbox_rows` gives the values); here is everything else: the deadline sweep's
and the breaker's messages (`enqueue_webhooks`, which skips a message already written, so a sweep run twice writes
nothing twice) and the sender's lease, like a task claim: a delivery leased by a worker that died is taken over
once its lease has expired.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, insert, or_, select, update

from engine.core.canonical import format_instant, parse_instant
from engine.core.webhooks import (
    DELIVERED,
    FAILED,
    PENDING,
    Delivery,
    Outgoing,
    Secret,
    Subscription,
    parse_interest,
)
from engine.store.decode import read_instant
from engine.store.schema import webhook_outbox, webhook_subscriptions


def secrets_text(secrets: Sequence[Secret]) -> str:
    return json.dumps(
        [{"value": s.value, "until": format_instant(s.until) if s.until is not None else None} for s in secrets]
    )


def read_secrets(text: str) -> tuple[Secret, ...]:
    return tuple(
        Secret(str(s["value"]), parse_instant(s["until"]) if s.get("until") else None) for s in json.loads(text)
    )


def subscription_values(sub: Subscription) -> dict[str, Any]:
    return {
        "id": sub.id,
        "url": sub.url,
        "kinds": json.dumps([i.text() for i in sub.interests]),
        "format": sub.format,
        "secrets": secrets_text(sub.secrets),
        "created_at": sub.created_at,
        "created_by": sub.created_by,
    }


def subscription_of(r: Any) -> Subscription:
    return Subscription(
        id=r.id,
        url=r.url,
        interests=tuple(parse_interest(t) for t in json.loads(r.kinds)),
        format=r.format,
        secrets=read_secrets(r.secrets),
        created_at=read_instant(r.created_at),
        created_by=r.created_by,
    )


def outbox_rows(messages: Sequence[Outgoing]) -> list[dict[str, Any]]:
    """The outbox rows of `messages`, due at once."""
    return [
        {
            "id": m.id,
            "subscription_id": m.subscription_id,
            "kind": m.kind,
            "task_id": m.task_id,
            "body": m.body,
            "created_at": m.created_at,
            "since": m.created_at,
            "status": PENDING,
            "attempts": 0,
            "next_attempt_at": m.created_at,
        }
        for m in messages
    ]


def _maybe(value: Any) -> datetime | None:
    return read_instant(value) if value is not None else None


def delivery_of(r: Any) -> Delivery:
    return Delivery(
        message=Outgoing(r.id, r.subscription_id, r.kind, r.task_id, r.body, read_instant(r.created_at)),
        status=r.status,
        attempts=int(r.attempts),
        since=read_instant(r.since),
        next_attempt_at=_maybe(r.next_attempt_at),
        last_error=r.last_error,
        delivered_at=_maybe(r.delivered_at),
        lease_owner=r.lease_owner,
        lease_expires_at=_maybe(r.lease_expires_at),
    )


class SqlWebhooks:
    """Webhook subscriptions and deliveries over the SQL store's engine."""

    engine: Engine
    _writer: Callable[[], AbstractContextManager[Connection]]
    _reader: Callable[[], AbstractContextManager[Connection]]
    _errors: Callable[[], AbstractContextManager[None]]

    def add_webhook(self, sub: Subscription) -> None:
        with self._errors(), self._writer() as conn:
            conn.execute(insert(webhook_subscriptions).values(**subscription_values(sub)))

    def webhooks(self) -> list[Subscription]:
        with self._errors(), self._reader() as conn:
            rows = conn.execute(select(webhook_subscriptions).order_by(webhook_subscriptions.c.created_at))
            return [subscription_of(r) for r in rows]

    def remove_webhook(self, subscription_id: str) -> bool:
        """Forget a subscription; its messages not yet delivered are not sent any more (marked failed)."""
        with self._errors(), self._writer() as conn:
            gone = conn.execute(delete(webhook_subscriptions).where(webhook_subscriptions.c.id == subscription_id))
            conn.execute(
                update(webhook_outbox)
                .where(webhook_outbox.c.subscription_id == subscription_id, webhook_outbox.c.status == PENDING)
                .values(status=FAILED, last_error="the subscription was removed", lease_owner=None)
            )
            return bool(gone.rowcount)

    def set_webhook_secrets(self, subscription_id: str, secrets: Sequence[Secret]) -> bool:
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(webhook_subscriptions)
                .where(webhook_subscriptions.c.id == subscription_id)
                .values(secrets=secrets_text(secrets))
            )
            return bool(moved.rowcount)

    def enqueue_webhooks(self, messages: Sequence[Outgoing]) -> int:
        """Write the messages not written yet (by id); returns how many were new."""
        if not messages:
            return 0
        with self._errors(), self._writer() as conn:
            ids = [m.id for m in messages]
            known = set(conn.execute(select(webhook_outbox.c.id).where(webhook_outbox.c.id.in_(ids))).scalars())
            fresh = [row for row in outbox_rows(messages) if row["id"] not in known]
            fresh = list({row["id"]: row for row in fresh}.values())
            if fresh:
                conn.execute(insert(webhook_outbox), fresh)
            return len(fresh)

    def lease_deliveries(self, owner: str, *, limit: int, lease_seconds: float, at: datetime) -> list[Delivery]:
        """Lease up to `limit` due messages to `owner` (their lease free or expired), counting an attempt each."""
        o = webhook_outbox.c
        free = or_(o.lease_expires_at.is_(None), o.lease_expires_at < at)
        due = and_(o.status == PENDING, o.next_attempt_at <= at, free)
        with self._errors(), self._writer() as conn:
            chosen = select(o.id).where(due).order_by(o.next_attempt_at).limit(limit)
            if self.engine.dialect.name == "postgresql":
                chosen = chosen.with_for_update(skip_locked=True)
            ids = list(conn.execute(chosen).scalars())
            if not ids:
                return []
            rows = conn.execute(
                update(webhook_outbox)
                .where(o.id.in_(ids), due)
                .values(
                    lease_owner=owner,
                    lease_expires_at=at + timedelta(seconds=lease_seconds),
                    attempts=o.attempts + 1,
                )
                .returning(*webhook_outbox.c)
            )
            return sorted((delivery_of(r) for r in rows), key=lambda d: (d.next_attempt_at or at, d.message.id))

    def _settle(self, message_id: str, owner: str, values: dict[str, Any]) -> bool:
        o = webhook_outbox.c
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(webhook_outbox)
                .where(o.id == message_id, o.lease_owner == owner, o.status == PENDING)
                .values(lease_owner=None, lease_expires_at=None, **values)
            )
            return bool(moved.rowcount)

    def delivery_done(self, message_id: str, owner: str, at: datetime) -> bool:
        return self._settle(message_id, owner, {"status": DELIVERED, "delivered_at": at, "last_error": None})

    def delivery_retry(self, message_id: str, owner: str, until: datetime | None, error: str) -> bool:
        """Try again at `until`, or (None) mark the message failed; only while `owner` still holds its lease."""
        if until is None:
            return self._settle(message_id, owner, {"status": FAILED, "last_error": error[:2000]})
        return self._settle(message_id, owner, {"next_attempt_at": until, "last_error": error[:2000]})

    def deliveries(
        self,
        *,
        subscription_id: str | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = 100,
    ) -> list[Delivery]:
        o = webhook_outbox.c
        query = select(webhook_outbox).order_by(o.created_at.desc(), o.id).limit(limit)
        if subscription_id is not None:
            query = query.where(o.subscription_id == subscription_id)
        if status is not None:
            query = query.where(o.status == status)
        if ids is not None:
            query = query.where(o.id.in_(list(ids)))
        with self._errors(), self._reader() as conn:
            return [delivery_of(r) for r in conn.execute(query)]

    def replay_delivery(self, message_id: str, at: datetime) -> bool:
        """Send a message again (the same id and body), with a new delivery window from `at`."""
        with self._errors(), self._writer() as conn:
            moved = conn.execute(
                update(webhook_outbox)
                .where(webhook_outbox.c.id == message_id)
                .values(
                    status=PENDING,
                    attempts=0,
                    since=at,
                    next_attempt_at=at,
                    lease_owner=None,
                    lease_expires_at=None,
                    delivered_at=None,
                )
            )
            return bool(moved.rowcount)
