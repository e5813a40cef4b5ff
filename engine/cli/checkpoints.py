"""`railyard checkpoint`: sign every task's head now, make a signing key, prove one checkpoint extends another.

A checkpoint is the auditor's anchor outside the database (`engine.audit.checkpoint`): replay with
`--checkpoint` finds what a checkpoint covered and the database no longer holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import EXIT_AUDIT, fail, open_engine
from engine.cli.options import JsonFlag, PublicKeys
from engine.cli.shell import Command, Group
from engine.core.errors import RailyardError

checkpoint_app = typer.Typer(
    cls=Group,
    help="Signed checkpoints of every task's head (RAILYARD_SIGNING_KEY, RAILYARD_CHECKPOINT_DIR).",
)


@checkpoint_app.callback(invoke_without_command=True)
def checkpoint(
    ctx: typer.Context,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="Where to write it (default RAILYARD_CHECKPOINT_DIR, ./checkpoints).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Sign every task's head (archived ones included) and write the checkpoint as a new file."""
    if ctx.invoked_subcommand is not None:
        return
    with open_engine() as engine:
        taken = engine.audit.checkpoint(directory=directory)
    render.checkpoint_written(taken, as_json)


@checkpoint_app.command("keygen", cls=Command)
def keygen(path: Annotated[Path, typer.Argument(help="The private key file to create (never overwritten).")]) -> None:
    """Make an Ed25519 signing key (readable by its owner only) and print its public key for verifiers."""
    from engine.audit.checkpoint import keygen as make_key

    try:
        public = make_key(path)
    except RailyardError as error:
        fail(error)
    render.out.print(public, highlight=False)


@checkpoint_app.command("verify", cls=Command)
def verify(
    older: Annotated[Path, typer.Argument(help="The older checkpoint file.")],
    newer: Annotated[Path, typer.Argument(help="The newer checkpoint file.")],
    public_key: PublicKeys,
    directory: Annotated[
        list[Path] | None,
        typer.Option("--dir", help="Where to look for the checkpoints between them (default: the two files' folders)."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Prove NEWER extends OLDER: both verify, NEWER's chain of predecessors reaches OLDER, and every task of OLDER
    is in NEWER at a head descending from it.

    Each checkpoint is checked with the key it names, among the --public-key ones (give the old and the new key
    across a rotation). Exit 3 with CHECKPOINT_INVALID, CHECKPOINT_NOT_EXTENDING or ARCHIVE_MISSING findings.
    """
    with open_engine() as engine:
        found = engine.audit.checkpoint_extends(older, newer, public_key, directory or ())
    render.checkpoint_verdict(found, older, newer, as_json)
    if found:
        raise typer.Exit(EXIT_AUDIT)
