"""Dump what the `railyard` command shows without doing anything (every command's and group's `--help`, the
version, a few usage errors) and the API's OpenAPI document to a folder, so a change meant to leave them alone
(lazy imports, a moved module) can be checked byte for byte against the tree before it:

    python tools/cli_surface.py /tmp/before        # on the untouched tree
    python tools/cli_surface.py /tmp/after         # after the change
    diff -r /tmp/before /tmp/after                 # nothing

Each text is the real program's, run as a subprocess (`python -m engine.cli`), so it is what a user sees; each is
dumped piped (the width `render.PIPE_WIDTH` sets), at TERMINAL_WIDTH=80 and with colour forced. The command tree
is read from the Typer app, so a new command is dumped without editing this file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: Each environment the texts are dumped in, by the folder they go to.
VARIANTS: dict[str, dict[str, str]] = {
    "pipe": {},
    "width80": {"TERMINAL_WIDTH": "80"},
    "color": {"FORCE_COLOR": "1", "TERMINAL_WIDTH": "100"},
}
#: Usage errors and the like: what they print must not move either.
EXTRA: tuple[tuple[str, ...], ...] = (
    (),
    ("--version",),
    ("-h",),
    ("db",),
    ("no-such-command",),
    ("start",),
    ("show",),
    ("approve", "x"),
    ("--no-such-option",),
)


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group of the program, as the words that name it (the program itself is `()`)."""
    import typer

    from engine.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


def run(args: tuple[str, ...], env: dict[str, str]) -> str:
    """What `railyard ARGS` prints, both streams and the exit status, as one text."""
    done = subprocess.run(
        [sys.executable, "-m", "engine.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "RAILYARD_DATABASE_URL": "sqlite:///nowhere-cli-surface.db", **env},
        timeout=120,
        check=False,
    )
    return (
        f"$ railyard {' '.join(args)}\n--- exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )


def openapi() -> dict[str, Any]:
    """The API's OpenAPI document, built as tools/gen_api_doc.py builds it."""
    from engine import Engine, Registry
    from engine.api import TokenTable, create_app

    with Engine("sqlite://", Registry([]), authoriser=TokenTable.from_tokens({})) as engine:
        return create_app(engine, TokenTable.from_tokens({}), session_secret="docs").openapi()


def main(folder: Path) -> None:
    jobs: list[tuple[Path, tuple[str, ...], dict[str, str]]] = []
    for variant, env in VARIANTS.items():
        for path in command_paths():
            jobs.append((folder / variant / ("help-" + "-".join(("railyard", *path)) + ".txt"), (*path, "--help"), env))
        for args in EXTRA:
            name = "-".join(("railyard", *args)).replace("--", "opt-")
            jobs.append((folder / variant / f"other-{name}.txt", args, env))
    for file, _, _ in jobs:
        file.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        texts = list(pool.map(lambda job: run(job[1], job[2]), jobs))
    for (file, _, _), text in zip(jobs, texts, strict=True):
        file.write_text(text, encoding="utf-8")
    (folder / "openapi.json").write_text(json.dumps(openapi(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{len(jobs)} texts and the OpenAPI document in {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/cli_surface.py FOLDER")
    main(Path(sys.argv[1]))
