"""`railyard tokens`: make an API token with its tokens-file entry, or hash one, for `railyard serve`.

The tokens file holds only hashes (`engine.api.tokens`); a new token is printed once, here, and nowhere else.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import fail
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
) -> None:
    """Make a random token: print it once, then the [[token]] entry (its hash) to paste into the tokens file."""
    from engine.api.tokens import hash_token, new_token, toml_entry  # not at import: engine.api loads the server

    if not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
        fail(RailyardError(f"--actor must be 1 to {MAX_ACTOR_LENGTH} characters", code=Code.USAGE_INVALID))
    token = new_token()
    render.text(f"token (give it to {actor}; it is not stored): {token}\n")
    render.text(toml_entry(actor, roles or [], hash_token(token)).rstrip("\n"))


@tokens_app.command("hash", cls=Command)
def hash_command() -> None:
    """Print the sha256 of a token read from stdin (the form the tokens file stores)."""
    from engine.api.tokens import hash_token

    token = sys.stdin.readline().strip()
    if not token:
        fail(RailyardError('no token on stdin: printf %s "$TOKEN" | railyard tokens hash', code=Code.USAGE_INVALID))
    render.text(hash_token(token))
