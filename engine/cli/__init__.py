"""The `railyard` command line (Typer + Rich).

Exit codes are a contract: 0 ok, 1 a domain refusal (its code printed),
2 a usage error, 3 an audit finding, 130 Ctrl-C (`engine.cli.exits`). Every read command
takes `--json`. The commands live in a module per group (`tasks`, `approvals`,
`workers`, `audit`, `admin`); everything they print goes through `render`.
This module is the program: the Typer app, each command under its name in the
order `railyard --help` lists them, and the console-script entry point.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from engine import _interrupts
from engine.cli import admin, approvals, audit, forks, quality, tasks, workers
from engine.cli.checkpoints import checkpoint_app
from engine.cli.evals import eval_app
from engine.cli.exits import (
    AUDIT_CODES,
    CONFIG_CODES,
    EXIT_AUDIT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
)
from engine.cli.shell import CONTEXT_SETTINGS, Command, Group, Program, version_option
from engine.cli.tokens import tokens_app
from engine.cli.users import users_app
from engine.cli.webhooks import webhooks_app

__all__ = ["AUDIT_CODES", "CONFIG_CODES", "EXIT_AUDIT", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "app", "main"]

app = typer.Typer(
    name="railyard",
    help="Run LLM agent tasks as explicit, versioned state machines over a hash-chained event log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Program,
    context_settings=CONTEXT_SETTINGS,
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True, cls=Group)
app.add_typer(db_app, name="db")
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(tokens_app, name="tokens")
app.add_typer(webhooks_app, name="webhooks")
app.add_typer(users_app, name="users")
app.add_typer(eval_app, name="eval")

#: The commands that run for long (until stopped, or model turn after model turn).
LONG_RUNNING = frozenset({"worker", "serve", "demo", "run"})
#: How long a short command waits at exit for its spans to be exported (a collector that answers takes
#: milliseconds; one that does not is not waited for).
SHORT_EXIT_SECONDS = 0.5

#: Every command under its name, in the order `railyard --help` lists them.
COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("workflows", admin.workflows),
    ("start", tasks.start),
    ("show", tasks.show),
    ("history", tasks.history),
    ("fire", tasks.fire),
    ("cancel", tasks.cancel),
    ("note", tasks.note),
    ("settle", tasks.settle),
    ("migrate", tasks.migrate),
    ("fork", forks.fork),
    ("redrive", forks.redrive),
    ("approvals", approvals.approvals),
    ("approve", approvals.approve),
    ("reject", approvals.reject),
    ("worker", workers.worker),
    ("status", tasks.status),
    ("graph", admin.graph),
    ("replay", audit.replay),
    ("export", audit.export),
    ("verify-export", audit.verify_export_command),
    ("archive", audit.archive),
    ("quality", quality.quality),
    ("run", tasks.run),
    ("serve", workers.serve),
    ("providers", admin.providers),
    ("demo", admin.demo),
)
#: `railyard db ...`.
DB_COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("upgrade", admin.db_upgrade),
    ("downgrade", admin.db_downgrade),
    ("current", admin.db_current),
)
for name, command in COMMANDS:
    app.command(name, cls=Command)(command)
for name, command in DB_COMMANDS:
    db_app.command(name, cls=Command)(command)


@app.callback()
def program(
    _version: Annotated[
        bool, typer.Option("--version", callback=version_option, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Run LLM agent tasks as explicit, versioned state machines over a hash-chained event log."""


def main() -> None:
    """Console-script entry point."""
    # Ctrl-C ended the process quietly while `engine` imported (`engine._interrupts`); from here each command stops
    # in its own way (a worker finishes its steps, anything else exits 130: Typer's own), and once it is done the
    # interpreter's shutdown is quiet again.
    _interrupts.raising()
    try:
        # Like `python -m`, let RAILYARD_WORKFLOWS name modules in the directory the user is in.
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        app()
    except KeyboardInterrupt:  # between commands' own handling: before Click runs, or while it reports
        _interrupts.quiet()
        sys.exit(EXIT_INTERRUPTED)
    finally:
        _interrupts.quiet()
        # Spans still queued get the configured export timeout from a long-running command, a moment from the
        # others: a telemetry endpoint that does not answer never holds a short command at its exit. Tracing is
        # only ever on once an `Engine` imported the hooks: a command that never did (`--help`) has none to close.
        hooks = sys.modules.get("engine.observability.hooks")
        if hooks is not None:
            long_running = any(word in LONG_RUNNING for word in sys.argv[1:2])
            hooks.close_tracing(None if long_running else SHORT_EXIT_SECONDS)
