"""The commands over tasks: start, show, history, fire, cancel, settle, migrate, run, status."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.cli import render
from engine.cli.exits import open_engine
from engine.cli.options import (
    JSON_SOURCES,
    ActorOpt,
    ExpectedSeq,
    ExtraBodyOpt,
    JsonFlag,
    ReaderOpt,
    ReasonOpt,
    RetriesOpt,
    StreamOpt,
    TaskId,
    ThinkingOpt,
    TimeoutOpt,
    VersionOpt,
    instant,
    model_options,
    parse_json,
    thinking_option,
)

# The runtime (and pydantic and SQLAlchemy under it) is imported by the commands that run: `railyard --help`
# loads this module only for the commands' signatures.
if TYPE_CHECKING:
    from engine.core.access import Caller
    from engine.core.events import Event
    from engine.runtime.engine import Engine

#: A worker not heard from for this long is not listed by `railyard status` (it reports every 10 s).
WORKER_SEEN_SECONDS = 60


def start(
    workflow: Annotated[str, typer.Argument(help="Workflow name.")],
    actor: ActorOpt,
    input_json: Annotated[str | None, typer.Option("--input", help="Task input: " + JSON_SOURCES + ".")] = None,
    version: VersionOpt = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="The tenant the task belongs to (default: the actor's, if it has one)."),
    ] = None,
    priority: Annotated[
        int | None,
        typer.Option(
            "--priority",
            help="Its place when model quota is short: higher goes first (default: its workflow's, else 0).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a task; prints its id."""
    from engine.runtime import shown

    payload = parse_json(input_json, "--input")
    with open_engine() as engine:
        task_id = engine.start(workflow, payload, actor=actor, version=version, tenant=tenant, priority=priority)
        view = shown.view(engine, engine.load(task_id), engine.caller(actor))
    render.started(view, as_json)


def reading(engine: Engine, reader: str | None, task_id: str) -> tuple[Caller | None, str]:
    """Whom a read is for (`--as`: that person; without it the trusted process, None) and the task id it names,
    resolved among the tasks they may read: one they may not is absent (TASK_NOT_FOUND), as on the API."""
    from engine.runtime import queries

    caller = engine.caller(reader) if reader is not None else None
    return caller, queries.resolve(engine, task_id, caller)


