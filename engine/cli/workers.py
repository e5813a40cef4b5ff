"""The long-running commands: `worker` (claims and advances due tasks) and `serve` (the HTTP API and pages)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.cli import render
from engine.cli.exits import database_url, fail, open_engine, require_schema
from engine.cli.options import (
    ExtraBodyOpt,
    RetriesOpt,
    StreamOpt,
    ThinkingOpt,
    TimeoutOpt,
    model_options,
    parse_json,
    thinking_option,
)
from engine.core.errors import Code, RailyardError

if TYPE_CHECKING:  # the runtime is imported when a command runs, not for `railyard --help`
    from engine.runtime.engine import Engine
    from engine.runtime.worker import Worker


def worker(
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, help="Tasks held at once by each process (coroutines on its event loop)."),
    ] = 4,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=1,
            help="Worker processes under one supervisor, which starts again one that dies (default: the number of"
            " cores; 1 with --once).",
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="Advance every task that is due now (--concurrency at a time), then exit 0: for cron. A task that"
            " comes due later is left for the next run.",
        ),
    ] = False,
    max_tasks: Annotated[
        int | None, typer.Option("--max-tasks", min=1, help="With --once: claim at most this many tasks, then exit.")
    ] = None,
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
    checkpoint_minutes: Annotated[
        float | None,
        typer.Option(
            "--checkpoint-minutes",
            min=0.01,
            help="Also sign a checkpoint of every head this often (RAILYARD_SIGNING_KEY, RAILYARD_CHECKPOINT_DIR).",
        ),
    ] = None,
    timeout: TimeoutOpt = None,
    retries: RetriesOpt = None,
    stream: StreamOpt = None,
    extra_body: ExtraBodyOpt = None,
    thinking: ThinkingOpt = None,
    quotas: Annotated[
        str | None,
        typer.Option(
            "--quotas",
            help="Model quotas every worker honours, as RAILYARD_QUOTAS: a JSON object of 'provider:model' to its"
            ' limits, e.g. \'{"openai:gpt-4.1": {"requests_per_minute": 500}}\' (or @FILE); an entry'
            " given here replaces the environment's and the file's.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics on this port at /metrics (interface: RAILYARD_METRICS_HOST, 127.0.0.1);"
            " with --processes N, process i on this port + i.",
        ),
    ] = None,
    supervised: Annotated[
        str | None, typer.Option("--supervised", hidden=True, help="SUPERVISOR,INDEX,RESTARTS: a supervisor's child.")
    ] = None,
) -> None:
    """Claim due tasks, advance each until it blocks or ends, release it; until SIGTERM or SIGINT.

    --processes N (default: one per core) runs N worker processes, each
    its own event loop and connections, under one supervisor that starts
    again a process that dies; `railyard status` shows them as one worker.

    The first signal stops claiming, lets each task in hand finish its current
    step and hands it back (released, still due: another worker takes it at
    once); a second signal, or the end of the grace period, exits at once. The
    log stays consistent either way: every append is atomic, and a task left
    mid-step is resumed by the next worker when its lease expires.

    With --once (for cron): every task due now is advanced, --concurrency at
    a time, until a claim finds none due (or --max-tasks were claimed); then
    the worker exits 0.
    """
    import signal
    import threading

    if max_tasks is not None and not once:
        raise typer.BadParameter("only with --once: a worker without it runs until stopped", param_hint="--max-tasks")
    if once and processes is not None and processes > 1:
        raise typer.BadParameter("--once drains in one process", param_hint="--processes")
    count = 1 if once or supervised is not None else processes if processes is not None else available_cores()
    require_schema(database_url())  # a worker logs what fails on a claim and carries on: not for this
    settings = model_options(timeout, retries, stream, extra_body)
    given_quotas = parse_json(quotas, "--quotas")
    names = [w.strip() for w in workflows.split(",") if w.strip()] if workflows else None
    # One line per transition and the worker's own notes, on stderr, for the operator's log pipeline.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for logger in ("railyard.transitions", "railyard.worker"):
        logging.getLogger(logger).setLevel(logging.INFO)
    if count > 1:
        _supervise(
            count,
            concurrency=concurrency,
            workflows=names,
            lease_seconds=lease_seconds,
            model=model,
            settings=settings,
            thinking=thinking_option(thinking),
            quotas=given_quotas,
            grace_seconds=grace_seconds,
            report_seconds=report_seconds,
            checkpoint_minutes=checkpoint_minutes,
            metrics_port=metrics_port,
        )
        return

    from engine.runtime.supervisor import child_name

    runner: Worker | None = None
    stopping = threading.Event()

    def drain(signum: int) -> None:
        stopping.set()
        if runner is not None:
            runner.stop()
        render.note(f"stopping: finishing the steps in hand (at most {grace_seconds:.0f} s)")
        timer = threading.Timer(grace_seconds, lambda: os._exit(128 + signum))
        timer.daemon = True
        timer.start()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            os._exit(128 + signum)
        drain(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    name: str | None = None
    identity: dict[str, object] | None = None
    if supervised is not None:
        supervisor, index, restarts = _supervised(supervised)
        name = child_name(supervisor, index, restarts)
        identity = {"name": supervisor, "pid": os.getppid(), "process": index, "restarts": restarts}
        _watch_supervisor(lambda: None if stopping.is_set() else drain(signal.SIGTERM))
    with open_engine() as engine:
        runner = _checked_worker(
            engine,
            name=name,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            workflows=names,
            model=model,
            settings=settings,
            quotas=given_quotas,
            thinking=thinking_option(thinking),
            report_seconds=report_seconds,
            checkpoint_seconds=checkpoint_minutes * 60 if checkpoint_minutes is not None else None,
            supervisor=identity,
        )
        if stopping.is_set():  # told to stop while it started
            runner.stop()
        stop_metrics = _serve_metrics(engine, metrics_port) if metrics_port is not None else None
        listening = "LISTEN/NOTIFY and polling" if runner.listen else "polling"
        render.note(f"{runner.name}: claiming (concurrency {concurrency}, lease {lease_seconds:.0f} s, {listening})")
        if once:
            runner.drain(max_tasks)
        else:
            runner.run(stopping)
        if stop_metrics is not None:
            stop_metrics()
    counts = runner.counts.snapshot()
    render.note(f"{runner.name}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()))


def available_cores() -> int:
    """The CPUs this process may run on: `--processes`' default."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _checked_worker(
    engine: Engine,
    *,
    model: str | None,
    settings: dict[str, Any],
    quotas: dict[str, Any] | None = None,
    **options: Any,
) -> Worker:
    """A worker for `engine`, refused now (exit 2) when it could not run: no model for the agent states it serves,
    a bad model spec, unreadable profiles or flow settings (`quotas`: the command line's, `--quotas`)."""
    from engine.runtime import config
    from engine.runtime.models import open_model
    from engine.runtime.worker import Worker

    try:
        adapter = open_model(model, settings) if model else None
        if quotas is not None:
            engine.give_flow_settings({"quotas": quotas})
    except RailyardError as error:
        fail(error)
    runner = Worker(engine, model=adapter, **options)
    try:
        runner.check_configuration()
        if runner.model is None and config.model_spec() is not None:
            runner.model = engine.model = open_model(str(config.model_spec()), settings)  # a bad spec: exit 2 now
    except RailyardError as error:
        fail(error)
    return runner


