"""Webhooks: which subscriptions want what happened, what is sent, how it is signed, and when to try again.

Pure functions only: the engine describes an event as `Happening`s (`happenings`), `messages` turns them into the
outbox rows the same write keeps (`engine.store`), and the sender (`engine.runtime.webhooks`) signs and sends them
and asks `next_try` when to try again. Deliveries follow the Standard Webhooks specification
(https://www.standardwebhooks.com/): headers `webhook-id`, `webhook-timestamp` and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, several space-separated while a secret is being rotated),
secrets written `whsec_<base64>`. A message's id is derived from what it reports (the event, or the task and
deadline), so writing it twice writes one row, and every attempt carries the same id: receivers deduplicate on it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets as random_secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from engine.core.canonical import format_instant
from engine.core.errors import Code, RailyardError

#: What a subscription may ask for. `work.created` and `deadline.near` take a parameter (`work.created:ROLE`,
#: `deadline.near:HOURS`).
WORK_CREATED = "work.created"
DEADLINE_NEAR = "deadline.near"
TASK_ENDED = "task.ended"
PAYMENT_FAILED = "payment.failed"
BREAKER_OPENED = "breaker.opened"
KINDS = (WORK_CREATED, DEADLINE_NEAR, TASK_ENDED, PAYMENT_FAILED, BREAKER_OPENED)
#: How a message's body is written: the Standard Webhooks JSON (`type`, `timestamp`, `data`), or a Slack
#: incoming webhook's `{"text": ...}`.
FORMATS = ("standard", "slack")
SECRET_PREFIX = "whsec_"
#: A delivery's states: waiting for its next attempt, received (a 2xx answer), given up on (replayable).
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


@dataclass(frozen=True, slots=True)
class Interest:
    """One kind a subscription wants; `role` narrows `work.created` (None: work for any role), `hours` is how
    near a deadline must be for `deadline.near`."""

    kind: str
    role: str | None = None
    hours: float | None = None

    def text(self) -> str:
        if self.kind == WORK_CREATED and self.role is not None:
            return f"{self.kind}:{self.role}"
        if self.kind == DEADLINE_NEAR and self.hours is not None:
            return f"{self.kind}:{self.hours:g}"
        return self.kind


def parse_interest(text: str) -> Interest:
    """`KIND` or `KIND:PARAMETER` as typed on the command line; anything else is refused with
    `WEBHOOK_KIND_UNKNOWN`, before anything is stored."""
    kind, _, parameter = text.strip().partition(":")
    if kind not in KINDS:
        raise RailyardError(
            f"{text!r} is not a webhook kind (one of {', '.join(KINDS)})", code=Code.WEBHOOK_KIND_UNKNOWN
        )
    if kind == WORK_CREATED:
        return Interest(kind, role=parameter or None)
    if kind == DEADLINE_NEAR:
        try:
            hours = float(parameter)
        except ValueError:
            hours = math.nan
        if not math.isfinite(hours) or hours <= 0:
            raise RailyardError(
                f"{text!r}: deadline.near needs a number of hours above 0 (deadline.near:2)",
                code=Code.WEBHOOK_KIND_UNKNOWN,
            )
        return Interest(kind, hours=hours)
    if parameter:
        raise RailyardError(f"{text!r}: {kind} takes no parameter", code=Code.WEBHOOK_KIND_UNKNOWN)
    return Interest(kind)


def check_url(url: str) -> str:
    """An http(s) URL with a host, else `WEBHOOK_URL_INVALID`: a webhook is a POST to a web address, never a
    file or another scheme."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RailyardError(f"{url!r} is not an http or https URL", code=Code.WEBHOOK_URL_INVALID)
    return url.strip()


@dataclass(frozen=True, slots=True)
class Secret:
    """A signing secret (`whsec_...`); `until` is when a rotated-out secret stops signing (None: current)."""

    value: str
    until: datetime | None = None


