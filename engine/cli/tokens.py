"""`railyard tokens`: make an API token, with its tokens-file entry or kept in the database (`--save`), list
them, revoke a database token, or hash a token, for `railyard serve`.

The tokens file and the database hold only hashes (`engine.api.tokens`); a new token is printed once, here, and
nowhere else. A database token's making and revoking are recorded in the access trail (`railyard users trail`),
with who did it (`--by`, default the OS login name), and take effect on the next request of a running server.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.cli import render
from engine.cli.exits import checked_database_url, database_url, fail
from engine.cli.options import JsonFlag
from engine.cli.shell import Command, Group
from engine.cli.users import ByOpt, people, who
from engine.core.errors import Code, RailyardError

if TYPE_CHECKING:  # pydantic's records: imported by the commands that read them, not for `railyard --help`
    from engine.core.people import StoredToken

tokens_app = typer.Typer(
    cls=Group,
    help="API tokens for `railyard serve` (their hashes: in RAILYARD_TOKENS_FILE, or in the database with --save).",
    no_args_is_help=True,
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
    save: Annotated[
        bool,
        typer.Option("--save", help="Keep it in the database (RAILYARD_DATABASE_URL) instead of printing an entry."),
    ] = False,
    by: ByOpt = None,
) -> None:
    """Make a random token and print it once; then the [[token]] entry (its hash) to paste into the tokens file, or,
    with --save, keep its hash in the database (recorded in the access trail)."""
    from engine.api.tokens import hash_token, new_token, toml_entry  # not at import: engine.api loads the server
    from engine.core.access import TENANT_NAME
    from engine.runtime.engine import MAX_ACTOR_LENGTH

    if not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
        fail(RailyardError(f"--actor must be 1 to {MAX_ACTOR_LENGTH} characters", code=Code.USAGE_INVALID))
    for tenant in tenants or ():
        if not TENANT_NAME.match(tenant):
            raise typer.BadParameter(f"{tenant!r} is not a tenant name ({TENANT_NAME.pattern})", param_hint="--tenant")
    until = _expiry(expires)
    token = new_token()
    if save:
        maker = who(by)
        _same_as_file(actor, roles or [], tenants or None)
        with people() as directory:
            kept = directory.add_token(hash_token(token), actor, roles or [], tenants or None, until, by=maker)
        render.text(f"token (give it to {actor}; only its hash is kept): {token}")
        render.text(f"sha256 {kept.sha256} kept in the database (revoke: railyard tokens revoke {kept.sha256[:12]})")
        return
    render.text(f"token (give it to {actor}; it is not stored): {token}\n")
    render.text(toml_entry(actor, roles or [], hash_token(token), until, tenants or None).rstrip("\n"))


def _same_as_file(actor: str, roles: list[str], tenants: list[str] | None) -> None:
    """One actor holds one set of roles and tenants whichever token it uses: a database token for an actor the
    tokens file (RAILYARD_TOKENS_FILE, when set and readable) gives others is refused."""
    from engine.api.tokens import read_tokens

    path = os.environ.get("RAILYARD_TOKENS_FILE")
    if not path:
        return
    try:
        table = read_tokens(path)
    except RailyardError:
        return  # the server would not start on it either; not this command's to report
    for p in table.principals():
        if p.actor == actor and (p.roles, p.tenants) != (frozenset(roles), frozenset(tenants) if tenants else None):
            fail(
                RailyardError(
                    f"the tokens file gives {actor!r} roles {sorted(p.roles)} and tenants "
                    f"{sorted(p.tenants) if p.tenants is not None else None}: one actor's tokens hold the same",
                    code=Code.USAGE_INVALID,
                )
            )


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
    """The tokens of the tokens file and of the database: actor, roles, tenants, expiry (expired ones marked),
    revoked database tokens, and the start of each hash (never a token)."""
    from engine.api.tokens import read_tokens
    from engine.core.canonical import format_instant, now

    at = now()
    rows: list[dict[str, Any]] = []
    file = path or os.environ.get("RAILYARD_TOKENS_FILE")
    if file:
        try:
            table = read_tokens(file)
        except RailyardError as error:
            fail(error)
        rows += [
            {
                "source": "file",
                "actor": p.actor,
                "roles": sorted(p.roles),
                "expires": format_instant(p.expires) if p.expires is not None else None,
                "expired": p.expired(at),
                "tenants": sorted(p.tenants) if p.tenants is not None else None,
                "sha256": p.token_hash,
                "revoked": None,
            }
            for p in sorted(table.principals(), key=lambda p: (p.actor, p.token_hash))
        ]
    stored = _database_tokens(required=not file)
    rows += [
        {
            "source": "database",
            "actor": t.actor,
            "roles": sorted(t.roles),
            "expires": format_instant(t.expires_at) if t.expires_at is not None else None,
            "expired": t.expires_at is not None and at >= t.expires_at,
            "tenants": sorted(t.tenants) if t.tenants is not None else None,
            "sha256": t.sha256,
            "revoked": format_instant(t.revoked_at) if t.revoked_at is not None else None,
        }
        for t in sorted(stored, key=lambda t: (t.actor, t.created_at, t.sha256))
    ]
    render.tokens(rows, as_json)


def _database_tokens(*, required: bool) -> list[StoredToken]:
    """The database's tokens. Listing a tokens file needs no database: one that cannot be read then leaves its
    tokens out, said on stderr; without a file, it is the command's error."""
    from engine.runtime.engine import Engine
    from engine.runtime.roles import StaticRoles

    try:
        url = database_url() if required else checked_database_url()
        with Engine(url, authoriser=StaticRoles()) as engine:
            return engine.people.tokens()
    except RailyardError as error:
        if required:
            fail(error)
        render.note(f"the database's tokens are not listed: {error.code}: {error.message}")
        return []


@tokens_app.command("revoke", cls=Command)
def revoke(
    prefix: Annotated[str, typer.Argument(help="The token's sha256, or its first 8 characters or more.")],
    by: ByOpt = None,
) -> None:
    """Revoke a database token: it stops working on its next request, page sessions opened with it included. A
    token of the tokens file is revoked by deleting its entry from the file."""
    maker = who(by)
    with people() as directory:
        gone = directory.revoke_token(prefix, by=maker)
    render.say(f"revoked {gone.sha256[:12]}… of {gone.actor}")


@tokens_app.command("hash", cls=Command)
def hash_command() -> None:
    """Print the sha256 of a token read from stdin (the form the tokens file stores)."""
    from engine.api.tokens import hash_token

    token = sys.stdin.readline().strip()
    if not token:
        fail(RailyardError('no token on stdin: printf %s "$TOKEN" | railyard tokens hash', code=Code.USAGE_INVALID))
    render.text(hash_token(token))
