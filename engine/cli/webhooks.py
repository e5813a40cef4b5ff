"""`railyard webhooks`: subscribe a URL to kinds of events, list and remove subscriptions, rotate a secret, inspect
deliveries and replay them.

A subscription's secret is printed once, when it is made or rotated (`whsec_...`: the receiver verifies the
`webhook-signature` header with it). During a rotation both the new and the old secret sign every message, for
`--overlap-hours`, so receivers can switch at their own pace. The workers (`railyard worker`) send the messages;
these commands only read and change what the database keeps (see docs/webhooks.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import fail, open_engine
from engine.cli.options import JsonFlag
from engine.cli.shell import Command, Group
from engine.cli.users import ByOpt, who
from engine.core.errors import Code, RailyardError

webhooks_app = typer.Typer(
    cls=Group,
    help="Webhook subscriptions (Standard Webhooks, or Slack's incoming-webhook text) and their deliveries.",
    no_args_is_help=True,
)

SecretOpt = Annotated[
    str | None,
    typer.Option("--secret", help="Use this whsec_ secret instead of a new random one (read it from a vault)."),
]


@webhooks_app.command("add", cls=Command)
def add(
    url: Annotated[str, typer.Argument(help="Where to POST (http or https).")],
    kinds: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            help="What to send (repeat): work.created[:ROLE], deadline.near:HOURS, task.ended, payment.failed,"
            " breaker.opened.",
        ),
    ] = None,
    format: Annotated[
        str, typer.Option("--format", help='standard (Standard Webhooks JSON) or slack ({"text": ...}).')
    ] = "standard",
    secret: SecretOpt = None,
    by: ByOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Subscribe URL to kinds of events; prints its id and its signing secret (once)."""
    from engine.core.webhooks import subscription_to_dict
    from engine.runtime.outbox import subscribe

    maker = who(by)
    with open_engine() as engine:
        sub = subscribe(engine.store, url, kinds or [], format, maker, secret)
    if as_json:
        render.print_json({**subscription_to_dict(sub), "secret": sub.secrets[0].value})
        return
    render.text(f"subscription {sub.id}: {sub.url} ({', '.join(i.text() for i in sub.interests)}, {sub.format})")
    render.text(f"secret (give it to the receiver; shown once): {sub.secrets[0].value}")


@webhooks_app.command("list", cls=Command)
def list_command(as_json: JsonFlag = False) -> None:
    """The subscriptions: id, URL, kinds, format, how many secrets sign (never a secret)."""
    from engine.core.webhooks import subscription_to_dict
    from engine.runtime.outbox import subscriptions_of

    with open_engine() as engine:
        rows = [subscription_to_dict(s) for s in subscriptions_of(engine.store)]
    if as_json:
        render.print_json(rows)
        return
    render.out.print(
        render._table(
            "Webhooks",
            ("id", "url", "kinds", "format", "secrets", "created"),
            ((r["id"], r["url"], ", ".join(r["kinds"]), r["format"], str(r["secrets"]), r["created_at"]) for r in rows),
        )
    )


@webhooks_app.command("remove", cls=Command)
def remove(subscription_id: Annotated[str, typer.Argument(help="The subscription's id (wh_...).")]) -> None:
    """Forget a subscription; its messages not yet delivered are not sent (they show as failed)."""
    from engine.runtime.outbox import unsubscribe

    with open_engine() as engine:
        unsubscribe(engine.store, subscription_id)
    render.say(f"removed {subscription_id}")


@webhooks_app.command("rotate-secret", cls=Command)
def rotate_secret(
    subscription_id: Annotated[str, typer.Argument(help="The subscription's id (wh_...).")],
    overlap_hours: Annotated[
        float,
        typer.Option("--overlap-hours", help="How long the old secret goes on signing beside the new one.", min=0),
    ] = 24.0,
    secret: SecretOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Give a subscription a new secret (printed once); the old one goes on signing for --overlap-hours, so every
    message carries both signatures meanwhile."""
    from engine.runtime.outbox import rotate

    with open_engine() as engine:
        fresh, signing = rotate(engine.store, subscription_id, timedelta(hours=overlap_hours), secret)
    if as_json:
        render.print_json({"id": subscription_id, "secret": fresh, "signing": signing})
        return
    render.text(f"new secret (shown once): {fresh}")
    render.say(f"{signing} secrets sign {subscription_id}'s messages; the old ones for {overlap_hours:g} h more")


@webhooks_app.command("deliveries", cls=Command)
def deliveries(
    subscription_id: Annotated[
        str | None, typer.Option("--subscription", help="Only this subscription's messages.")
    ] = None,
    status: Annotated[str | None, typer.Option("--status", help="pending, delivered or failed.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    as_json: JsonFlag = False,
) -> None:
    """The newest messages: kind, task, status, attempts, the next attempt or the last error."""
    from engine.core.webhooks import DELIVERED, FAILED, PENDING, delivery_to_dict
    from engine.runtime.outbox import deliveries_of

    if status is not None and status not in (PENDING, DELIVERED, FAILED):
        raise typer.BadParameter(f"{status!r} is not pending, delivered or failed", param_hint="--status")
    with open_engine() as engine:
        found = deliveries_of(engine.store, subscription_id=subscription_id, status=status, limit=limit)
    rows = [delivery_to_dict(d) for d in found]
    if as_json:
        render.print_json(rows)
        return
    render.out.print(
        render._table(
            "Webhook deliveries",
            ("id", "subscription", "kind", "task", "status", "attempts", "next / delivered", "last error"),
            (
                (
                    r["id"],
                    r["subscription"],
                    r["kind"],
                    (r["task_id"] or "")[:12],
                    r["status"],
                    str(r["attempts"]),
                    r["next_attempt_at"] or r["delivered_at"] or "",
                    r["last_error"] or "",
                )
                for r in rows
            ),
        )
    )


@webhooks_app.command("replay", cls=Command)
def replay(
    message_ids: Annotated[list[str] | None, typer.Argument(help="The messages to send again (msg_...).")] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="Every failed message (of --subscription, if given).")
    ] = False,
    subscription_id: Annotated[str | None, typer.Option("--subscription")] = None,
) -> None:
    """Send messages again, with the same id and body (receivers that had them drop them), from now on for a new
    delivery window."""
    from engine.core.webhooks import FAILED
    from engine.runtime.outbox import deliveries_of
    from engine.runtime.outbox import replay as replay_messages

    if not message_ids and not failed:
        fail(RailyardError("name the messages to replay, or --failed", code=Code.USAGE_INVALID))
    with open_engine() as engine:
        ids = list(message_ids or [])
        if failed:
            ids += [
                d.message.id
                for d in deliveries_of(engine.store, subscription_id=subscription_id, status=FAILED, limit=100_000)
            ]
        try:
            n = replay_messages(engine.store, ids)
        except RailyardError as error:
            fail(error)
    render.say(f"{render.count(n, 'message')} to send again")
