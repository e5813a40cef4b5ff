"""`railyard tokens`: make an API token with its tokens-file entry, or hash one, for `railyard serve`.

The tokens file holds only hashes (`engine.api.tokens`); a new token is printed once, here, and nowhere else.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import fail
from engine.cli.options import JsonFlag
from engine.cli.shell import Command, Group
from engine.core.errors import Code, RailyardError
from engine.runtime.engine import MAX_ACTOR_LENGTH

tokens_app = typer.Typer(
    cls=Group, help="API tokens for `railyard serve` (RAILYARD_TOKENS_FILE holds their hashes).", no_args_is_help=True
)


@tokens_app.command("new", cls=Command)
def new(
    actor: Annotated[str, typer.Option("--actor", help="Who the token speaks for (recorded as the actor).")],
    roles: Annotated[list[str] | None, typer.Option("--role", help="A role the token holds (repeat).")] = None,
    expires: Annotated[
        str | None,
        typer.Option("--expires", help="When it stops working: in N days (90d), or an ISO 8601 date or time (UTC)."),
    ] = None,
    tenants: Annotated[
        list[str] | None,
        typer.Option("--tenant", help="Confine the token to this tenant's tasks (repeat; default: not confined)."),
    ] = None,
) -> None:
    """Make a random token: print it once, then the [[token]] entry (its hash) to paste into the tokens file."""
    from engine.api.tokens import hash_token, new_token, toml_entry  # not at import: engine.api loads the server
    from engine.core.access import TENANT_NAME

    if not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
        fail(RailyardError(f"--actor must be 1 to {MAX_ACTOR_LENGTH} characters", code=Code.USAGE_INVALID))
    for tenant in tenants or ():
        if not TENANT_NAME.match(tenant):
            raise typer.BadParameter(f"{tenant!r} is not a tenant name ({TENANT_NAME.pattern})", param_hint="--tenant")
    until = _expiry(expires)
    token = new_token()
    render.text(f"token (give it to {actor}; it is not stored): {token}\n")
    render.text(toml_entry(actor, roles or [], hash_token(token), until, tenants or None).rstrip("\n"))


def _expiry(text: str | None) -> datetime | None:
    """`--expires`: N days from now (`90d`), or an instant; one in the past is a mistake, not a token."""
    from engine.cli.options import instant
    from engine.core.canonical import now

    if text is None:
        return None
    days = text.strip().lower().removesuffix("d")
    until = now() + timedelta(days=int(days)) if days.isascii() and days.isdigit() else instant(text, "--expires")
    if until is None or until <= now():
        raise typer.BadParameter(f"{text!r} is not a time to come", param_hint="--expires")
    return until


@tokens_app.command("list", cls=Command)
def list_command(
    path: Annotated[
        str | None,
        typer.Argument(help="The tokens file (default RAILYARD_TOKENS_FILE).", show_default=False),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """The entries of a tokens file: actor, roles, expiry (expired ones marked) and the start of each hash."""
    from engine.api.app import tokens_file
    from engine.api.tokens import read_tokens
    from engine.core.canonical import format_instant, now

    try:
        table = read_tokens(path or tokens_file())
    except RailyardError as error:
        fail(error)
    at = now()
    rows = [
        {
            "actor": p.actor,
            "roles": sorted(p.roles),
            "expires": format_instant(p.expires) if p.expires is not None else None,
            "expired": p.expired(at),
            "tenants": sorted(p.tenants) if p.tenants is not None else None,
            "sha256": p.token_hash,
        }
        for p in sorted(table.principals(), key=lambda p: (p.actor, p.token_hash))
    ]
    render.tokens(rows, as_json)


@tokens_app.command("hash", cls=Command)
def hash_command() -> None:
    """Print the sha256 of a token read from stdin (the form the tokens file stores)."""
    from engine.api.tokens import hash_token

    token = sys.stdin.readline().strip()
    if not token:
        fail(RailyardError('no token on stdin: printf %s "$TOKEN" | railyard tokens hash', code=Code.USAGE_INVALID))
    render.text(hash_token(token))
