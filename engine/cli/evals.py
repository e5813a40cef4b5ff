"""`railyard eval`: evaluation cases from the log, and runs of them against a model, writing nothing.

`eval capture` takes the model's view when a task entered an agent state (`engine.core.evals`: identities,
restricted and sensitive fields taken out) and writes it as a case, JSON or YAML (both plain, for review in a pull
request; `eval run` and `eval generate --from` read either); `eval generate` derives adversarial
cases of a state from a base case, its schemas and its guards (`engine.core.adversarial`); `eval run` puts cases
before a model through the real agent runner (`engine.runtime.evals`): the forcing ladder, schema checks and
guards of the current definition, no task log, no tool, each model call through the workers' flow control (the
shared breaker and quotas of the database, `--quotas` over them as for `railyard worker`). The heavy modules are
imported inside the commands.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.cli.options import JsonFlag, ReaderOpt, TaskId, ThinkingOpt
from engine.cli.shell import Command, Group

if TYPE_CHECKING:
    from engine.runtime.flow import Flow


class CaseFormat(StrEnum):
    """The forms a case file may take: both plain text, for review in a pull request."""

    json = "json"
    yaml = "yaml"


eval_app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    help="Evaluation cases from the log: capture the model's view at a turn, run cases against a model.",
)


@eval_app.command("capture", cls=Command)
def capture(
    task_id: TaskId,
    state: Annotated[str, typer.Option("--state", help="The agent state whose last visit with a model turn to take.")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the case to this file (default: standard output).")
    ] = None,
    form: Annotated[
        CaseFormat | None,
        typer.Option("--format", help="json or yaml (default: yaml when --out ends in .yaml or .yml, else json)."),
    ] = None,
    reader: ReaderOpt = None,
) -> None:
    """Write the model's view when the task last entered STATE (and took a model turn there) as a case: its
    input and facts without identities, restricted or sensitive fields, the actions' schemas, and the action the
    model's accepted proposal named as the expected one."""
    from engine.cli import render
    from engine.cli.exits import fail, open_engine
    from engine.cli.tasks import reading
    from engine.core.errors import Code, RailyardError
    from engine.core.evals import accepted_answer, capture_point, case_of

    with open_engine() as engine:
        _caller, task_id = reading(engine, reader, task_id)
        events = engine.history(task_id)
        point = capture_point(events, state)
        if point is None:
            fail(RailyardError(f"task {task_id} took no model turn in {state!r}", code=Code.EVAL_INVALID, state=state))
        seq, expected = point
        then = engine.audit.as_of(task_id, seq)
        case = case_of(
            engine.definition_of(then),
            then,
            expected=expected,
            source={"task_id": task_id, "seq": seq},
            answer=accepted_answer(events, seq, state),
        )
    text = case_text(case, form or (CaseFormat.yaml if out is not None and _is_yaml(out) else CaseFormat.json))
    if out is None:
        render.text(text.rstrip("\n"))
    else:
        out.write_text(text, encoding="utf-8")
        render.note(f"case written to {out}")


