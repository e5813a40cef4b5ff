"""The options several commands share, and the readers of values typed on the command line."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.core.canonical import parse_instant
from engine.core.errors import RailyardError

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
TaskId = Annotated[str, typer.Argument(help="Task id, or its first 8 characters or more.")]
ActorOpt = Annotated[str, typer.Option("--as", help="The actor making the change (recorded in the log).")]
#: On a read: whom it is made for. Only the tasks they may read, without the fields their roles may not see.
ReaderOpt = Annotated[
    str | None,
    typer.Option(
        "--as",
        help="Read as this person (their roles from RAILYARD_ROLES_FILE): only the tasks they may read, and "
        "[restricted] for the fields their workflow shows only to other roles. Without it, everything.",
    ),
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded in the log).")]
#: A human command names the seq it was decided on; without it, it is decided on the task as read when it runs.
ExpectedSeq = Annotated[
    int | None, typer.Option("--expected-seq", help="Refuse (CONCURRENCY_CONFLICT) if the task moved past this seq.")
]
VersionOpt = Annotated[int | None, typer.Option("--version", help="Version (default: newest).")]
#: Who may have signed a checkpoint: each checkpoint names its key, so across a rotation give the old and the new.
PublicKeys = Annotated[
    list[str],
    typer.Option(
        "--public-key", help="A checkpoint signer's public key: 64 hex digits, or a file holding it (repeatable)."
    ),
]


#: Said in the help of every option that takes a JSON object.
JSON_SOURCES = "a JSON object, @FILE (read from the file) or - (read from stdin)"


def read_json_text(value: str, option: str) -> str:
    """The text of a JSON option: the value itself, the file `@FILE` names, or stdin for `-` (for input too long
    for a command line, or that should not be in the shell's history)."""
    if value == "-":
        return sys.stdin.read()
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise typer.BadParameter(f"{path} is not UTF-8 text", param_hint=option) from None
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint=option) from None
    return value


def parse_json(value: str | None, option: str) -> dict[str, Any] | None:
    """A JSON object given as an option's value, `@FILE` or `-` (None if the option was not given)."""
    if value is None:
        return None
    text = read_json_text(value, option)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc.msg}", param_hint=option) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return parsed


def instant(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 date or time from the command line; without a zone it is UTC."""
    if text is None:
        return None
    try:
        return parse_instant(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a seq nor an ISO 8601 date or time", param_hint=option) from None


# How a provider is called (`engine.core.model_settings`): each option beats its environment variable, which beats
# the profiles file. Unset (None) leaves the setting to those layers.
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        help="Seconds each provider call may take (over RAILYARD_MODEL_TIMEOUT and the profiles file; default 60).",
    ),
]
RetriesOpt = Annotated[
    int | None,
    typer.Option(
        "--retries",
        help="Calls made again after RATE_LIMITED or PROVIDER_TIMEOUT (over RAILYARD_MODEL_RETRIES and the profiles "
        "file; default 2).",
    ),
]
StreamOpt = Annotated[
    bool | None,
    typer.Option(
        "--stream/--no-stream",
        help="Ask for a streamed answer (over RAILYARD_MODEL_STREAM and the profiles file; default off).",
    ),
]
ThinkingOpt = Annotated[
    bool | None,
    typer.Option(
        "--thinking/--no-thinking",
        help="Ask the model to think, reasoning on (over RAILYARD_MODEL_THINKING; default off).",
    ),
]
ExtraBodyOpt = Annotated[
    str | None,
    typer.Option(
        "--extra-body",
        help="Merged into every request body: " + JSON_SOURCES + " (over RAILYARD_MODEL_EXTRA_BODY and the profiles "
        "file).",
    ),
]


def model_options(
    timeout: float | None, retries: int | None, stream: bool | None, extra_body: str | None
) -> dict[str, Any]:
    """The model settings the command line gives, by setting name (None: not given)."""
    return {
        "timeout_seconds": timeout,
        "retries": retries,
        "stream": stream,
        "extra_body": parse_json(extra_body, "--extra-body"),
    }


def thinking_option(given: bool | None) -> bool:
    """`--thinking/--no-thinking`, else RAILYARD_MODEL_THINKING, else off; a bad variable exits 2."""
    from engine.cli.exits import fail
    from engine.runtime import config

    if given is not None:
        return given
    try:
        return bool(config.model_thinking())
    except RailyardError as error:
        fail(error)