def show(
    task_id: TaskId,
    as_of: Annotated[
        str | None,
        typer.Option(
            "--as-of",
            help="SEQ, or a TIMESTAMP (ISO 8601, UTC unless it says): the state right after "
            "that event, or after the last event written at or before that time.",
        ),
    ] = None,
    reader: ReaderOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Where a task stands (or stood, with --as-of): state, seq, status, the triggers it allows."""
    from engine.core.budgets import token_totals
    from engine.runtime import queries, shown

    point: Event | None = None
    with open_engine() as engine:
        caller, task_id = reading(engine, reader, task_id)
        if as_of is None:
            view = queries.waiting_for_quota(engine, shown.view(engine, engine.load(task_id), caller))
        else:
            seq, at = _point(as_of)
            try:
                found = engine.audit.as_of_event(task_id, seq=seq, at=at)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--as-of") from None
            view, point = shown.view(engine, found.task, caller), found.event
        # What its model turns spent, up to the point shown.
        tokens = token_totals(e.data for e in engine.history(task_id) if point is None or e.seq <= point.seq)
    render.task(view, point, as_json, tokens)


def _point(text: str) -> tuple[int | None, datetime | None]:
    """`--as-of`: a seq (digits) or an instant."""
    if text.strip().isdigit():
        return int(text), None
    return None, instant(text, "--as-of")


def history(task_id: TaskId, reader: ReaderOpt = None, as_json: JsonFlag = False) -> None:
    """The task's timeline, one row per event; then the task that started it and those it started, with their
    states."""
    from engine.core.definition import SPAWN
    from engine.runtime import shown

    with open_engine() as engine:
        caller, task_id = reading(engine, reader, task_id)
        events = shown.events(engine, task_id, caller)
        tree = None
        if not as_json and (any(e.trigger == SPAWN for e in events) or (events and "parent" in events[0].data)):
            tree = shown.view(engine, engine.load(task_id), caller)
    render.history(task_id, events, as_json, tree)


def act(task_id: str, command: Callable[[Engine, str], Any], as_json: bool, actor: str) -> None:
    """Run a human command on the task `task_id` names (a whole id or a prefix of one) and print the task it
    leaves, as `actor` may see it (shared with `approvals` and `forks`)."""
    from engine.runtime import shown

    with open_engine() as engine:
        task = command(engine, engine.resolve_task_id(task_id))
        view = shown.view(engine, engine.load(task.task_id), engine.caller(actor))
    render.fired(view, as_json)


def fire(
    task_id: TaskId,
    trigger: Annotated[str, typer.Argument(help="Trigger the current state allows.")],
    actor: ActorOpt,
    payload: Annotated[str | None, typer.Option("--payload", help="Arguments: " + JSON_SOURCES + ".")] = None,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Fire a human or system trigger (approve, signal, ...) on a task."""
    args = parse_json(payload, "--payload")
    act(task_id, lambda e, t: e.fire(t, trigger, args, actor=actor, expected_seq=expected_seq), as_json, actor)


def cancel(
    task_id: TaskId,
    actor: ActorOpt,
    reason: ReasonOpt,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Cancel a task from any non-terminal state.

    While a write call is in flight (or its outcome is unknown) the cancel is recorded as a request and takes
    effect once the call's outcome is on record: `cancelled` if nothing happened, the workflow's review state
    if it did.
    """
    act(task_id, lambda e, t: e.cancel(t, actor=actor, reason=reason, expected_seq=expected_seq), as_json, actor)


def note(
    task_id: TaskId,
    text: Annotated[str, typer.Argument(help="The note, for colleagues (at most 2,000 characters).")],
    actor: ActorOpt,
    as_json: JsonFlag = False,
) -> None:
    """Add a note to a task: a `comment` event in its log, shown in its history and on its page.

    A note moves nothing and makes no pending decision stale. It reaches the model only when the workflow says
    so (`notes_to_model`). A task that ended takes no note (TASK_TERMINAL).
    """
    act(task_id, lambda e, t: e.note(t, actor, text), as_json, actor)


class SettledOutcome(StrEnum):
    executed = "executed"
    not_executed = "not_executed"


def settle(
    task_id: TaskId,
    outcome: Annotated[SettledOutcome, typer.Argument(help="What you verified: executed or not_executed.")],
    actor: ActorOpt,
    evidence: Annotated[
        str,
        typer.Option("--evidence", help="Where the verification can be checked (a ticket, the provider's reference)."),
    ],
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Record what you verified about a write whose outcome is unknown (the role the workflow names).

    `executed`: the effect happened; a retry then records it as succeeded without sending it. `not_executed`:
    it did not; only then may a retry send it again. With a cancel waiting, the task goes where it says.
    """
    act(
        task_id,
        lambda e, t: e.settle(t, actor=actor, outcome=outcome.value, evidence=evidence, expected_seq=expected_seq),
        as_json,
        actor,
    )


def migrate(
    task_id: TaskId,
    to_version: Annotated[int, typer.Option("--to-version", help="The version to move the task to.")],
    state_map: Annotated[
        list[str], typer.Option("--map", help="OLD=NEW: where a task in state OLD goes (repeat; only these move).")
    ],
    actor: ActorOpt,
    reason: ReasonOpt,
    as_json: JsonFlag = False,
) -> None:
    """Move an in-flight task to another version of its workflow; one `migrate` event records who and why."""
    mapping: dict[str, str] = {}
    for item in state_map:
        old, sep, new = item.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise typer.BadParameter(f"{item!r} is not OLD=NEW", param_hint="--map")
        mapping[old.strip()] = new.strip()
    act(task_id, lambda e, t: e.migrate(t, to_version, mapping, actor=actor, reason=reason), as_json, actor)


def run(
    task_id: TaskId,
    model: Annotated[
        str | None,
        typer.Option("--model", help="scripted:PATH, openai:MODEL or anthropic:MODEL (default: RAILYARD_MODEL)."),
    ] = None,
    thinking: ThinkingOpt = None,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Stop after this many model turns.")] = 50,
    timeout: TimeoutOpt = None,
    retries: RetriesOpt = None,
    stream: StreamOpt = None,
    extra_body: ExtraBodyOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Run model turns while the task is in an agent state; print each event they appended."""
    from engine.runtime import config, queries
    from engine.runtime.models import open_model

    settings = model_options(timeout, retries, stream, extra_body)
    with open_engine() as engine:
        # Without options, a model named only by RAILYARD_MODEL is opened if a turn needs it (Engine does).
        spec = model or (config.model_spec() if any(v is not None for v in settings.values()) else None)
        adapter = open_model(spec, settings) if spec else None
        task_id = engine.resolve_task_id(task_id)
        before = engine.get(task_id).seq
        task = engine.run(task_id, model=adapter, thinking=thinking_option(thinking), max_turns=max_turns)
        events = queries.events_after(engine, task_id, before)
        view = engine.get(task.task_id)
    render.ran(view, events, as_json)


def status(as_json: JsonFlag = False) -> None:
    """Tasks per workflow (runnable, leased, blocked, terminal; the oldest runnable's wait) and the live workers."""
    from engine.core.canonical import now
    from engine.core.worker_groups import shown_workers
    from engine.runtime import queries

    at = now()
    with open_engine() as engine:
        counts = queries.status_counts(engine, at)
        live = queries.workers(engine, at - timedelta(seconds=WORKER_SEEN_SECONDS))
        flow = queries.flow_status(engine)
    rows: dict[str, dict[str, Any]] = {}
    for c in counts:
        row = rows.setdefault(
            c["workflow"],
            {
                "workflow": c["workflow"],
                "runnable": 0,
                "leased": 0,
                "blocked": 0,
                "terminal": 0,
                "oldest_runnable_seconds": None,
            },
        )
        row[c["status"]] = c["tasks"]
        row["leased"] += c["leased"]
        if c["status"] == "runnable" and c["oldest_due"] is not None:
            row["oldest_runnable_seconds"] = max(0.0, round((at - c["oldest_due"]).total_seconds(), 3))
    workers = shown_workers(live, at)
    render.status(list(rows.values()), workers, as_json, flow)