@eval_app.command("generate", cls=Command)
def generate(
    workflow: Annotated[str, typer.Argument(help="The workflow whose state to derive cases for (its newest version).")],
    state: Annotated[str, typer.Option("--state", help="The agent state to derive cases for.")],
    base: Annotated[
        Path,
        typer.Option(
            "--from",
            help='A case of STATE whose "answer" (action and args) is right in its context: the cases start from it.',
            exists=True,
            dir_okay=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="The folder to write the cases to (made if missing).")],
) -> None:
    """Write adversarial cases of STATE, derived from its schemas and guards: free text that asks the model to
    leave out a required field, use an unknown enum value, add an extra field, copy an over-long text, or take an
    action not allowed here (each expecting the base's action at the first try); and facts changed until the
    guards refuse the base's answer, where the right answer is to ask for more information."""
    from engine.cli import render
    from engine.cli.exits import fail, registry
    from engine.core.adversarial import generate as derive
    from engine.core.errors import Code, RailyardError

    found = registry()
    case = _case_file(base)
    if not isinstance(case, dict):
        fail(RailyardError(f"{base} is not a railyard-eval/1 case", code=Code.EVAL_INVALID, path=str(base)))
    try:
        cases = derive(found.get(workflow), state, case, source=base.name)
    except RailyardError as error:
        fail(error)
    out.mkdir(parents=True, exist_ok=True)
    for name, generated in cases.items():
        (out / f"{name}.json").write_text(
            json.dumps(generated, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
    render.note(f"{len(cases)} cases written to {out}")


@eval_app.command("run", cls=Command)
def run(
    cases: Annotated[
        list[Path],
        typer.Argument(
            help="Case files, JSON or YAML (.yaml, .yml) (railyard eval capture, eval generate).",
            exists=True,
            dir_okay=False,
        ),
    ],
    model: Annotated[
        list[str],
        typer.Option("--model", help="scripted:PATH, openai:MODEL or anthropic:MODEL (repeat to compare models)."),
    ],
    version: Annotated[
        list[int] | None,
        typer.Option(
            "--version",
            min=1,
            help="Run against this version of each case's workflow (default: the newest; repeat to compare versions).",
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", help="A stored run (eval run --json) to compare with.", exists=True, dir_okay=False),
    ] = None,
    max_regression: Annotated[
        float | None,
        typer.Option(
            "--max-regression",
            min=0.0,
            max=1.0,
            help="A gate: exit 1 (EVAL_REGRESSION) when a model or version's share of expectations met, or of cases "
            "accepted at the first try, is lower than the baseline's by more than this (0.05: five points).",
        ),
    ] = None,
    thinking: ThinkingOpt = None,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Turns a case may take at most.")] = 20,
    quotas: Annotated[
        str | None,
        typer.Option(
            "--quotas",
            help="Model quotas, as for railyard worker --quotas: a JSON object of 'provider:model' to its limits (or"
            " @FILE), over the environment's and the profiles file's. The run's calls take their share of the quotas"
            " the workers on RAILYARD_DATABASE_URL share.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Put each case before each model through the real forcing ladder, schema checks and guards of the current
    definition (or of each --version), writing nothing to any task log and calling no tool: the action chosen,
    the rung and code of every turn, repairs, schema failures per field, tokens, seconds, and whether the case's
    expectation was met. With --baseline, each model's totals beside the stored run's; with --max-regression, a
    gate. Each call to a provider passes the flow control a worker's does: the breaker and quotas shared through
    the database (when RAILYARD_DATABASE_URL names one), a call short of quota waiting its turn, a provider's
    retry-after waited out."""
    from engine.cli import render
    from engine.cli.exits import fail, registry
    from engine.cli.options import parse_json, thinking_option
    from engine.core.errors import Code, RailyardError
    from engine.core.evals import expectation, regressions
    from engine.runtime.evals import run_case, totals
    from engine.runtime.models import open_model

    if max_regression is not None and baseline is None:
        raise typer.BadParameter("needs --baseline, the stored run to compare with", param_hint="--max-regression")
    given_quotas = parse_json(quotas, "--quotas")
    found = registry()
    loaded: list[tuple[str, dict[str, Any]]] = []
    for path in cases:
        case = _case_file(path)
        if not isinstance(case, dict) or not isinstance(case.get("workflow"), str):
            fail(RailyardError(f"{path} is not a railyard-eval/1 case", code=Code.EVAL_INVALID, path=str(path)))
        try:
            expectation(case)
        except RailyardError as error:
            fail(RailyardError(f"{path}: {error.message}", code=error.code, path=str(path)))
        loaded.append((path.name, case))
    stored: dict[str, Any] | None = None
    if baseline is not None:
        stored = _json_file(baseline)
        if not isinstance(stored, dict) or not isinstance(stored.get("models"), dict):
            fail(RailyardError(f"{baseline} is not a stored run (eval run --json)", code=Code.EVAL_INVALID))
    results = []
    try:
        with _flow_control(model, given_quotas) as flow:
            for spec in model:
                for wanted in [*version] if version else [None]:
                    for name, case in loaded:
                        definition = found.get(case["workflow"], wanted)
                        # A fresh adapter per case: a scripted model answers each case from its first turn.
                        adapter = open_model(spec)
                        results.append(
                            run_case(
                                definition,
                                case,
                                adapter,
                                name=name,
                                thinking=thinking_option(thinking),
                                max_turns=max_turns,
                                flow=flow,
                            )
                        )
        worse = regressions(stored["models"], totals(results), max_regression or 0.0) if stored is not None else []
    except RailyardError as error:
        fail(error)
    render.eval_results(results, as_json, baseline=None if stored is None else stored["models"])
    if worse and max_regression is not None:
        fail(
            RailyardError(
                f"worse than the baseline by more than {max_regression:.0%}: " + "; ".join(worse),
                code=Code.EVAL_REGRESSION,
                regressions=worse,
            )
        )


@contextmanager
def _flow_control(specs: list[str], quotas: dict[str, Any] | None) -> Iterator[Flow | None]:
    """The flow control a worker's model calls pass (`Engine.flow_control`): the breaker and quota rows every worker
    on RAILYARD_DATABASE_URL shares, with `quotas` (`--quotas`) over the environment's and the profiles file's.
    Without a database there, the same settings over rows in this process's memory (`memory://`): the run still
    keeps to the quotas and honours the provider's retry-after, shared with nobody. None when every model is
    scripted (no provider behind it: nothing to protect); the settings are checked all the same (CONFIG_INVALID)."""
    from engine.cli.exits import checked_database_url
    from engine.core.errors import RailyardError
    from engine.runtime.engine import Engine
    from engine.runtime.flow import flow_settings

    given = {"quotas": quotas} if quotas is not None else {}
    flow_settings(given)
    if all(spec.startswith("scripted:") for spec in specs):
        yield None
        return
    try:
        url = checked_database_url()
    except RailyardError:
        url = "memory://"  # no database there: rows in this process's memory
    with Engine(url) as engine:
        if given:
            engine.give_flow_settings(given)
        yield engine.flow_control()


def case_text(case: dict[str, Any], form: CaseFormat) -> str:
    """A case as its file holds it: JSON (two-space indent, keys sorted) or YAML (block style, keys sorted), each
    ending in a newline, unicode as it is."""
    if form is CaseFormat.yaml:
        import yaml

        return str(yaml.safe_dump(case, allow_unicode=True, sort_keys=True, default_flow_style=False, width=120))
    return json.dumps(case, ensure_ascii=False, indent=2, sort_keys=True) + "\n"


def _case_file(path: Path) -> Any:
    """A case file's content: YAML for a .yaml or .yml file, else JSON (None: it does not read as such)."""
    if not _is_yaml(path):
        return _json_file(path)
    import yaml

    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_json_like_loader())  # a SafeLoader
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None


def _is_yaml(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def _json_like_loader() -> Any:
    """PyYAML's safe loader without its implicit timestamps: a case's values are the JSON types, so an unquoted
    date in a hand-written case stays the string the JSON form would hold."""
    import yaml

    class JsonLike(yaml.SafeLoader):
        pass

    JsonLike.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return JsonLike


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