def _supervised(value: str) -> tuple[str, int, int]:
    """`--supervised SUPERVISOR,INDEX,RESTARTS`, as the supervisor writes it."""
    try:
        supervisor, index, restarts = value.rsplit(",", 2)
        return supervisor, int(index), int(restarts)
    except ValueError:
        raise typer.BadParameter("SUPERVISOR,INDEX,RESTARTS", param_hint="--supervised") from None


def _watch_supervisor(stop: Callable[[], None]) -> None:
    """A supervised process stops (as on its first signal) when its stdin ends: the supervisor closed it to drain
    its processes, or died, which closes it too."""
    import sys
    import threading

    def watch() -> None:
        with suppress(OSError, ValueError):
            while sys.stdin.buffer.read(4096):
                pass
        stop()

    threading.Thread(target=watch, name="supervisor-pipe", daemon=True).start()


def _supervise(
    processes: int,
    *,
    concurrency: int,
    workflows: list[str] | None,
    lease_seconds: float,
    model: str | None,
    settings: dict[str, Any],
    thinking: bool,
    quotas: dict[str, Any] | None,
    grace_seconds: float,
    report_seconds: float,
    checkpoint_minutes: float | None,
    metrics_port: int | None,
) -> None:
    """Run `processes` worker processes under a supervisor (`engine.runtime.supervisor`) until SIGTERM or SIGINT;
    then print what they did, summed."""
    import json
    import signal
    import socket
    import sys
    import uuid

    from engine.core.canonical import now
    from engine.core.worker_groups import SUMMED
    from engine.runtime import queries
    from engine.runtime.supervisor import Supervisor

    started = now()
    name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with open_engine() as engine:  # refuse now what every process would refuse (exit 2), before starting any
        _checked_worker(
            engine, model=model, settings=settings, quotas=quotas, concurrency=concurrency, workflows=workflows
        )

    def command(index: int, restarts: int) -> list[str]:
        argv = [sys.executable, "-m", "engine.cli", "worker", "--processes", "1"]
        argv += ["--supervised", f"{name},{index},{restarts}", "--concurrency", str(concurrency)]
        argv += ["--lease-seconds", repr(lease_seconds), "--grace-seconds", repr(grace_seconds)]
        argv += ["--report-seconds", repr(report_seconds), "--thinking" if thinking else "--no-thinking"]
        if workflows:
            argv += ["--workflows", ",".join(workflows)]
        if model:
            argv += ["--model", model]
        if settings["timeout_seconds"] is not None:
            argv += ["--timeout", repr(settings["timeout_seconds"])]
        if settings["retries"] is not None:
            argv += ["--retries", str(settings["retries"])]
        if settings["stream"] is not None:
            argv += ["--stream" if settings["stream"] else "--no-stream"]
        if settings["extra_body"] is not None:  # as parsed here: stdin (`-`) is the children's stop pipe
            argv += ["--extra-body", json.dumps(settings["extra_body"])]
        if quotas is not None:
            argv += ["--quotas", json.dumps(quotas)]
        if metrics_port is not None:
            argv += ["--metrics-port", str(metrics_port + index)]
        if checkpoint_minutes is not None and index == 0:  # one signer is enough
            argv += ["--checkpoint-minutes", repr(checkpoint_minutes)]
        return argv

    supervisor = Supervisor(command, processes, grace_seconds=grace_seconds)

    def on_signal(signum: int, _frame: object) -> None:
        if supervisor.stopping:
            render.note("stopping now")
        else:
            render.note(f"stopping: each process finishes the steps in hand (at most {grace_seconds:.0f} s)")
        supervisor.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    render.note(f"{name}: {processes} worker processes (concurrency {concurrency} each, lease {lease_seconds:.0f} s)")
    status = supervisor.run()
    with open_engine() as engine:
        reports = [
            r
            for r in queries.workers(engine, started, stopped=True)
            if isinstance(r.counts.get("supervisor"), dict) and r.counts["supervisor"].get("name") == name
        ]
    restarts = sum(len(slot.pids) - 1 for slot in supervisor.slots)
    totals = {key: sum(int(r.counts.get(key) or 0) for r in reports) for key in SUMMED}
    render.note(
        f"{name}: {processes} processes, restarts {restarts}, "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in totals.items())
    )
    if status:
        raise typer.Exit(status)


def _serve_metrics(engine: Engine, port: int) -> Callable[[], None]:
    """Record metrics from now on and serve them (and the task gauges of `engine`'s database) on `port`."""
    from engine.observability import hooks, metrics
    from engine.runtime import config

    host = config.metrics_host()
    try:
        stop = metrics.serve(hooks.enable_metrics().registry_for(engine.store), host, port)
    except OSError as exc:
        fail(RailyardError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}", code=Code.CONFIG_INVALID))
    render.note(f"metrics on http://{host}:{port}/metrics")
    return stop


def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8080,
) -> None:
    """Serve the HTTP API and the back-office pages (bearer tokens from RAILYARD_TOKENS_FILE; see docs/api.md)."""
    from engine.api.app import serve as run_server

    try:
        run_server(host, port)
    except RailyardError as error:
        fail(error)
