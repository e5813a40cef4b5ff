"""The long-running commands: `worker` (claims and advances due tasks) and `serve` (the HTTP API and pages)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Annotated

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
    thinking_option,
)
from engine.core.errors import Code, RailyardError
from engine.runtime import config
from engine.runtime.engine import Engine


def worker(
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Tasks held at once (coroutines on one event loop).")
    ] = 4,
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
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics on this port at /metrics (interface: RAILYARD_METRICS_HOST, 127.0.0.1).",
        ),
    ] = None,
) -> None:
    """Claim due tasks, advance each until it blocks or ends, release it; until SIGTERM or SIGINT.

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

    from engine.runtime.models import open_model
    from engine.runtime.worker import Worker

    if max_tasks is not None and not once:
        raise typer.BadParameter("only with --once: a worker without it runs until stopped", param_hint="--max-tasks")
    require_schema(database_url())  # a worker logs what fails on a claim and carries on: not for this

    runner: Worker | None = None
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            os._exit(128 + signum)
        stopping.set()
        if runner is not None:
            runner.stop()
        render.note(f"stopping: finishing the steps in hand (at most {grace_seconds:.0f} s)")
        timer = threading.Timer(grace_seconds, lambda: os._exit(128 + signum))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # One line per transition and the worker's own notes, on stderr, for the operator's log pipeline.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for name in ("railyard.transitions", "railyard.worker"):
        logging.getLogger(name).setLevel(logging.INFO)
    with open_engine() as engine:
        settings = model_options(timeout, retries, stream, extra_body)
        try:
            adapter = open_model(model, settings) if model else None
        except RailyardError as error:
            fail(error)
        names = [w.strip() for w in workflows.split(",") if w.strip()] if workflows else None
        runner = Worker(
            engine,
            concurrency=concurrency,
            lease_seconds=lease_seconds,
            workflows=names,
            model=adapter,
            thinking=thinking_option(thinking),
            report_seconds=report_seconds,
            checkpoint_seconds=checkpoint_minutes * 60 if checkpoint_minutes is not None else None,
        )
        try:
            runner.check_configuration()
            if runner.model is None and config.model_spec() is not None:
                runner.model = engine.model = open_model(str(config.model_spec()), settings)  # a bad spec: exit 2 now
        except RailyardError as error:
            fail(error)
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


def _serve_metrics(engine: Engine, port: int) -> Callable[[], None]:
    """Record metrics from now on and serve them (and the task gauges of `engine`'s database) on `port`."""
    from engine.observability import hooks, metrics

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
