"""The commands about the setup rather than one task: the schema, the definitions, their diagrams, the
capability profiles, and the demo."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from engine.cli import render
from engine.cli.exits import database_url, fail, open_engine, registry
from engine.cli.options import ExtraBodyOpt, JsonFlag, RetriesOpt, StreamOpt, TimeoutOpt, VersionOpt, model_options
from engine.core.errors import Code, RailyardError


class GraphFormat(StrEnum):
    mermaid = "mermaid"
    dot = "dot"


def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Create or migrate the schema of RAILYARD_DATABASE_URL to REVISION (default: head)."""
    from engine.store import migrations

    url = database_url(create=True)
    with _migrating(revision):
        migrations.upgrade(url, revision)
        render.say(f"database at revision {migrations.current(url)}")


def db_downgrade(revision: Annotated[str, typer.Argument(help="Target revision ('base' drops everything).")]) -> None:
    """Migrate the schema down to REVISION."""
    from engine.store import migrations

    url = database_url()
    with _migrating(revision):
        migrations.downgrade(url, revision)
        render.say(f"database at revision {migrations.current(url) or 'base'}")


def db_current(as_json: JsonFlag = False) -> None:
    """Print the schema revision the database is at."""
    from engine.store import migrations

    url = database_url()
    with _migrating(None):
        render.revision(migrations.current(url), as_json)


@contextmanager
def _migrating(revision: str | None) -> Iterator[None]:
    """A database problem ends the command through `fail`; a revision Alembic does not know is a usage error."""
    from alembic.util import CommandError

    try:
        yield
    except RailyardError as error:
        fail(error)
    except CommandError as exc:
        fail(RailyardError(f"revision {revision!r}: {exc}", code=Code.USAGE_INVALID))


def workflows(as_json: JsonFlag = False) -> None:
    """List the workflow definitions the code defines (RAILYARD_WORKFLOWS), every version."""
    rows: list[dict[str, Any]] = [
        {
            "workflow": wf.name,
            "version": wf.version,
            "digest": wf.digest,
            "initial": wf.initial_state,
            "states": len(wf.states),
            "description": wf.description,
            # Who may act on its tasks (and so read them); `anyone`: a trigger any signed-in person may fire.
            "roles": sorted(wf.roles()),
        }
        for wf in registry()
    ]
    render.workflows(rows, as_json)


def graph(
    workflow: Annotated[str, typer.Argument(help="Workflow name.")],
    version: VersionOpt = None,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Diagram language.")] = GraphFormat.mermaid,
    task_id: Annotated[
        str | None,
        typer.Option("--task", help="Highlight the path this task took (its version), with visit counts on edges."),
    ] = None,
) -> None:
    """Print the workflow's state diagram (Mermaid or Graphviz dot), optionally with one task's route on it."""
    if task_id is None:
        try:
            definition = registry().get(workflow, version)
        except RailyardError as error:
            fail(error)
        render.text(definition.machine.graph(fmt.value))
        return
    with open_engine() as engine:
        task_id = engine.resolve_task_id(task_id)
        row, visits, current = engine.audit.path(task_id)
        if row.workflow != workflow:
            raise typer.BadParameter(f"task {task_id} is a {row.workflow} task, not {workflow}", param_hint="--task")
        if version is not None and version != row.version:
            raise typer.BadParameter(f"task {task_id} is on version {row.version}", param_hint="--version")
        definition = engine.registry.get(workflow, row.version)
    render.text(definition.machine.graph(fmt.value, current=current, visits=visits))


def providers(as_json: JsonFlag = False) -> None:
    """The capability profiles and the forcing rung each gets, with thinking off and on."""
    from engine.core.forcing import rung_table
    from engine.core.profiles import load_profiles
    from engine.runtime.models import settings_for

    try:
        rows = rung_table(load_profiles())
        for row in rows:  # what a model of the profile is called with here: the environment and the profiles file
            settings, sources = settings_for(row["name"])
            row["settings"], row["settings_from"] = settings.to_dict(), sources
    except RailyardError as error:
        fail(error)
    render.providers(rows, as_json)


def demo(
    model: Annotated[
        str | None, typer.Option("--model", help="openai:MODEL or anthropic:MODEL instead of the scripted answers.")
    ] = None,
    timeout: TimeoutOpt = None,
    retries: RetriesOpt = None,
    stream: StreamOpt = None,
    extra_body: ExtraBodyOpt = None,
) -> None:
    """Run the reference workflows' four scenarios on RAILYARD_DATABASE_URL, step by step, then replay them."""
    from engine.store.database import connection_errors

    settings = model_options(timeout, retries, stream, extra_body)
    try:
        if model is None and any(v is not None for v in settings.values()):
            raise RailyardError(
                "the timeout, retry, stream and extra-body options need --model: the scripted demo calls no provider",
                code=Code.CONFIG_INVALID,
            )
        _reference_workflows()  # first: without them, no database would do
    except RailyardError as error:
        fail(error)
    url = database_url()
    try:
        from workflows.demo import run_demo

        with connection_errors(url):  # the fakes of the systems the demo calls connect on their own
            run_demo(url, render.out, model=model, model_settings=settings)
    except RailyardError as error:
        fail(error)


def _reference_workflows() -> None:
    """Load the repository's reference `workflows` package: it is not installed, and a user's own is not it.

    It is looked for in the checkout this `engine` runs from (an editable install), then in the working directory
    (a clone, with Railyard installed from a wheel), and put first on the import path.
    """
    checkout = Path(__file__).resolve().parents[2]
    roots = [root for root in (checkout, Path.cwd()) if (root / "pyproject.toml").is_file()]  # checkouts only
    demo = next((root / "workflows" / "demo.py" for root in roots if (root / "workflows" / "demo.py").is_file()), None)
    if demo is None:
        raise RailyardError(
            "railyard demo runs Railyard's reference workflows, which live in the repository's workflows/ folder "
            "and are not installed with Railyard: run it in a clone of the repository (`make demo`)",
            code=Code.CONFIG_INVALID,
        )
    sys.path.insert(0, str(demo.parents[1]))
    loaded = sys.modules.get("workflows")
    if loaded is not None and Path(loaded.__file__ or "").resolve().parent != demo.parent:
        raise RailyardError(
            f"railyard demo needs the reference workflows at {demo.parent}, but another `workflows` package is "
            f"already imported ({loaded.__file__})",
            code=Code.CONFIG_INVALID,
        )
