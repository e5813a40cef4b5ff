"""The shell every command runs in: conventional help, and the one place where whatever stopped a command
becomes one line with a code.

Typer's own rendering of a usage error is a box drawn at the terminal's width, and an exception nobody expected
is a traceback: neither says what to do, and neither is a line a script can read. Here the root group runs
Click without its standalone handling and ends every command the same way: `CODE: message` on stderr, the
exit status of the code (`engine.cli.exits`). RAILYARD_DEBUG=1 lets an unexpected exception through with its
traceback, for the person fixing it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from engine.cli import render
from engine.cli.exits import EXIT_REFUSED, exit_status
from engine.core.errors import Code, RailyardError

#: Help conventions every command shares: `-h` as well as `--help`.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


# Typer 0.2x vendors Click (its classes are not the `click` distribution's), so Click's objects are recognised
# here by Typer's public classes and by their documented attributes, never by importing Click.


def _usage_pieces(command: TyperCommand | TyperGroup, ctx: Any) -> list[str]:
    """`[OPTIONS] TASK_ID [TRIGGER]`: arguments by their upper-case names, optional ones in brackets (Typer
    0.2x writes a required one as `{task_id}`)."""
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
    return pieces


def _help_flag(option: Any) -> Any:
    """`--help` off unless given, as every other flag is: Typer leaves its default unset, and it converts an unset
    value through a pydantic adapter (pydantic's import: about 130 ms, half of what `railyard CMD --help` would
    take); a flag that is already a bool is taken as it is."""
    if option is not None and option.default is None:
        option.default = False
    return option


def _conventional(params: Sequence[Any]) -> None:
    """Arguments named in upper case in the help panels, and flags shown without a `<bool>` value."""
    for param in params:
        if isinstance(param, TyperArgument) and param.metavar is None:
            param.metavar = (param.name or "").upper()
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


class Command(TyperCommand):
    """A command with the conventional help."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _conventional(params)
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)

    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag(super().get_help_option(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _help_width()
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """A command group with the conventional help (`railyard db`, `railyard checkpoint`, `railyard tokens`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _conventional(params)
        return params

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar or "COMMAND [ARGS]..."]

    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag(super().get_help_option(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _help_width()
        super().format_help(ctx, formatter)


class Program(Group):
    """`railyard` itself: runs the command and turns whatever stopped it into `CODE: message` and an exit status."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        status = _undecodable(argv)
        if status is None:
            try:
                result = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
                status = result if isinstance(result, int) else 0
            except typer.Abort:  # a prompt answered no, or stdin ended (Typer makes Ctrl-C an exit 130 itself)
                render.note("aborted")
                status = EXIT_REFUSED
            except RailyardError as error:  # a command that let one through rather than calling `fail`
                render.refusal(error)
                status = exit_status(error.code)
            except Exception as exc:
                if _is_usage_error(exc):
                    status = _usage(exc)
                elif os.environ.get("RAILYARD_DEBUG"):
                    raise
                else:
                    status = _unexpected(exc)
        if standalone_mode:
            sys.exit(status)
        return status


def _help_width() -> None:
    """Help printed to a pipe or a file is drawn `render.PIPE_WIDTH` wide, as tables are: Rich would otherwise
    fit it to 80 columns and cut the option names (`--checkpoint-minu…`). TERMINAL_WIDTH, if set, still wins.

    Called as help is drawn, not before every command: Typer's help renderer (with Rich's Markdown) takes
    about 40 ms to import, which a command that prints no help should not pay."""
    from typer import rich_utils

    if rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = render.PIPE_WIDTH


def _undecodable(argv: list[str]) -> int | None:
    """USAGE_INVALID for an argument that is not text: bytes the locale cannot decode (Python keeps them as
    lone surrogates, which nothing can print or store). None when every argument is text."""
    for i, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(arg)
            return _refuse(
                RailyardError(f"argument {i} ({raw!r}) is not UTF-8 text: type it again", code=Code.USAGE_INVALID)
            )
    return None


def _is_usage_error(exc: Exception) -> bool:
    """Click's `ClickException` (a usage error, a bad parameter, a file it could not open), by its interface."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _usage(exc: Any) -> int:
    """A usage error as one line: what was wrong, and where the command's help is."""
    message = str(exc.format_message()).replace("\n", " ").strip()
    if not message:  # `railyard` or `railyard db` alone: the help was the answer
        return int(exc.exit_code)
    path = getattr(getattr(exc, "ctx", None), "command_path", None)
    where = f" (see `{path} --help`)" if path else ""
    return _refuse(RailyardError(message + where, code=Code.USAGE_INVALID))


def _unexpected(exc: Exception) -> int:
    text = str(exc).strip().splitlines()
    detail = f": {text[0][:200]}" if text else ""
    return _refuse(
        RailyardError(
            f"{type(exc).__name__}{detail} (a bug: please report it; RAILYARD_DEBUG=1 shows the traceback)",
            code=Code.UNEXPECTED_ERROR,
        )
    )


def _refuse(error: RailyardError) -> int:
    render.refusal(error)
    return exit_status(error.code)


def version_option(value: bool) -> None:
    """`railyard --version`: the installed distribution's version."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            shown = version("railyard")
        except PackageNotFoundError:
            shown = "unknown (not installed)"
        render.say(f"railyard {shown}")
        raise typer.Exit()
