"""What an append owes the webhook outbox: the subscriptions (read again every few seconds) and, for an event
about to be written, the messages to write with it (`engine.core.webhooks`, pure; this module only reads).

A process reads the subscriptions at most every `RAILYARD_WEBHOOK_REFRESH_SECONDS` (2 s): a new subscription is
matched from then on, a removed one stops being matched then (the messages already written for it are not sent).
With no subscription, an append pays nothing.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.core.canonical import now
from engine.core.definition import Workflow
from engine.core.errors import Code, RailyardError
from engine.core.events import Event
from engine.core.flow import BreakerRow
from engine.core.task import TaskState
from engine.core.webhooks import (
    FORMATS,
    Delivery,
    Outgoing,
    Secret,
    Subscription,
    breaker_happening,
    check_secret,
    check_url,
    event_happenings,
    messages,
    new_secret,
    parse_interest,
    rotated,
)
from engine.store.protocol import WebhookStore


class Outbox:
    """The subscriptions a process matches events against, and the messages an event brings."""

    def __init__(self, store: WebhookStore, refresh_seconds: float) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._subscriptions: list[Subscription] = []

    def subscriptions(self) -> list[Subscription]:
        """The subscriptions as last read, read again if older than `refresh_seconds`."""
        if time.monotonic() - self._read_at < self.refresh_seconds:
            return self._subscriptions
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_seconds:
                self._subscriptions = self.store.webhooks()
                self._read_at = time.monotonic()
        return self._subscriptions

    def forget(self) -> None:
        """Read the subscriptions again on the next event (after a change made by this process)."""
        self._read_at = -float("inf")

    def for_event(
        self, definition: Workflow, event: Event, status: str, after: TaskState | None = None
    ) -> list[Outgoing]:
        """The messages `event` brings (it leaves the task in `status`; `after` is the task it leaves, for the
        write it may record the failure of)."""
        subscriptions = self.subscriptions()
        if not subscriptions:
            return []
        entered = event.to_state if event.from_state != event.to_state or event.seq == 1 else None
        found = event_happenings(
            task_id=event.task_id,
            workflow=definition.name,
            event_key=f"{event.task_id}:{event.seq}",
            at=event.at,
            entered=entered,
            status=status,
            waiting_roles=lambda state: waiting_roles(definition, state),
            failed_write=failed_write(event, after),
        )
        return messages(found, subscriptions) if found else []

    def for_breaker(self, row: BreakerRow) -> list[Outgoing]:
        """The messages a breaker that just opened brings."""
        subscriptions = self.subscriptions()
        if not subscriptions:
            return []
        at = datetime.fromtimestamp(row.changed_at, UTC)
        return messages([breaker_happening(row.key, row.failures, row.changed_at, at)], subscriptions)


def waiting_roles(definition: Workflow, state_name: str) -> frozenset[str]:
    """The roles a person needs to act in `state_name` (none for a state only the engine or a signal moves)."""
    for state in definition.all_states:
        if state.name == state_name:
            return frozenset(a.role for a in state.outgoing() if a.role and not a.system)
    return frozenset()


def failed_write(event: Event, after: TaskState | None) -> Mapping[str, Any] | None:
    """The write tool call whose failure `event` records (a payment, a refund: what a write tool does), or None."""
    if event.trigger != "failed" or after is None or after.effect is None:
        return None
    effect = after.effect
    tool = str(effect.get("tool") or "")
    if effect.get("status") != "failed" or tool.startswith("child:"):
        return None
    if effect.get("action_id") != event.data.get("action_id"):
        return None
    outcome = event.data.get("outcome")
    said: Mapping[str, Any] = outcome if isinstance(outcome, Mapping) else {}
    return {
        "tool": tool,
        "action_id": effect.get("action_id"),
        "code": said.get("code"),
        "message": said.get("message"),
    }


# -- what an operator does with subscriptions (`railyard webhooks`) -------------------------------------------------
def subscribe(
    store: WebhookStore, url: str, kinds: Sequence[str], format: str, by: str, secret: str | None = None
) -> Subscription:
    """Keep a new subscription, everything checked first (a refusal keeps nothing); its secret is `secret` or a
    new random one."""
    if not kinds:
        raise RailyardError("a subscription wants at least one kind (--kind)", code=Code.WEBHOOK_KIND_UNKNOWN)
    interests = tuple(dict.fromkeys(parse_interest(k) for k in kinds))
    checked = check_url(url)
    if format not in FORMATS:
        raise RailyardError(
            f"{format!r} is not a webhook format (one of {', '.join(FORMATS)})", code=Code.WEBHOOK_FORMAT_UNKNOWN
        )
    value = check_secret(secret) if secret is not None else new_secret()
    sub = Subscription("wh_" + uuid.uuid4().hex[:16], checked, interests, format, (Secret(value),), now(), by)
    store.add_webhook(sub)
    return sub


def find(store: WebhookStore, subscription_id: str) -> Subscription:
    for sub in store.webhooks():
        if sub.id == subscription_id:
            return sub
    raise RailyardError(f"no webhook subscription {subscription_id!r}", code=Code.WEBHOOK_NOT_FOUND)


def rotate(store: WebhookStore, subscription_id: str, overlap: timedelta, secret: str | None = None) -> tuple[str, int]:
    """Give a subscription a new secret; the old ones go on signing for `overlap` (both signatures are sent).
    Returns the new secret and how many secrets sign now."""
    sub = find(store, subscription_id)
    fresh = check_secret(secret) if secret is not None else new_secret()
    secrets = rotated(sub.secrets, fresh, now(), overlap)
    if not store.set_webhook_secrets(sub.id, secrets):
        raise RailyardError(f"no webhook subscription {subscription_id!r}", code=Code.WEBHOOK_NOT_FOUND)
    return fresh, len(secrets)


def unsubscribe(store: WebhookStore, subscription_id: str) -> None:
    if not store.remove_webhook(subscription_id):
        raise RailyardError(f"no webhook subscription {subscription_id!r}", code=Code.WEBHOOK_NOT_FOUND)


def replay(store: WebhookStore, message_ids: Sequence[str]) -> int:
    """Send messages again (same id and body, a new delivery window); every id must be known, else nothing moves."""
    known = {d.message.id for d in store.deliveries(ids=message_ids, limit=len(message_ids))}
    missing = [m for m in message_ids if m not in known]
    if missing:
        raise RailyardError(f"no webhook delivery {missing[0]!r}", code=Code.WEBHOOK_NOT_FOUND)
    at = now()
    return sum(store.replay_delivery(m, at) for m in message_ids)


# -- what the CLI reads (through here, not the store) ---------------------------------------------------------------
def subscriptions_of(store: WebhookStore) -> list[Subscription]:
    """Every subscription, oldest first."""
    return store.webhooks()


def deliveries_of(
    store: WebhookStore, *, subscription_id: str | None = None, status: str | None = None, limit: int = 100
) -> list[Delivery]:
    """The newest messages first, of one subscription or status if given."""
    return store.deliveries(subscription_id=subscription_id, status=status, limit=limit)
