"""`railyard users`: the people who sign in to the pages, kept in the database, and the access trail.

Every change is made on the database RAILYARD_DATABASE_URL names, takes effect
on the next request of every running server (no restart), and is recorded in
the access trail with who made it (`--by`, default the OS login name), in the
same transaction. Passwords are read from stdin (`--password-stdin`), or asked
for at a terminal by `passwd`, never taken as an argument (a process list shows those), and
never printed or recorded.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from engine.cli import render
from engine.cli.exits import fail, open_engine
from engine.cli.options import JsonFlag
from engine.cli.shell import Command, Group
from engine.core.errors import Code, RailyardError

if TYPE_CHECKING:  # the people and their records (pydantic, the runtime): imported when a command runs
    from engine.runtime.people import Outcome, People

users_app = typer.Typer(
    cls=Group,
    help="People who sign in to the pages, kept in the database; every change is in the access trail.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="The person's name (the actor the log records for what they do).")]
Role = Annotated[str, typer.Argument(help="A role, as the workflow definitions name it.")]
ByOpt = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Who makes the change, recorded in the access trail (default: your OS login name).",
        show_default=False,
    ),
]


def who(by: str | None) -> str:
    """`--by`, else the OS login name: the access trail's `by`. The CLI holds the database's credentials, so this
    is what the operator states, as `--as` is for a task's log."""
    if by is not None:
        return by
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        fail(RailyardError("cannot tell who you are from the OS: say it with --by NAME", code=Code.USAGE_INVALID))


@contextmanager
def people() -> Iterator[People]:
    """The people of RAILYARD_DATABASE_URL; a `RailyardError` inside the block ends the command through `fail`."""

    with open_engine() as engine:
        try:
            yield engine.people
        except RailyardError as error:
            fail(error)


def read_password(from_stdin: bool, *, ask: bool) -> str | None:
    """The password: one line of stdin with `--password-stdin`; with `ask`, asked twice at a terminal (a usage
    error without one); else None."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            fail(RailyardError("no password on stdin", code=Code.USAGE_INVALID))
        return password
    if not ask:
        return None
    if sys.stdin.isatty():
        from engine.core.people import MIN_PASSWORD

        first = getpass.getpass(f"Password (at least {MIN_PASSWORD} characters): ")
        if getpass.getpass("Again: ") != first:
            fail(RailyardError("the two passwords differ: nothing was changed", code=Code.USAGE_INVALID))
        return first
    fail(RailyardError("give the password on stdin with --password-stdin", code=Code.USAGE_INVALID))


def _done(outcome: Outcome, did: str, unchanged: str) -> None:
    render.say(did if outcome.changes else unchanged)


@users_app.command("add", cls=Command)
def add(
    name: Name,
    roles: Annotated[list[str] | None, typer.Option("--role", help="A role they hold (repeat).")] = None,
    tenants: Annotated[
        list[str] | None,
        typer.Option("--tenant", help="Confine them to this tenant's tasks (repeat; default: not confined)."),
    ] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read their password from the first line of stdin.")
    ] = False,
    by: ByOpt = None,
) -> None:
    """Add a person who signs in to the pages with their name and password (without one, set it later with
    `railyard users passwd`)."""
    actor = who(by)
    with people() as directory:
        password = read_password(password_stdin, ask=False)
        outcome = directory.add(name, roles or [], tenants or None, password=password, by=actor)
    held = ", ".join(sorted(outcome.person.roles)) or "no role"
    extra = "" if password is not None else f" (no password yet: railyard users passwd {name})"
    render.say(f"added {name} ({held}){extra}")


@users_app.command("list", cls=Command)
def list_command(as_json: JsonFlag = False) -> None:
    """The people: roles, tenants, where they come from, whether they may sign in. Never a password or its hash."""
    from engine.runtime.people import person_summary

    with people() as directory:
        rows = [dict(person_summary(p)) for p in directory.everyone()]
    render.people(rows, as_json)


@users_app.command("grant", cls=Command)
def grant(name: Name, role: Role, by: ByOpt = None) -> None:
    """Give NAME the role ROLE: their next request holds it, on every running server."""
    actor = who(by)
    with people() as directory:
        outcome = directory.grant(name, role, by=actor)
    _done(outcome, f"{name} holds {role}", f"{name} holds {role} already: nothing changed")


@users_app.command("revoke", cls=Command)
def revoke(name: Name, role: Role, by: ByOpt = None) -> None:
    """Take the role ROLE from NAME: their next request no longer holds it."""
    actor = who(by)
    with people() as directory:
        outcome = directory.revoke(name, role, by=actor)
    _done(outcome, f"{name} no longer holds {role}", f"{name} does not hold {role}: nothing changed")


@users_app.command("tenants", cls=Command)
def tenants_command(
    name: Name,
    tenants: Annotated[
        list[str] | None, typer.Option("--tenant", help="A tenant they are confined to (repeat).")
    ] = None,
    anywhere: Annotated[bool, typer.Option("--none", help="Confine them to no tenant (they see every task).")] = False,
    by: ByOpt = None,
) -> None:
    """Confine NAME to the tasks of these tenants (`--none`: not confined)."""
    if bool(tenants) == anywhere:
        fail(RailyardError("give --tenant (one or more) or --none", code=Code.USAGE_INVALID))
    actor = who(by)
    with people() as directory:
        outcome = directory.set_tenants(name, None if anywhere else tenants, by=actor)
    within = ", ".join(sorted(outcome.person.tenants)) if outcome.person.tenants is not None else "no tenant"
    _done(outcome, f"{name} is confined to {within}", f"{name} is confined to {within} already: nothing changed")


@users_app.command("disable", cls=Command)
def disable(name: Name, by: ByOpt = None) -> None:
    """NAME may no longer sign in; their open sessions (and tokens in their name) stop working at once."""
    actor = who(by)
    with people() as directory:
        outcome = directory.disable(name, by=actor)
    _done(outcome, f"{name} is disabled", f"{name} is disabled already")


@users_app.command("enable", cls=Command)
def enable(name: Name, by: ByOpt = None) -> None:
    """NAME may sign in again."""
    actor = who(by)
    with people() as directory:
        outcome = directory.enable(name, by=actor)
    _done(outcome, f"{name} is enabled", f"{name} is enabled already")


@users_app.command("passwd", cls=Command)
def passwd(
    name: Name,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the new password from the first line of stdin.")
    ] = False,
    by: ByOpt = None,
) -> None:
    """Set NAME's password (asked twice at a terminal, else read from stdin with --password-stdin)."""
    actor = who(by)
    with people() as directory:
        directory.require(name)
        password = read_password(password_stdin, ask=True)
        assert password is not None
        directory.set_password(name, password, by=actor)
    render.say(f"{name}'s password is set")


@users_app.command("trail", cls=Command)
def trail(
    subject: Annotated[
        str | None, typer.Option("--name", help="Only the changes of this person (or token sha256).")
    ] = None,
    after: Annotated[int | None, typer.Option("--after", help="Only the entries after this id.", min=0)] = None,
    as_json: JsonFlag = False,
) -> None:
    """The access trail: every change of people, roles, tenants, passwords and database tokens, who made it and
    when, oldest first. Append-only: the database refuses to change or delete an entry."""
    with people() as directory:
        rows = [c.to_dict() for c in directory.trail(subject=subject, after=after)]
    render.access_trail(rows, as_json)
