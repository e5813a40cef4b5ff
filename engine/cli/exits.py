"""The exit-code contract, and the one way a command fails: its code on stderr, its exit status from the code.

0 ok, 1 a domain refusal, 2 a usage error (or a process set up wrong), 3 an
audit finding, 130 stopped by Ctrl-C. `docs/errors.md` lists each code's exit status from the sets
here (`tools/gen_errors_doc.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import typer

from engine.cli import render
from engine.core.errors import Category, Code, RailyardError

if TYPE_CHECKING:  # imported where they are used: `railyard --help` loads this module and needs neither
    from engine.runtime.engine import Engine
    from engine.runtime.registry import Registry

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_AUDIT = 3
#: A command stopped by Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT ended).
EXIT_INTERRUPTED = 130

#: Codes that report a broken log rather than a refused request: exit 3.
AUDIT_CODES = frozenset(code for code in Code if code.category is Category.INTEGRITY)

#: Codes that say the process is set up wrong (or the command typed wrong), not that the request was refused: exit 2.
CONFIG_CODES = frozenset(code for code in Code if code.category in (Category.CONFIG, Category.USAGE))


def exit_status(code: Code) -> int:
    """The exit status of a command refused with `code`."""
    if code in AUDIT_CODES:
        return EXIT_AUDIT
    return EXIT_USAGE if code in CONFIG_CODES else EXIT_REFUSED


def fail(error: RailyardError) -> NoReturn:
    render.refusal(error)
    raise typer.Exit(exit_status(error.code))


def database_url(*, create: bool = False) -> str:
    """RAILYARD_DATABASE_URL checked before anything connects: a URL that can be used, naming a database that is
    there (only `create`, for `db upgrade`, may name a SQLite file that is not there yet)."""
    try:
        return checked_database_url(create=create)
    except RailyardError as error:
        fail(error)


def checked_database_url(*, create: bool = False) -> str:
    """`database_url`'s checks, raising their `RailyardError` for a command that can do without the database."""
    from engine.runtime import config
    from engine.store.database import check_url, require_database

    url = config.database_url()
    require_database(check_url(url), create=create)
    return url


def require_schema(url: str) -> None:
    """SCHEMA_MISSING now, for a command that would otherwise only log it and carry on (a worker's claims)."""
    from engine.store import migrations

    try:
        if migrations.current(url) is None:
            fail(
                RailyardError(
                    "the database has no Railyard schema; run `railyard db upgrade`", code=Code.SCHEMA_MISSING
                )
            )
    except RailyardError as error:
        fail(error)


@contextmanager
def open_engine() -> Iterator[Engine]:
    """The engine over RAILYARD_DATABASE_URL; a `RailyardError` inside the block ends the command through `fail`."""
    from engine.runtime.engine import Engine

    url = database_url()
    try:
        with Engine(url) as engine:
            yield engine
    except RailyardError as error:
        fail(error)


def registry() -> Registry:
    """The workflow definitions RAILYARD_WORKFLOWS names, for the commands that need no database."""
    from engine.runtime.registry import Registry

    try:
        return Registry.from_env()
    except RailyardError as error:
        fail(error)
