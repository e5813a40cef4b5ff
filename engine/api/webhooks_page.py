"""The webhooks page: the install's subscriptions and their newest deliveries, and a way to send some again.

What `railyard webhooks list`, `deliveries` and `replay` do, for the person who looks after the webhooks
(`engine.core.access.WEBHOOK_ADMIN`; an auditor reads it too and replays nothing). Subscriptions are the whole
install's, so a person confined to tenants is refused it: a delivery names any tenant's task. A URL is shown by
its scheme and host only, since an incoming-webhook URL (Slack's) carries its secret in its path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.api.tokens import Principal
from engine.core.access import may_replay_webhooks, may_see_webhooks
from engine.core.errors import Code, Refused
from engine.core.webhooks import DELIVERED, FAILED, PENDING, delivery_to_dict, subscription_to_dict
from engine.runtime.engine import Engine
from engine.runtime.outbox import deliveries_of, replay, subscriptions_of

#: How many deliveries the page lists, newest first.
SHOWN = 100
STATUSES = (PENDING, DELIVERED, FAILED)


@dataclass(frozen=True, slots=True)
class WebhooksPage:
    subscriptions: list[dict[str, object]]
    deliveries: list[dict[str, object]]
    status: str
    subscription: str
    may_replay: bool


def shown_url(url: str) -> str:
    """The URL as the page shows it: scheme and host, the path withheld (it may hold the hook's secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/…" if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/"


def refuse_unless_allowed(principal: Principal, *, replaying: bool = False) -> None:
    allowed = may_replay_webhooks if replaying else may_see_webhooks
    if not allowed(principal.caller):
        what = "send webhook deliveries again" if replaying else "see the webhooks"
        raise Refused(
            f"{principal.actor!r} may not {what}: it takes the role 'webhook_admin' (an auditor may read them), "
            "and no tenant",
            code=Code.FORBIDDEN,
            actor=principal.actor,
        )


def webhooks_page(engine: Engine, principal: Principal, *, status: str = "", subscription: str = "") -> WebhooksPage:
    """The subscriptions and the newest deliveries (of one status, of one subscription, if asked)."""
    refuse_unless_allowed(principal)
    if status and status not in STATUSES:
        raise Refused(f"{status!r} is not pending, delivered or failed", code=Code.PAYLOAD_INVALID)
    subscriptions = [{**subscription_to_dict(s), "url": shown_url(s.url)} for s in subscriptions_of(engine.store)]
    found = deliveries_of(engine.store, subscription_id=subscription or None, status=status or None, limit=SHOWN)
    return WebhooksPage(
        subscriptions=subscriptions,
        deliveries=[delivery_to_dict(d) for d in found],
        status=status,
        subscription=subscription,
        may_replay=may_replay_webhooks(principal.caller),
    )


def send_again(engine: Engine, principal: Principal, message_ids: Sequence[str]) -> int:
    """Send the chosen deliveries again (same id and body, a new delivery window); how many will be."""
    refuse_unless_allowed(principal, replaying=True)
    if not message_ids:
        raise Refused("choose the deliveries to send again", code=Code.PAYLOAD_INVALID)
    return replay(engine.store, list(message_ids))
