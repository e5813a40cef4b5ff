"""The `railyard` command line (Typer + Rich).

Exit codes are a contract: 0 ok, 1 a domain refusal (its code printed),
2 a usage error, 3 an audit finding. Every read command takes `--json`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from engine.core.canonical import format_instant, parse_instant
from engine.core.errors import Category, Code, RailyardError, Refused
from engine.core.events import Event
from engine.core.payloads import event_code
from engine.core.replay import ReplayReport
from engine.core.summary import summarise
from engine.runtime import config
from engine.runtime.engine import Engine
from engine.runtime.registry import Registry

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_AUDIT = 3
#: How wide `history` prints its table when the output is not a terminal.
HISTORY_WIDTH = 160

#: A worker not heard from for this long is not listed by `railyard status` (it reports every 10 s).
WORKER_SEEN_SECONDS = 60

#: Codes that report a broken log rather than a refused request: exit 3.
AUDIT_CODES = frozenset(code for code in Code if code.category is Category.INTEGRITY)

#: Codes that say the process is set up wrong, not that the request was refused: exit 2, like a usage error.
CONFIG_CODES = frozenset(code for code in Code if code.category is Category.CONFIG)

app = typer.Typer(
    name="railyard",
    help="Run LLM agent tasks as explicit, versioned state machines over a hash-chained event log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

out = Console()
# soft_wrap: a refusal stays on one line (`CODE: message`) however narrow the terminal, for scripts.
err = Console(stderr=True, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ActorOpt = Annotated[str, typer.Option("--as", help="The actor making the change (recorded in the log).")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded in the log).")]
#: A human command names the seq it was decided on; without it, it is decided on the task as read when it runs.
ExpectedSeq = Annotated[
    int | None, typer.Option("--expected-seq", help="Refuse (CONCURRENCY_CONFLICT) if the task moved past this seq.")
]
#: What `replay` and `export` read: one TASK, or --all of them narrowed by --workflow and --since.
OneTask = Annotated[str | None, typer.Argument(help="Task id (or --all).")]
AllTasks = Annotated[bool, typer.Option("--all", help="Every task, streamed.")]
OnlyWorkflow = Annotated[str | None, typer.Option("--workflow", help="With --all: only this workflow.")]
ChangedSince = Annotated[
    str | None, typer.Option("--since", help="With --all: only tasks changed at or after this date (ISO 8601).")
]


class GraphFormat(StrEnum):
    mermaid = "mermaid"
    dot = "dot"


def main() -> None:
    """Console-script entry point."""
    # Like `python -m`, let RAILYARD_WORKFLOWS name modules in the directory the user is in.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app()


# -- plumbing -------------------------------------------------------------
def _fail(error: RailyardError) -> NoReturn:
    err.print(f"[bold red]{error.code}[/]: {error.message}", highlight=False, markup=True)
    if error.code in AUDIT_CODES:
        raise typer.Exit(EXIT_AUDIT)
    raise typer.Exit(EXIT_USAGE if error.code in CONFIG_CODES else EXIT_REFUSED)


@contextmanager
def _engine() -> Iterator[Engine]:
    try:
        with Engine(config.database_url()) as engine:
            yield engine
    except RailyardError as error:
        _fail(error)


def _parse_json(value: str | None, option: str) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc.msg}", param_hint=option) from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return parsed


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def history_table(events: Iterable[Event], title: str | None = None) -> Table:
    """The timeline as a Rich table (seq, time, actor, from, trigger, to, code, a summary of the data)."""
    table = Table(title=title, show_lines=False)
    for column in ("seq", "at (UTC)", "actor", "from", "trigger", "to", "code", "data"):
        table.add_column(column, overflow="fold", no_wrap=column in ("seq", "at (UTC)", "trigger", "code"))
    for ev in events:
        table.add_row(
            str(ev.seq),
            ev.at.strftime("%Y-%m-%d %H:%M:%S"),
            ev.actor,
            ev.from_state or "",
            ev.trigger,
            ev.to_state,
            event_code(ev.data) or "",
            summarise(ev, 60),
        )
    return table


# -- commands -------------------------------------------------------------
@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Create or migrate the schema of RAILYARD_DATABASE_URL to REVISION (default: head)."""
    from engine.store import migrations

    url = config.database_url()
    migrations.upgrade(url, revision)
    out.print(f"database at revision {migrations.current(url)}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="Target revision ('base' drops everything).")]) -> None:
    """Migrate the schema down to REVISION."""
    from engine.store import migrations

    url = config.database_url()
    migrations.downgrade(url, revision)
    out.print(f"database at revision {migrations.current(url) or 'base'}")


@db_app.command("current")
def db_current(as_json: JsonFlag = False) -> None:
    """Print the schema revision the database is at."""
    from engine.store import migrations

    revision = migrations.current(config.database_url())
    if as_json:
        _print_json({"revision": revision})
    else:
        out.print(revision or "base (empty)")


@app.command("workflows")
def workflows(as_json: JsonFlag = False) -> None:
    """List the workflow definitions the code defines (RAILYARD_WORKFLOWS), every version."""
    try:
        registry = Registry.from_env()
    except RailyardError as error:
        _fail(error)
    rows: list[dict[str, Any]] = [
        {
            "workflow": wf.name,
            "version": wf.version,
            "digest": wf.digest,
            "initial": wf.initial_state,
            "states": len(wf.states),
            "description": wf.description,
        }
        for wf in registry
    ]
    if as_json:
        _print_json(rows)
        return
    table = Table(title="Workflows")
    for column in ("workflow", "version", "states", "initial", "digest", "description"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["workflow"], str(r["version"]), str(r["states"]), r["initial"], r["digest"][:12], r["description"]
        )
    out.print(table)


@app.command("start")
def start(
    workflow: Annotated[str, typer.Argument(help="Workflow name.")],
    actor: ActorOpt,
    input_json: Annotated[str | None, typer.Option("--input", help="Task input as a JSON object.")] = None,
    version: Annotated[int | None, typer.Option("--version", help="Version (default: newest).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a task; prints its id."""
    payload = _parse_json(input_json, "--input")
    with _engine() as engine:
        task_id = engine.start(workflow, payload, actor=actor, version=version)
        view = engine.get(task_id)
    if as_json:
        _print_json(view.to_dict())
    else:
        out.print(task_id)


@app.command("show")
def show(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    as_of: Annotated[
        str | None,
        typer.Option(
            "--as-of",
            help="SEQ, or a TIMESTAMP (ISO 8601, UTC unless it says): the state right after "
            "that event, or after the last event written at or before that time.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Where a task stands (or stood, with --as-of): state, seq, status, the triggers it allows."""
    point: Event | None = None
    with _engine() as engine:
        if as_of is None:
            view = engine.get(task_id)
        else:
            seq, at = _point(as_of)
            try:
                found = engine.as_of_event(task_id, seq=seq, at=at)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint="--as-of") from None
            view, point = engine.view(found.task), found.event
    if as_json:
        shown = view.to_dict()
        if point is not None:
            shown["as_of"] = {
                "seq": point.seq,
                "at": format_instant(point.at),
                "actor": point.actor,
                "trigger": point.trigger,
            }
        _print_json(shown)
        return
    title = f"task {view.task_id}" + (f" as of seq {point.seq}" if point is not None else "")
    table = Table(show_header=False, title=title)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    if point is not None:
        table.add_row(
            "as of",
            f"seq {point.seq}: {point.trigger} by {point.actor} at {point.at.strftime('%Y-%m-%d %H:%M:%S')} UTC",
        )
    table.add_row("workflow", f"{view.workflow}@{view.version}")
    table.add_row("state", f"{view.state} ({view.kind})")
    table.add_row("status", view.status)
    table.add_row("seq", str(view.seq))
    table.add_row("allowed", ", ".join(view.allowed) or "(none: terminal)")
    if view.unsettled is not None:
        u = view.unsettled
        table.add_row(
            "write open",
            f"{u['tool']} action {u['action_id']}: {u['status']} (recorded in "
            f"{u['state']}; the task cannot end until its outcome is settled)",
        )
    if view.cancel_requested is not None:
        c = view.cancel_requested
        table.add_row(
            "cancel requested",
            f"by {c['actor']} at seq {c['seq']} ({c['reason']}): takes effect when the write's outcome is recorded",
        )
    table.add_row("input", json.dumps(view.input, ensure_ascii=False))
    if point is not None:
        table.add_row("facts", json.dumps(view.facts, ensure_ascii=False))
    out.print(table)


def _point(text: str) -> tuple[int | None, datetime | None]:
    """`--as-of`: a seq (digits) or an instant."""
    if text.strip().isdigit():
        return int(text), None
    return None, _instant_option(text, "--as-of")


def _instant_option(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 date or time from the command line; without a zone it is UTC."""
    if text is None:
        return None
    try:
        return parse_instant(text.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a seq nor an ISO 8601 date or time", param_hint=option) from None


@app.command("history")
def history(task_id: Annotated[str, typer.Argument(help="Task id.")], as_json: JsonFlag = False) -> None:
    """The task's timeline, one row per event."""
    with _engine() as engine:
        events = engine.history(task_id)
    if as_json:
        _print_json([e.to_dict() for e in events])
    else:
        # Piped or redirected, the timeline is not cut to 80 columns: it is read in files and pagers.
        wide = out if out.is_terminal else Console(width=max(out.width, HISTORY_WIDTH))
        wide.print(history_table(events, title=f"history of {task_id}"))


def _fire_command(fire: Callable[[Engine], Any], as_json: bool) -> None:
    with _engine() as engine:
        task = fire(engine)
        view = engine.get(task.task_id)
    if as_json:
        _print_json(view.to_dict())
        return
    out.print(f"{view.task_id}: {view.state} (seq {view.seq}, {view.status})")
    if view.cancel_requested is not None and view.unsettled is not None:
        # Not applied yet, and not lost: say so, or a person who just cancelled sees the task still running.
        write = view.unsettled
        out.print(
            f"cancel requested by {view.cancel_requested['actor']}: it takes effect once the outcome of "
            f"{write['tool']} (action {write['action_id']}, {write['status']}) is on record",
            highlight=False,
        )


@app.command("fire")
def fire(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    trigger: Annotated[str, typer.Argument(help="Trigger the current state allows.")],
    actor: ActorOpt,
    payload: Annotated[str | None, typer.Option("--payload", help="Arguments as a JSON object.")] = None,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Fire a human or system trigger (approve, signal, ...) on a task."""
    args = _parse_json(payload, "--payload")
    _fire_command(lambda e: e.fire(task_id, trigger, args, actor=actor, expected_seq=expected_seq), as_json)


@app.command("cancel")
def cancel(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
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
    _fire_command(lambda e: e.cancel(task_id, actor=actor, reason=reason, expected_seq=expected_seq), as_json)


class SettledOutcome(StrEnum):
    executed = "executed"
    not_executed = "not_executed"


@app.command("settle")
def settle(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
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
    _fire_command(
        lambda e: e.settle(task_id, actor=actor, outcome=outcome.value, evidence=evidence, expected_seq=expected_seq),
        as_json,
    )


@app.command("migrate")
def migrate(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
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
    _fire_command(lambda e: e.migrate(task_id, to_version, mapping, actor=actor, reason=reason), as_json)


@app.command("approvals")
def approvals(
    role: Annotated[str | None, typer.Option("--role", help="Only decisions this role may take.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Tasks waiting for a human decision, with the prepared call each one would approve."""
    with _engine() as engine:
        pending = engine.approvals(role=role)
    if as_json:
        _print_json(pending)
        return
    table = Table(title="Pending approvals")
    for column in ("task", "workflow", "state", "role", "started by", "prepared call", "digest"):
        table.add_column(column, overflow="fold")
    for p in pending:
        prepared = p["prepared"] or {}
        call = f"{prepared.get('tool')} {json.dumps(prepared.get('arguments'), ensure_ascii=False)}" if prepared else ""
        table.add_row(
            p["task_id"], p["workflow"], p["state"], p["role"], p["started_by"], call, (p["digest"] or "")[:16]
        )
    out.print(table)


@app.command("approve")
def approve(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    actor: ActorOpt,
    digest: Annotated[
        str | None,
        typer.Option("--digest", help="Digest of the prepared call you reviewed (railyard approvals shows it)."),
    ] = None,
    comment: Annotated[str, typer.Option("--comment", help="Recorded with the decision.")] = "",
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve the prepared call a task is waiting on. Without --digest, the one shown now is approved."""

    def decide_now(engine: Engine) -> Any:
        named, seen = digest, expected_seq
        if named is None:
            task = engine.load(task_id)
            prepared = task.prepared
            named = prepared["digest"] if prepared else None
            # Approving what was just shown: decided on that seq, so nothing that changed since is approved.
            seen = task.seq if seen is None else seen
            if prepared:
                err.print(f"approving prepared call {prepared['tool']} (digest {str(named)[:16]})", highlight=False)
        return engine.approve(task_id, actor=actor, prepared_digest=named, comment=comment, expected_seq=seen)

    _fire_command(decide_now, as_json)


@app.command("reject")
def reject(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    actor: ActorOpt,
    reason: ReasonOpt,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject the decision a task is waiting on."""
    _fire_command(lambda e: e.reject(task_id, actor=actor, reason=reason, expected_seq=expected_seq), as_json)


@app.command("worker")
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Tasks held at once (threads).")] = 4,
    once: Annotated[bool, typer.Option("--once", help="Claim one batch, advance it, exit.")] = False,
    workflows: Annotated[
        str | None, typer.Option("--workflows", help="Only these workflows (comma-separated names).")
    ] = None,
    lease_seconds: Annotated[float, typer.Option("--lease-seconds", min=1, help="Lease length.")] = 30.0,
    model: Annotated[
        str | None, typer.Option("--model", help="scripted:PATH, openai:MODEL or anthropic:MODEL (RAILYARD_MODEL).")
    ] = None,
    grace_seconds: Annotated[
        float, typer.Option("--grace-seconds", min=0, help="After SIGTERM/SIGINT, how long the tasks in hand get.")
    ] = 30.0,
    report_seconds: Annotated[
        float, typer.Option("--report-seconds", min=0.1, help="How often counts are logged and reported.")
    ] = 10.0,
) -> None:
    """Claim due tasks, advance each until it blocks or ends, release it; until SIGTERM or SIGINT.

    The first signal stops claiming, lets each task in hand finish its current
    step and hands it back (released, still due: another worker takes it at
    once); a second signal, or the end of the grace period, exits at once. The
    log stays consistent either way: every append is atomic, and a task left
    mid-step is resumed by the next worker when its lease expires.
    """
    import signal
    import threading

    from engine.providers import adapter_from_spec
    from engine.runtime.worker import Worker

    runner: Worker | None = None
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            os._exit(128 + signum)
        stopping.set()
        if runner is not None:
            runner.stop()
        err.print(f"stopping: finishing the steps in hand (at most {grace_seconds:.0f} s)", highlight=False)
        timer = threading.Timer(grace_seconds, lambda: os._exit(128 + signum))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # One line per transition and the worker's own notes, on stderr, for the operator's log pipeline.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for name in ("railyard.transitions", "railyard.worker"):
        logging.getLogger(name).setLevel(logging.INFO)
    with _engine() as engine:
        try:
            adapter = adapter_from_spec(model) if model else None
        except RailyardError as error:
            _fail(error)
        names = [w.strip() for w in workflows.split(",") if w.strip()] if workflows else None
        runner = Worker(
            engine,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            workflows=names,
            model=adapter,
            report_seconds=report_seconds,
        )
        try:
            runner.check_configuration()
            if runner.model is None and config.model_spec() is not None:
                runner.model = engine.model = adapter_from_spec(str(config.model_spec()))  # a bad spec: exit 2 now
        except RailyardError as error:
            _fail(error)
        listening = "LISTEN/NOTIFY and polling" if runner.listen else "polling"
        err.print(
            f"{runner.name}: claiming (concurrency {concurrency}, lease {lease_seconds:.0f} s, {listening})",
            highlight=False,
        )
        if once:
            runner.run_once()
        else:
            runner.run(stopping)
    counts = runner.counts.snapshot()
    err.print(f"{runner.name}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()), highlight=False)


@app.command("status")
def status(as_json: JsonFlag = False) -> None:
    """Tasks per workflow (runnable, leased, blocked, terminal; the oldest runnable's wait) and the live workers."""
    from engine.core.canonical import now

    at = now()
    with _engine() as engine:
        counts = engine.store.status_counts(at)
        live = engine.store.workers(seen_since=at - timedelta(seconds=WORKER_SEEN_SECONDS))
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
    workers = [
        {
            "name": w.name,
            "host": w.host,
            "pid": w.pid,
            "concurrency": w.concurrency,
            "seen_seconds_ago": round((at - w.seen_at).total_seconds(), 1),
            **w.counts,
        }
        for w in live
    ]
    if as_json:
        _print_json({"workflows": list(rows.values()), "workers": workers})
        return
    table = Table(title="Tasks")
    for column in ("workflow", "runnable", "leased", "blocked", "terminal", "oldest runnable"):
        table.add_column(column)
    for r in rows.values():
        age = r["oldest_runnable_seconds"]
        table.add_row(
            r["workflow"],
            str(r["runnable"]),
            str(r["leased"]),
            str(r["blocked"]),
            str(r["terminal"]),
            "" if age is None else f"{age:.0f} s",
        )
    out.print(table)
    if workers:
        table = Table(title="Workers")
        for column in (
            "worker",
            "seen",
            "claimed",
            "transitions",
            "conflicts",
            "lease losses",
            "failures",
            "claim p99",
        ):
            table.add_column(column)
        for w in workers:
            p99 = w.get("claim_latency_p99_ms")
            table.add_row(
                w["name"],
                f"{w['seen_seconds_ago']:.0f} s ago",
                str(w["claimed"]),
                str(w["transitions"]),
                str(w["conflicts"]),
                str(w["lease_losses"]),
                str(w["failures"]),
                "" if p99 is None else f"{p99:.0f} ms",
            )
        out.print(table)


@app.command("graph")
def graph(
    workflow: Annotated[str, typer.Argument(help="Workflow name.")],
    version: Annotated[int | None, typer.Option("--version", help="Version (default: newest).")] = None,
    fmt: Annotated[GraphFormat, typer.Option("--format", help="Diagram language.")] = GraphFormat.mermaid,
    task_id: Annotated[
        str | None,
        typer.Option("--task", help="Highlight the path this task took (its version), with visit counts on edges."),
    ] = None,
) -> None:
    """Print the workflow's state diagram (Mermaid or Graphviz dot), optionally with one task's route on it."""
    if task_id is None:
        try:
            definition = Registry.from_env().get(workflow, version)
        except RailyardError as error:
            _fail(error)
        sys.stdout.write(definition.machine.graph(fmt.value) + "\n")
        return
    with _engine() as engine:
        row, visits, current = engine.path(task_id)
        if row.workflow != workflow:
            raise typer.BadParameter(f"task {task_id} is a {row.workflow} task, not {workflow}", param_hint="--task")
        if version is not None and version != row.version:
            raise typer.BadParameter(f"task {task_id} is on version {row.version}", param_hint="--version")
        definition = engine.registry.get(workflow, row.version)
    sys.stdout.write(definition.machine.graph(fmt.value, current=current, visits=visits) + "\n")


def _one_or_all(task_id: str | None, all_tasks: bool, *scoped: tuple[str, object]) -> None:
    """TASK and --all exclude each other; --workflow and --since only narrow --all."""
    if (task_id is None) == (not all_tasks):
        raise typer.BadParameter("give a TASK or --all (not both)")
    for option, value in scoped:
        if task_id is not None and value is not None:
            raise typer.BadParameter(f"{option} goes with --all, not with a TASK", param_hint=option)


def _finding_lines(report: ReplayReport) -> None:
    where = f"task {report.task_id}" if report.task_id else "the file"
    for f in report.findings:  # one line per finding, however narrow the terminal: scripts grep these
        out.print(f"{where}  {f.code}  seq {f.seq}  {f.message}", highlight=False, markup=False, soft_wrap=True)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _audit_totals(reports: Iterable[ReplayReport], as_json: bool, verb: str) -> bool:
    """Print each report with findings as it arrives, then the totals; True if any finding.

    `--json` streams one object: `reports` (only those with findings), then the counts,
    so a run over a million tasks never holds its reports in memory.
    """
    tasks = events = findings = failed = 0
    if as_json:
        sys.stdout.write('{"reports": [')
    for report in reports:
        if report.task_id:
            tasks += 1
            events += report.events
        if report.ok:
            continue
        findings += len(report.findings)
        failed += 1
        if as_json:
            sys.stdout.write(("" if failed == 1 else ", ") + json.dumps(report.to_dict(), ensure_ascii=False))
        else:
            _finding_lines(report)
    if as_json:
        sys.stdout.write(
            f'], "tasks": {tasks}, "events": {events}, "findings": {findings}, "ok": {json.dumps(findings == 0)}}}\n'
        )
    else:
        outcome = "no findings" if not findings else f"{_count(findings, 'finding')} in {_count(failed, 'report')}"
        out.print(f"{verb} {_count(tasks, 'task')}, {_count(events, 'event')}: {outcome}", highlight=False)
    return findings > 0


@app.command("replay")
def replay(
    task_id: OneTask = None,
    all_tasks: AllTasks = False,
    workflow: OnlyWorkflow = None,
    since: ChangedSince = None,
    jobs: Annotated[
        int, typer.Option("--jobs", min=0, help="Processes that check (0: one per CPU available; 1: this one only).")
    ] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Check task logs without calling any model or tool: hash chain, seq, legal transitions, row and snapshots.

    Exit 3 when anything is found (each finding has a stable code), 0 when the logs prove their state.
    """
    from engine.audit.parallel import available_jobs

    _one_or_all(task_id, all_tasks, ("--workflow", workflow), ("--since", since))
    since_at = _instant_option(since, "--since")
    jobs = jobs or available_jobs()
    with _engine() as engine:
        if task_id is not None:
            report = engine.replay(task_id, jobs=jobs)
            if as_json:
                _print_json(report.to_dict())
            elif report.ok:
                out.print(
                    f"task {task_id} ({report.workflow}): {_count(report.events, 'event')}, no findings",
                    highlight=False,
                )
            else:
                _finding_lines(report)
                out.print(
                    f"task {task_id} ({report.workflow}): {_count(report.events, 'event')}, "
                    f"{_count(len(report.findings), 'finding')}",
                    highlight=False,
                )
            found = not report.ok
        else:
            found = _audit_totals(engine.replay_all(workflow=workflow, since=since_at, jobs=jobs), as_json, "replayed")
    if found:
        raise typer.Exit(EXIT_AUDIT)


@app.command("export")
def export(
    task_id: OneTask = None,
    all_tasks: AllTasks = False,
    workflow: OnlyWorkflow = None,
    since: ChangedSince = None,
) -> None:
    """Write task logs to stdout as JSON Lines (railyard-export/1) for `verify-export` and auditors' tools."""
    from engine.audit.export import export_lines

    _one_or_all(task_id, all_tasks, ("--workflow", workflow), ("--since", since))
    since_at = _instant_option(since, "--since")
    sink = sys.stdout.buffer
    with _engine() as engine:
        if task_id is not None and engine.store.row(task_id) is None:
            _fail(Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id))
        items = engine.logs(None if task_id is None else [task_id], workflow=workflow, since=since_at)
        for line in export_lines(items):
            sink.write(line.encode("utf-8"))
    sink.flush()


@app.command("verify-export")
def verify_export_command(
    path: Annotated[
        Path,
        typer.Argument(help="An export file (railyard export ... > FILE).", exists=True, dir_okay=False, readable=True),
    ],
    as_json: JsonFlag = False,
) -> None:
    """Check an export offline, with only the file and the workflow definitions (RAILYARD_WORKFLOWS).

    Every hash, the chain, seq, each transition's legality and each task's final state. Exit 3 on any finding.
    """
    from engine.audit.export import verify_export

    try:
        registry = Registry.from_env()
    except RailyardError as error:
        _fail(error)
    with path.open("rb") as lines:
        found = _audit_totals(verify_export(lines, registry.find), as_json, "verified")
    if found:
        raise typer.Exit(EXIT_AUDIT)


@app.command("archive")
def archive(
    before: Annotated[str, typer.Option("--before", help="Archive tasks that ended before this date (ISO 8601).")],
    batch: Annotated[int, typer.Option("--batch", min=1, help="Tasks per archive file.")] = 500,
    as_json: JsonFlag = False,
) -> None:
    """Move ended tasks' events to JSON Lines files in RAILYARD_ARCHIVE_DIR, verified before anything is deleted.

    Each task keeps its row as a tombstone naming its file and the file's sha256;
    `show`, `history` and `replay` read archived tasks from their file.
    """
    cutoff = _instant_option(before, "--before")
    assert cutoff is not None
    with _engine() as engine:
        try:
            done = engine.archive(cutoff, batch=batch)
        except RailyardError as error:
            _fail(error)
        directory = str(engine.archive_dir)
    if as_json:
        _print_json({"directory": directory, "files": done.files, "tasks": done.tasks, "events": done.events})
        return
    out.print(
        f"archived {_count(done.tasks, 'task')} ({_count(done.events, 'event')}) to "
        f"{_count(len(done.files), 'file')} in {directory}" + "".join(f"\n  {name}" for name in done.files),
        highlight=False,
    )


@app.command("run")
def run(
    task_id: Annotated[str, typer.Argument(help="Task id.")],
    model: Annotated[
        str | None,
        typer.Option("--model", help="scripted:PATH, openai:MODEL or anthropic:MODEL (default: RAILYARD_MODEL)."),
    ] = None,
    thinking: Annotated[bool, typer.Option("--thinking", help="Ask the model to think (reasoning on).")] = False,
    max_turns: Annotated[int, typer.Option("--max-turns", min=1, help="Stop after this many model turns.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Run model turns while the task is in an agent state; print each event they appended."""
    from engine.providers import adapter_from_spec

    with _engine() as engine:
        adapter = adapter_from_spec(model) if model else None
        before = engine.get(task_id).seq
        task = engine.run(task_id, model=adapter, thinking=thinking, max_turns=max_turns)
        events = engine.store.events(task_id, after_seq=before)
        view = engine.get(task.task_id)
    if as_json:
        _print_json({"task": view.to_dict(), "events": [e.to_dict() for e in events]})
        return
    for ev in events:
        code = event_code(ev.data)
        out.print(
            f"{ev.seq}  {ev.from_state} --{ev.trigger}--> {ev.to_state}  {summarise(ev, 80)}"
            + (f"  {code}" if code else ""),
            highlight=False,
            markup=False,
        )
    out.print(f"{view.task_id}: {view.state} (seq {view.seq}, {view.status})")


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8080,
) -> None:
    """Serve the HTTP API and the back-office pages (bearer tokens from RAILYARD_TOKENS_FILE; see docs/api.md)."""
    from engine.api.serve import serve as run_server

    try:
        run_server(host, port)
    except RailyardError as error:
        _fail(error)


@app.command("providers")
def providers(as_json: JsonFlag = False) -> None:
    """The capability profiles and the forcing rung each gets, with thinking off and on."""
    from engine.core.forcing import rung_table
    from engine.core.profiles import load_profiles

    try:
        rows = rung_table(load_profiles())
    except RailyardError as error:
        _fail(error)
    if as_json:
        _print_json(rows)
        return
    table = Table(title="Capability profiles (rung: several actions / one action)")
    for column in (
        "profile",
        "wire",
        "native schema",
        "tool_choice (thinking off)",
        "tool_choice (thinking on)",
        "rung, thinking off",
        "rung, thinking on",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["name"],
            r["wire"],
            r["native_schema"],
            ", ".join(r["tool_choice_thinking_off"]) or "(not sent)",
            ", ".join(r["tool_choice_thinking_on"]) or "(not sent)",
            f"{r['rung_thinking_off']} / {r['rung_thinking_off_one_action']}",
            f"{r['rung_thinking_on']} / {r['rung_thinking_on_one_action']}",
        )
    out.print(table)


@app.command("demo")
def demo(
    model: Annotated[
        str | None, typer.Option("--model", help="openai:MODEL or anthropic:MODEL instead of the scripted answers.")
    ] = None,
) -> None:
    """Run the reference workflows' three scenarios on RAILYARD_DATABASE_URL, step by step, then replay them."""
    from workflows.demo import run_demo

    try:
        run_demo(config.database_url(), out, model=model)
    except RailyardError as error:
        _fail(error)
