"""`railyard --help` and `--version` stay quick (#29): what they import, not how long they take.

Starting the command is mostly imports. The heavy ones (SQLAlchemy, pydantic, FastAPI, the providers' SDKs, the
engine's runtime, store and API) are imported only by the commands that use them, so printing help or the
version never pays for them. Timing belongs in `bench/cli_start.py`; here each case runs in a fresh interpreter
and names what it imported.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import engine

REPO = Path(__file__).resolve().parent.parent

#: Libraries a command imports when it does its work, never to print its help.
HEAVY_LIBRARIES = frozenset(
    {
        "alembic",
        "anthropic",
        "authlib",
        "fastapi",
        "httpx",
        "jinja2",
        "mako",
        "openai",
        "opentelemetry",
        "prometheus_client",
        "psycopg",
        "pydantic",
        "pydantic_core",
        "sqlalchemy",
        "starlette",
        "uvicorn",
    }
)
#: The engine's layers above the pure core's two light modules (`engine.core.errors`, `engine.core.canonical`).
HEAVY_LAYERS = (
    "engine.runtime",
    "engine.store",
    "engine.api",
    "engine.audit",
    "engine.providers",
    "engine.observability",
)

#: Run in a fresh interpreter: the program for each argument list given (as `railyard` runs it, its output
#: swallowed), then the heavy modules it had imported, as JSON.
PROBE = """
import contextlib, io, json, sys
import typer.main
from engine.cli import app

program = typer.main.get_command(app)
for args in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = program.main(args, prog_name="railyard", standalone_mode=False)
    assert status == 0, (args, status)
heavy = set(json.loads(sys.argv[2]))
layers = tuple(json.loads(sys.argv[3]))
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy or m.startswith(layers))))
"""


def heavy_modules_after(*runs: list[str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAILYARD_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(runs), json.dumps(sorted(HEAVY_LIBRARIES)), json.dumps(HEAVY_LAYERS)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"]], ids=" ".join)
def test_the_program_help_and_version_import_nothing_heavy(args: list[str]) -> None:
    assert heavy_modules_after(args) == []


#: The help of a sub-command of a group that takes options of its own: Typer converts the group's options, unset,
#: before the sub-command sees its `--help`, and it converts a path through pydantic (imported by Typer, not by
#: Railyard: no engine layer and no other library comes with it).
TYPER_CONVERTS = (["checkpoint", "keygen", "--help"], ["checkpoint", "verify", "--help"])


def test_every_command_help_imports_nothing_heavy() -> None:
    import typer.main

    from engine.cli import app

    def paths(command: object, path: tuple[str, ...]) -> list[list[str]]:
        found = [[*path, "--help"]]
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            found += paths(sub, (*path, name))
        return found

    every = paths(typer.main.get_command(app), ())
    assert len(every) > 40  # the commands and groups, with the program itself
    assert all(case in every for case in TYPER_CONVERTS)
    assert heavy_modules_after(*(case for case in every if case not in TYPER_CONVERTS)) == []
    for case in TYPER_CONVERTS:
        assert {m.split(".")[0] for m in heavy_modules_after(case)} <= {"pydantic", "pydantic_core"}


def test_a_command_that_runs_imports_what_it_needs() -> None:
    """The probe sees heavy imports when there are some: `providers` reads the profiles through the runtime."""
    assert any(m.startswith("pydantic") for m in heavy_modules_after(["providers", "--json"]))


def test_importing_engine_imports_no_layer_until_a_name_is_used() -> None:
    probe = (
        "import json, sys; import engine; before = sorted(m for m in sys.modules if m.startswith('engine.')); "
        "from engine import Engine, Workflow; print(json.dumps([before, Engine.__module__, Workflow.__module__]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    before, engine_module, workflow_module = json.loads(done.stdout)
    assert before == ["engine._interrupts"]
    assert (engine_module, workflow_module) == ("engine.runtime.engine", "engine.core.definition")


def test_the_public_names_are_the_ones_type_checkers_see() -> None:
    """`engine/__init__.py` names each export twice: imported under TYPE_CHECKING (for mypy and editors) and in
    the table `__getattr__` serves at run time. The two, and `__all__`, are the same, and each name is the
    object its module defines."""
    tree = ast.parse((REPO / "engine" / "__init__.py").read_text(encoding="utf-8"))
    [block] = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            name = alias.asname or alias.name
            try:  # a module imported by name (`from engine.runtime import config`) is served as that module
                importlib.import_module(f"{node.module}.{alias.name}")
                seen[name] = f"{node.module}.{alias.name}"
            except ModuleNotFoundError:
                seen[name] = f"{node.module}:{alias.name}"
    assert seen == engine._EXPORTS
    assert sorted(engine.__all__) == sorted(seen)
    for name, target in seen.items():
        module, _, attribute = target.partition(":")
        expected = importlib.import_module(module)
        assert getattr(engine, name) is (getattr(expected, attribute) if attribute else expected), name
    assert set(engine.__all__) <= set(dir(engine))
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        engine.Engin  # type: ignore[attr-defined]  # noqa: B018
