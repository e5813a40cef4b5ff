"""Ctrl-C while the `railyard` command is still starting: the process ends quietly, never with a traceback.

Starting the command imports Typer, Rich and the command modules (the heavy ones, SQLAlchemy, pydantic and the
SDKs, only once a command runs), and that happens before any of the command's own code runs: a SIGINT then
would print a traceback of whatever module was importing. So, when this
process is the `railyard` command (its console script, or `python -m engine.cli`), the first thing `engine`
does is give SIGINT its default action back: the process ends at once, silently, as a Unix program does.
`engine.cli.main` turns SIGINT back into `KeyboardInterrupt` as soon as it runs (each command stops in its own
way from then on) and hands it to the default action again when the command is done, so that a Ctrl-C during
the interpreter's shutdown (exporters flushing, threads joined) is quiet too.

Any other program that imports `engine` keeps its own SIGINT handling: nothing here touches it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def is_the_command() -> bool:
    """Whether this process is the `railyard` command: its console script, or `python -m engine.cli`."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    if name.removesuffix(".exe") == "railyard":
        return True
    argv = list(getattr(sys, "orig_argv", ()))
    return any(argv[i] == "-m" and argv[i + 1] in ("engine.cli", "engine.cli.__main__") for i in range(len(argv) - 1))


def quiet() -> None:
    """SIGINT ends the process at once, with no traceback (the default action of the signal)."""
    if hasattr(signal, "SIGINT"):
        with contextlib.suppress(ValueError):  # not the main thread: not ours to change
            signal.signal(signal.SIGINT, signal.SIG_DFL)


def raising() -> None:
    """SIGINT raises `KeyboardInterrupt` again (Python's own handler), for a command to stop in its own way."""
    if hasattr(signal, "SIGINT"):
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, signal.default_int_handler)


if is_the_command():
    quiet()
