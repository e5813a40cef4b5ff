"""Kept appends benchmark: model calls made twice while PostgreSQL connections are killed under a worker (issue #33).

A `Worker` (one event loop, its store threads, concurrency 32) runs agent tasks of five model turns (a fake async
model answering `tick` four times, then `finish`, each after 50 ms), new ones started as others end to keep 64
going, while a killer terminates every backend of the benchmark's OWN database (`pg_terminate_backend` where
`datname = current_database()`, never another database's, never a server restart: other people use this server)
every 2 s for 30 s (8 s with `--quick`). Then the tasks started run to their end.

A model call is repeated when its answer is not in the log: one model turn ends in exactly one event, so repeated
calls = calls answered - `tick` and `finish` events in the log (every task is ended and checked first). The same
run measures, as its baseline, the worker without the kept append: the same kills with each lease's patience at
0, so an append that meets a dead connection is thrown away, as before issue #33. It also counts the appends that
were kept and sent again and the acknowledgements lost and found (the engine's log lines).

With `--restart COMMAND` (a server of your own only: it stops every database on it), the killer instead runs
COMMAND once, 2 s in, to restart the server (for a Debian cluster: `pg_ctlcluster --skip-systemctl-redirect 15
main restart`), and reports how long the server was away (from the command's start until a new connection is
taken) beside the repeated calls: the issue's second case, a restart of under 10 s.

    python bench/blinks.py            # 30 s of kills, and 30 s more for the baseline
    python bench/blinks.py --quick    # 8 s each
    python bench/blinks.py --quick --restart "pg_ctlcluster --skip-systemctl-redirect 15 main restart"
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from harness import (
    BENCH_WORKFLOW,
    background_busy,
    bench_database,
    bench_parser,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    target,
    tick_engine,
)

import engine.runtime.worker as worker_module
from engine import Worker, migrations
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall
from engine.runtime.leases import Lease

T = TypeVar("T")
#: Tasks of TURNS model turns each are started as others end, to keep about IN_FLIGHT of them going.
TURNS = 5
IN_FLIGHT = 64
CONCURRENCY = 32
LATENCY_S = 0.05
KILL_EVERY_S = 2.0
#: Only the benchmark's own database's backends, and not the killer's own connection.
KILL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


TICKED = re.compile(r'"tick": \{"n": (\d+)\}')


class TickingModel:
    """Answers `tick` TURNS - 1 times in a task (n = 1, 2, ...), then `finish`; counts the calls it answered."""

    provider, model, profile = "scripted", "blinks", "anthropic"

    def __init__(self) -> None:
        self.calls = 0
        self.finished = 0
        self._lock = threading.Lock()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(LATENCY_S)
        # The task's context names its latest tick's arguments: the turns it took so far.
        found = TICKED.search(request.messages[-1].content)
        done = int(found.group(1)) if found else 0
        ending = done >= TURNS - 1
        with self._lock:
            self.calls += 1
            self.finished += ending
        name, args = ("finish", "{}") if ending else ("tick", json.dumps({"n": done + 1}))
        return ModelResponse(tool_calls=(ToolCall("c", name, args),), finish_reason="tool_calls")


class Counted(logging.Handler):
    """Counts the engine's lines about kept appends: sent again, and found written after a lost acknowledgement."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.again = 0
        self.found = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "did not take seq" in message:
            self.again += 1
        elif "was written by the try whose answer was lost" in message:
            self.found += 1


def again(read: Callable[[], T]) -> T:
    """`read`, asked again while it meets a pooled connection the killer ended (each fails once)."""
    for _ in range(20):
        try:
            return read()
        except Exception:  # a killed connection, whatever layer reports it
            time.sleep(0.1)
    return read()