def new_secret() -> str:
    """A random 24-byte secret in the Standard Webhooks form."""
    return SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(24)).decode()


def check_secret(value: str) -> str:
    """A secret given by an operator: `whsec_` and base64 of at least 16 bytes, else `WEBHOOK_SECRET_INVALID`."""
    try:
        key = base64.b64decode(value.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        key = b""
    if not value.startswith(SECRET_PREFIX) or len(key) < 16:
        raise RailyardError(
            "a webhook secret is whsec_ and base64 of 16 bytes or more", code=Code.WEBHOOK_SECRET_INVALID
        )
    return value


def rotated(current: Sequence[Secret], fresh: str, at: datetime, overlap: timedelta) -> tuple[Secret, ...]:
    """The secrets after a rotation: `fresh` first, the ones still signing until `at + overlap` (receivers check
    either signature meanwhile), expired ones dropped."""
    ending = (Secret(s.value, min(s.until, at + overlap) if s.until is not None else at + overlap) for s in current)
    return (Secret(fresh), *(s for s in ending if s.until is not None and s.until > at))


def signing(secrets: Sequence[Secret], at: datetime) -> list[str]:
    """The secrets that sign a delivery made at `at`: the current one and those rotated out less than their
    overlap ago."""
    return [s.value for s in secrets if s.until is None or s.until > at]


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """One Standard Webhooks signature: `v1,` and base64 of HMAC-SHA256 over `id.timestamp.body`."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets: Sequence[str], msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The headers of one attempt: the id (the same on every attempt), when it was signed, and one signature per
    signing secret, space-separated."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
    }


@dataclass(frozen=True, slots=True)
class Subscription:
    """A URL and the kinds it wants, with the body format and the signing secrets (newest first)."""

    id: str
    url: str
    interests: tuple[Interest, ...]
    format: str
    secrets: tuple[Secret, ...]
    created_at: datetime
    created_by: str

    def wants(self, happening: Happening) -> bool:
        for interest in self.interests:
            if interest.kind != happening.kind:
                continue
            if interest.kind == WORK_CREATED and interest.role is not None and interest.role not in happening.roles:
                continue
            if interest.kind == DEADLINE_NEAR and not _near(interest, happening):
                continue
            return True
        return False


def _near(interest: Interest, happening: Happening) -> bool:
    if happening.deadline is None or interest.hours is None:
        return False
    return happening.deadline - happening.at <= timedelta(hours=interest.hours)


@dataclass(frozen=True, slots=True)
class Happening:
    """Something a subscription may want: its kind, the task it is about (None for a breaker), when, and what
    the message says. `key` names it uniquely (an event: task and seq; a deadline: task and the deadline)."""

    kind: str
    key: str
    at: datetime
    task_id: str | None = None
    workflow: str | None = None
    state: str | None = None
    roles: frozenset[str] = frozenset()
    deadline: datetime | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """An outbox row: written with the event it reports, sent until a 2xx answer (or given up on)."""

    id: str
    subscription_id: str
    kind: str
    task_id: str | None
    body: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Delivery:
    """An outbox row as the sender and the CLI see it. `since` starts the window attempts are made in (its
    creation, or its last replay); `attempts` counts attempts begun (a crash mid-send counts one)."""

    message: Outgoing
    status: str
    attempts: int
    since: datetime
    next_attempt_at: datetime | None
    last_error: str | None = None
    delivered_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None


def message_id(subscription_id: str, happening_key: str) -> str:
    """The same id for the same happening and subscription, every time it is computed (`msg_` and 32 hex)."""
    return "msg_" + hashlib.sha256(f"{subscription_id}\n{happening_key}".encode()).hexdigest()[:32]


def messages(happenings: Iterable[Happening], subscriptions: Sequence[Subscription]) -> list[Outgoing]:
    """The outbox rows for `happenings`: one per (happening, subscription that wants it)."""
    out: list[Outgoing] = []
    for happening in happenings:
        for sub in subscriptions:
            if sub.wants(happening):
                out.append(
                    Outgoing(
                        id=message_id(sub.id, happening.key),
                        subscription_id=sub.id,
                        kind=happening.kind,
                        task_id=happening.task_id,
                        body=body(happening, sub.format),
                        created_at=happening.at,
                    )
                )
    return out


def payload(happening: Happening) -> dict[str, Any]:
    """The Standard Webhooks body: `type`, `timestamp` and `data`."""
    data: dict[str, Any] = {}
    if happening.task_id is not None:
        data.update(task_id=happening.task_id, workflow=happening.workflow, state=happening.state)
    if happening.roles:
        data["roles"] = sorted(happening.roles)
    if happening.deadline is not None:
        data["deadline"] = format_instant(happening.deadline)
    data.update(happening.details)
    return {"type": happening.kind, "timestamp": format_instant(happening.at), "data": data}


def slack_text(happening: Happening) -> str:
    """One line a person reads in a channel."""
    task = f"task {happening.task_id} ({happening.workflow})" if happening.task_id else ""
    d = happening.details
    if happening.kind == WORK_CREATED:
        return f"New work for {', '.join(sorted(happening.roles))}: {task} waits in {happening.state}"
    if happening.kind == DEADLINE_NEAR:
        due = format_instant(happening.deadline) if happening.deadline is not None else "?"
        return f"Deadline near: {task} in {happening.state} is due at {due}"
    if happening.kind == TASK_ENDED:
        return f"Task ended: {task} ended in {happening.state}"
    if happening.kind == PAYMENT_FAILED:
        return f"Payment failed: {task}: {d.get('tool')} failed ({d.get('code')}: {d.get('message') or 'no message'})"
    return f"Breaker opened: {d.get('key')} after {d.get('failures')} failures in a row"


def body(happening: Happening, format: str) -> str:
    """The body sent on every attempt, fixed when the message is written (so every attempt sends the same)."""
    doc: dict[str, Any] = {"text": slack_text(happening)} if format == "slack" else payload(happening)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


# -- when to try again ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter, bounded by time, not by a count: a receiver down for minutes or hours gets
    everything once it is back, as long as it is back within `give_up_seconds` of the message's first attempt."""

    base_seconds: float = 5.0
    max_seconds: float = 600.0
    give_up_seconds: float = 86400.0

    def delay(self, attempts: int, jitter: float) -> float:
        """The pause after the `attempts`-th failed attempt: base * 2^(n-1), at most `max_seconds`, times a
        factor in [0.5, 1) (`jitter` in [0, 1)) so receivers coming back are not hit by every sender at once."""
        plain = min(self.max_seconds, self.base_seconds * 2.0 ** min(max(attempts - 1, 0), 60))
        return plain * (0.5 + 0.5 * jitter)


def next_try(backoff: Backoff, attempts: int, since: datetime, at: datetime, jitter: float) -> datetime | None:
    """When to try a message that just failed its `attempts`-th attempt at `at`; None: give up (the window that
    opened at `since` is spent), and the message is marked failed, for `railyard webhooks replay`."""
    then = at + timedelta(seconds=backoff.delay(attempts, jitter))
    return then if then <= since + timedelta(seconds=backoff.give_up_seconds) else None


def breaker_happening(key: str, failures: int, changed_at: float, at: datetime) -> Happening:
    """A circuit breaker opened (`engine.runtime.flow`): named by its key and when it changed."""
    return Happening(
        kind=BREAKER_OPENED,
        key=f"breaker:{key}:{changed_at!r}",
        at=at,
        details={"key": key, "failures": failures},
    )


def deadline_happening(
    task_id: str, workflow: str, state: str, deadline: datetime, at: datetime, hours: float
) -> Happening:
    """A task's deadline is within `hours` of `at`: one per task, deadline and window (a sweep run again writes
    the same id, so nothing twice)."""
    return Happening(
        kind=DEADLINE_NEAR,
        key=f"deadline:{task_id}:{format_instant(deadline)}:{hours:g}",
        at=at,
        task_id=task_id,
        workflow=workflow,
        state=state,
        deadline=deadline,
        details={"within_hours": hours},
    )


def wanted_hours(subscriptions: Sequence[Subscription]) -> list[tuple[Subscription, float]]:
    """Each (subscription, hours) a deadline sweep looks for."""
    return [(s, i.hours) for s in subscriptions for i in s.interests if i.kind == DEADLINE_NEAR and i.hours]


def deadline_messages(
    subscriptions: Sequence[Subscription],
    tasks: Iterable[tuple[str, str, str, datetime]],
    at: datetime,
) -> list[Outgoing]:
    """The messages of one deadline sweep: for each (task, workflow, state, deadline) due within a subscription's
    hours, one message per subscription and deadline interest."""
    out: list[Outgoing] = []
    for task_id, workflow, state, deadline in tasks:
        for sub, hours in wanted_hours(subscriptions):
            if deadline - at <= timedelta(hours=hours):
                happening = deadline_happening(task_id, workflow, state, deadline, at, hours)
                out.extend(messages([happening], [_only(sub, hours)]))
    return out


def _only(sub: Subscription, hours: float) -> Subscription:
    """`sub` wanting only the deadline window `hours` (one message per interest, not one per interest per
    matching window)."""
    return Subscription(
        sub.id,
        sub.url,
        (Interest(DEADLINE_NEAR, hours=hours),),
        sub.format,
        sub.secrets,
        sub.created_at,
        sub.created_by,
    )


def event_happenings(
    *,
    task_id: str,
    workflow: str,
    event_key: str,
    at: datetime,
    entered: str | None,
    status: str,
    waiting_roles: Callable[[str], frozenset[str]],
    failed_write: Mapping[str, Any] | None,
) -> list[Happening]:
    """What one event means to webhooks: `entered` is the state the task entered (None if it stayed), `status`
    the task's status after it, `failed_write` the write whose failure the event records (None if none)."""
    out: list[Happening] = []
    if entered is not None and status == "terminal":
        out.append(Happening(TASK_ENDED, f"{event_key}:ended", at, task_id, workflow, entered))
    if entered is not None and status == "blocked":
        roles = waiting_roles(entered)
        if roles:
            out.append(Happening(WORK_CREATED, f"{event_key}:work", at, task_id, workflow, entered, roles=roles))
    if failed_write is not None:
        out.append(
            Happening(
                PAYMENT_FAILED,
                f"{event_key}:failed",
                at,
                task_id,
                workflow,
                entered,
                details={k: failed_write.get(k) for k in ("tool", "action_id", "code", "message")},
            )
        )
    return out


def subscription_to_dict(sub: Subscription) -> dict[str, Any]:
    """A subscription as `railyard webhooks list --json` shows it: never a secret, only how many sign."""
    return {
        "id": sub.id,
        "url": sub.url,
        "kinds": [i.text() for i in sub.interests],
        "format": sub.format,
        "secrets": len(sub.secrets),
        "created_at": format_instant(sub.created_at),
        "created_by": sub.created_by,
    }


def delivery_to_dict(d: Delivery) -> dict[str, Any]:
    m = d.message

    def when(t: datetime | None) -> str | None:
        return format_instant(t) if t is not None else None

    return {
        "id": m.id,
        "subscription": m.subscription_id,
        "kind": m.kind,
        "task_id": m.task_id,
        "status": d.status,
        "attempts": d.attempts,
        "created_at": when(m.created_at),
        "next_attempt_at": when(d.next_attempt_at) if d.status == PENDING else None,
        "delivered_at": when(d.delivered_at),
        "last_error": d.last_error,
    }