def restart_server(url: str, command: str) -> float:
    """Run `command` (it restarts the server) and wait for a new connection: the seconds the server was away."""
    started = time.monotonic()
    subprocess.run(command, shell=True, check=True, capture_output=True)
    while True:
        try:
            with psycopg.connect(libpq(url), autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return time.monotonic() - started
        except psycopg.OperationalError:
            if time.monotonic() - started > 120:
                raise
            time.sleep(0.05)


def run_case(url: str, seconds: float, *, kept: bool, restart: str | None = None) -> dict[str, Any]:
    """One case on an emptied database: tasks ticking under a worker while the killer runs for `seconds` (or, with
    `restart`, while the server is restarted once, 2 s in)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # the append-only guard refuses TRUNCATE too
        conn.execute("TRUNCATE snapshots, events, task_fields, tasks, workers CASCADE")
    counted = Counted()
    engine_log = logging.getLogger("railyard.engine")
    engine_log.addHandler(counted)
    engine_log.setLevel(logging.INFO)
    engine_log.propagate = False  # counted, not printed: a line per kept append
    original: Callable[..., Lease] = getattr(worker_module, "Lease")  # noqa: B009 - not exported
    if not kept:  # the baseline: no patience, so a failed append is raised at once and its answer thrown away
        setattr(worker_module, "Lease", lambda *a, **k: original(*a, **{**k, "patience": 0.0}))  # noqa: B010
    model = TickingModel()
    kills = killed = 0
    away: float | None = None
    task_ids: list[str] = []
    try:
        with tick_engine(url) as eng:

            def feed() -> None:
                while len(task_ids) - model.finished < IN_FLIGHT:
                    task_ids.append(again(lambda: eng.start(BENCH_WORKFLOW.name, {}, actor="bench")))

            feed()
            worker = Worker(
                eng, name="blinks", concurrency=CONCURRENCY, model=model, lease_seconds=30, retry_backoff=0.5
            )
            stop = threading.Event()
            thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
            thread.start()
            with psycopg.connect(libpq(url), autocommit=True) as killer:
                started = time.monotonic()
                next_kill = started + KILL_EVERY_S
                while (at := time.monotonic()) < started + seconds:
                    again(feed)
                    if restart is not None and away is None and at >= next_kill:
                        away = restart_server(url, restart)
                    elif restart is None and at >= next_kill:
                        row = killer.execute(KILL).fetchone()
                        kills, killed = kills + 1, killed + int(row[0] if row else 0)
                        next_kill += KILL_EVERY_S
                    time.sleep(0.05)
            wait_until = time.monotonic() + 180
            while time.monotonic() < wait_until and not again(lambda: all(eng.load(t).terminal for t in task_ids)):
                time.sleep(0.5)
            stop.set()
            worker.stop()
            thread.join(timeout=60)
            ended = again(lambda: sum(eng.load(t).terminal for t in task_ids))
            replayed_ok = again(lambda: all(eng.replay(t).ok for t in task_ids))
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM events WHERE trigger IN ('tick', 'finish')").fetchone()
                turns = int(row[0]) if row else 0
            counts = worker.counts.snapshot()
    finally:
        setattr(worker_module, "Lease", original)  # noqa: B010
        engine_log.removeHandler(counted)
        engine_log.propagate = True
    return {
        "kept": kept,
        "seconds_of_kills": seconds,
        "restart_seconds": None if away is None else round(away, 2),
        "kills": kills,
        "backends_killed": killed,
        "model_calls": model.calls,
        "turns_in_log": turns,
        "repeated_calls": model.calls - turns,
        "repeated_share": round((model.calls - turns) / max(model.calls, 1), 4),
        "appends_sent_again": counted.again,
        "lost_acks_found": counted.found,
        "tasks_ended": ended,
        "tasks": len(task_ids),
        "replay_ok": replayed_ok,
        "worker_failures": counts["failures"],
        "lease_losses": counts["lease_losses"],
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--restart", metavar="COMMAND", help="restart the server once with COMMAND instead of kills")
    args = parser.parse_args()
    # Killed connections are what this measures: the pool's note about each one it could not reset is not news.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    seconds = 8.0 if args.quick else 30.0
    idle_busy = background_busy(1.0)
    print_background(idle_busy)
    with bench_database(pg_server_url(args.postgres_url)) as (url, info):
        if url is None:
            targets = [target("repeated model calls under kills", None, "<", 1, "issue #33: 0")]
            print_targets(targets)
            print(json.dumps({"bench": "blinks", "targets": targets, "machine": machine(None)}))
            return
        migrations.upgrade(url)
        cases = {}
        for kept in (True, False):
            name = "kept" if kept else "baseline (patience 0)"
            case = run_case(url, seconds, kept=kept, restart=args.restart)
            cases["kept" if kept else "baseline"] = case
            what = (
                f"a restart ({case['restart_seconds']} s away)"
                if args.restart
                else f"{case['kills']} kills ({case['backends_killed']} backends)"
            )
            print(
                f"{name:<22} {what} over {seconds:.0f} s:"
                f" {case['model_calls']} model calls, {case['turns_in_log']} turns in the log,"
                f" {case['repeated_calls']} repeated; {case['appends_sent_again']} appends sent again,"
                f" {case['lost_acks_found']} lost acknowledgements found;"
                f" {case['tasks_ended']}/{case['tasks']} tasks ended, replay {'ok' if case['replay_ok'] else 'FAILED'}",
                flush=True,
            )
        kept_case, base = cases["kept"], cases["baseline"]
        verified = all(c["tasks_ended"] == c["tasks"] and c["replay_ok"] for c in cases.values())
        if args.restart:
            targets = [
                target(
                    "repeated model calls over a PostgreSQL restart",
                    kept_case["repeated_calls"] if verified else None,
                    "<",
                    1,
                    f"issue #33: 0; without the kept append, in the same run: {base['repeated_calls']}",
                ),
                target(
                    "seconds the server was away in the restart",
                    kept_case["restart_seconds"],
                    "<",
                    10,
                    "issue #33: the case is a restart of under 10 s",
                ),
            ]
        else:
            targets = [
                target(
                    f"repeated model calls over {seconds:.0f} s of kills every {KILL_EVERY_S:.0f} s",
                    kept_case["repeated_calls"] if verified else None,
                    "<",
                    1,
                    f"issue #33: 0; without the kept append, in the same run: {base['repeated_calls']}",
                )
            ]
        print_targets(targets)
        print(
            json.dumps(
                {
                    "bench": "blinks",
                    "cases": cases,
                    "verified": verified,
                    "targets": targets,
                    "machine": machine(info.get("server_version")),
                    "background_busy": idle_busy,
                }
            )
        )


if __name__ == "__main__":
    main()
