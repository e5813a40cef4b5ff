"""Worker benchmark: what worker processes sustain on PostgreSQL, against raw appends measured in the same run.

Throughput: 1, 2 and 4 worker processes (each a `Worker` with 4 threads, started with `spawn` so that
every connection is made after the process starts) over N short tasks of a workflow defined here:
agent -> read tool -> agent -> terminal, with a deterministic model, 4 transitions per task
(`lookup`, the tool's `call` intent, its `succeeded` outcome, `finish`). The tasks are created while the
workers start and are kept from being due until every worker reports in and listens; one UPDATE then
makes them all due, and the clock runs from that UPDATE to the last transition written. The
transitions are counted in the events table, and afterwards every task must be terminal with a
gap-free log whose hash chain verifies (`verify_chain`) and that `Engine.load` folds to the task row.

Next to each worker figure, the same number of processes doing raw one-statement appends by hand
(bench/harness.py's `PgRaw.best`, append.py's baseline: one data-modifying CTE, autocommit, one task per
process) and `Engine.transition` on a held task: the machine's ceiling for appends, measured in the same run.

Claim latency (runnable to claimed): 2 idle worker processes whose poll interval is 5 s, so that only
a notification explains a fast claim, while tasks are started one at a time at a modest rate; p50/p99
as the workers report them in the `workers` table after they stop. The same again with LISTEN off and
a 0.5 s poll: what the notifications buy.

    python bench/workers.py            # full run, a few minutes
    python bench/workers.py --quick    # under a minute
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from harness import (
    Config,
    Pool,
    background_busy,
    bench_database,
    bench_parser,
    cpu_ticks,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    summary,
    target,
    wait_quiet,
)
from pydantic import BaseModel, ConfigDict, Field

from engine import (
    ANYONE,
    Action,
    Agent,
    Engine,
    Registry,
    StaticRoles,
    Terminal,
    Tool,
    ToolCatalog,
    ToolDef,
    ToolInvocation,
    ToolKind,
    Worker,
    Workflow,
    migrations,
    verify_chain,
)
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall

T = TypeVar("T")
ACTOR = "bench"
NAME = "bench_short"
WARM = "bench_short_warm"  # the same workflow under another name: each process warms up on tasks no worker serves
FLEETS = (1, 2, 4)
CONCURRENCY = 4  # threads (tasks in hand) per worker process
TRANSITIONS_PER_TASK = 4
LISTEN_CHANNEL_QUERY = "LISTEN railyard_runnable"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: A run during which other work (or the kernel) took more than this share of the machine's CPU is run again.
DISTURBED = 0.25


# -- the workflow under test ---------------------------------------------------------------------
class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(pattern=r"^K-\d+$")


class Record(BaseModel):
    key: str
    value: int


def lookup(call: ToolInvocation) -> Record:
    query = call.parse(Query)
    return Record(key=query.key, value=42)


CATALOG = ToolCatalog(
    "bench_tools",
    1,
    [
        ToolDef("lookup", Query, Record, ToolKind.READ, lookup, description="Read a record."),
    ],
)


def short_workflow(name: str) -> Workflow:
    return Workflow(
        name=name,
        version=1,
        description="agent -> read tool -> agent -> terminal: 4 transitions a task.",
        tools=CATALOG,
        states=[
            Agent("asking", actions=[Action("lookup", "looking", Query, prepares="lookup"), Action("finish", "done")]),
            Tool("looking", tool="lookup", on_succeeded="asking", on_failed="asking", on_unknown="asking"),
            Terminal("done"),
        ],
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )


class Clerk:
    """A deterministic model: look the record up, then finish. Stateless, so one serves every task; async, like
    the shipped adapters, so the step is measured as they run it (a plain `def` would add a thread hop a call)."""

    provider = "scripted"
    model = "clerk"
    profile = "anthropic"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if 'name="lookup"' not in request.messages[1].content:
            call = ToolCall("c1", "lookup", '{"key": "K-1"}')
        else:
            call = ToolCall("c2", "finish", "{}")
        return ModelResponse(tool_calls=(call,), finish_reason="tool_calls")


def make_engine(url: str) -> Engine:
    return Engine(url, registry=Registry([short_workflow(NAME), short_workflow(WARM)]), authoriser=StaticRoles({}))


# -- worker processes -------------------------------------------------------------------------------
def _warm_up(eng: Engine, threads: int) -> None:
    """Open the pool's connections and run the whole path once per thread, on tasks no worker serves."""

    def run_two() -> None:
        for _ in range(2):
            eng.run(eng.start(WARM, {}, actor=ACTOR), model=Clerk())

    pool = [threading.Thread(target=run_two) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _serve(
    url: str, name: str, concurrency: int, poll_seconds: float, listen: bool, outbox: Any, serve: Any, stop: Any
) -> None:
    """One worker process: warm up, wait for `serve`, run a `Worker` until `stop`; report its CPU time."""
    try:
        eng = make_engine(url)
        _warm_up(eng, concurrency)
        outbox.put(("warm", name))
        serve.wait()
        worker = Worker(
            eng,
            name=name,
            concurrency=concurrency,
            workflows=[NAME],
            model=Clerk(),
            poll_seconds=poll_seconds,
            listen=listen,
        )

        def stop_when_told() -> None:
            stop.wait()
            worker.stop()

        threading.Thread(target=stop_when_told, daemon=True).start()
        worker.run()
        eng.close()
        outbox.put(("stopped", name))
    except BaseException:
        outbox.put(("error", name, traceback.format_exc()))


class Fleet:
    """`n` worker processes (spawned): they warm up, then serve when told, until told to stop."""

    def __init__(self, url: str, n: int, *, tag: str, poll_seconds: float, listen: bool) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.listen = listen
        self.names = [f"{tag}-w{i}" for i in range(n)]
        self.outbox = ctx.Queue()
        self.serve_event = ctx.Event()
        self.stop_event = ctx.Event()
        self.procs = [
            ctx.Process(
                target=_serve,
                args=(url, name, CONCURRENCY, poll_seconds, listen, self.outbox, self.serve_event, self.stop_event),
                daemon=True,
            )
            for name in self.names
        ]
        for proc in self.procs:
            proc.start()

    def _receive(self, tag: str) -> tuple[Any, ...]:
        message = self.outbox.get(timeout=120)
        if message[0] == "error":
            raise RuntimeError(f"worker {message[1]} failed:\n{message[2]}")
        assert message[0] == tag, message
        return tuple(message)

    def serve(self, conn: psycopg.Connection[Any]) -> None:
        """Wait for every process to warm up, let them serve, and return once each reported in and listens."""
        for _ in range(self.n):
            self._receive("warm")
        self.serve_event.set()
        deadline = time.monotonic() + 60
        while True:
            reported, listening = conn.execute(
                "SELECT (SELECT count(*) FROM workers WHERE name = ANY(%s) AND stopped_at IS NULL),"
                " (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s)",
                (self.names, LISTEN_CHANNEL_QUERY),
            ).fetchone() or (0, 0)
            if reported == self.n and (not self.listen or listening >= self.n):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after 60 s: {reported} reported, {listening} listening")
            time.sleep(0.02)
        time.sleep(0.2)  # each worker's first claim (on start and when its listener connects) found nothing

    def stop(self, conn: psycopg.Connection[Any]) -> None:
        self.stop_event.set()
        self.serve_event.set()
        try:
            for _ in range(self.n):
                self._receive("stopped")
        finally:
            for proc in self.procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.terminate()
        # The next fleet's readiness counts LISTEN connections: wait until these ones are gone.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = %s",
                (LISTEN_CHANNEL_QUERY,),
            ).fetchone()
            if row is None or row[0] == 0:
                break
            time.sleep(0.02)

    def reports(self, conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
        """Each worker's last report (the `counts` JSON it wrote to the `workers` table when it stopped)."""
        rows = conn.execute(
            "SELECT name, counts, stopped_at FROM workers WHERE name = ANY(%s)", (self.names,)
        ).fetchall()
        out = {name: {**json.loads(counts), "stopped": stopped is not None} for name, counts, stopped in rows}
        assert set(out) == set(self.names), out
        return out


# -- checks -----------------------------------------------------------------------------------------
def verify(eng: Engine, conn: psycopg.Connection[Any], task_ids: list[str]) -> dict[str, Any]:
    """Every task terminal, its log gap-free with a valid hash chain, folding to its row; transitions counted
    in the events table (every event but `start`)."""
    broken = []
    for task_id in task_ids:
        events = eng.history(task_id)
        findings = verify_chain(events)
        task = eng.load(task_id)  # folds from the snapshot and checks the fold against the task row
        if findings or not task.terminal or task.state != "done" or task.seq != len(events):
            broken.append((task_id, task.state, [f.code for f in findings]))
    transitions, last_at, leased = conn.execute(
        "SELECT count(*), max(at), (SELECT count(*) FROM tasks WHERE task_id = ANY(%s) AND lease_owner IS NOT NULL)"
        " FROM events WHERE task_id = ANY(%s) AND seq > 1",
        (task_ids, task_ids),
    ).fetchone() or (0, None, 0)
    if broken or transitions != TRANSITIONS_PER_TASK * len(task_ids) or leased:
        raise SystemExit(
            f"verification failed: {len(broken)} broken tasks {broken[:3]}, {transitions} transitions "
            f"for {len(task_ids)} tasks, {leased} still leased"
        )
    return {
        "tasks": len(task_ids),
        "terminal": len(task_ids),
        "transitions": int(transitions),
        "chains_valid": True,
        "last_event_at": last_at,
    }


def _open_and_connections(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM tasks WHERE workflow = %s AND status <> 'terminal'),"
        " (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database())",
        (NAME,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _wait_all_terminal(conn: psycopg.Connection[Any], timeout: float) -> int:
    """Poll (every 0.1 s) until no task of the workflow is open; returns the most connections seen meanwhile."""
    deadline = time.monotonic() + timeout
    most = 0
    while True:
        open_tasks, connections = _open_and_connections(conn)
        most = max(most, connections)
        if open_tasks == 0:
            return most
        if time.monotonic() > deadline:
            raise SystemExit(f"{open_tasks} tasks still open after {timeout:.0f} s")
        time.sleep(0.1)


def _proc_cpu(pid: int | str) -> tuple[str, float] | None:
    """(command name, CPU seconds used so far) of a process, from Linux /proc; None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            head, _, rest = f.read().rpartition(")")
        fields = rest.split()
        return head.partition("(")[2], (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


def _postgres_cpu() -> dict[str, float]:
    """CPU seconds so far of every local PostgreSQL server process (backends included), by pid."""
    out = {}
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if pid.isdigit():
            found = _proc_cpu(pid)
            if found is not None and found[0] == "postgres":
                out[pid] = found[1]
    return out


class CpuWindow:
    """Where the machine's CPU time went between `__init__` and `close`: the worker processes, the local
    PostgreSQL server, this process, and everything else (other work on the machine, and the kernel's own
    share of loopback networking). Linux only; elsewhere every figure is None."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.worker_pids = worker_pids
        self.ticks = cpu_ticks()
        self.workers = self._workers()
        self.server = _postgres_cpu()
        self.own = time.process_time()

    def _workers(self) -> float:
        return sum(found[1] for found in (_proc_cpu(pid) for pid in self.worker_pids) if found is not None)

    def close(self) -> dict[str, float | None]:
        ticks, workers, server, own = cpu_ticks(), self._workers(), _postgres_cpu(), time.process_time()
        if self.ticks is None or ticks is None or ticks[1] <= self.ticks[1] or not server:
            return {"busy": None, "worker_s": None, "server_s": None, "other_share": None}
        capacity = (ticks[1] - self.ticks[1]) / CLOCK_TICKS  # CPU-seconds the machine had in the window
        busy = (ticks[0] - self.ticks[0]) / CLOCK_TICKS
        worker_s = workers - self.workers
        server_s = sum(cpu - self.server.get(pid, 0.0) for pid, cpu in server.items())
        other = busy - worker_s - server_s - (own - self.own)
        return {
            "busy": busy / capacity,
            "worker_s": worker_s,
            "server_s": server_s,
            "other_share": max(other, 0.0) / capacity,
        }


def _settle(conn: psycopg.Connection[Any]) -> None:
    """What autovacuum does for a long-lived database: fresh statistics and no dead rows from earlier runs.

    Without it the planner keeps the statistics of a nearly empty table and, for a claim that names its
    workflows, may scan every task of the workflow (terminal ones too) through ix_tasks_workflow_version."""
    conn.execute("VACUUM (ANALYZE) tasks")
    conn.execute("ANALYZE events")


# -- the measurements ---------------------------------------------------------------------------------
def throughput_run(
    url: str, eng: Engine, conn: psycopg.Connection[Any], n: int, tasks: int, tag: str
) -> dict[str, Any]:
    """`n` worker processes over `tasks` tasks made due by one UPDATE; transitions per second to the last one."""
    baseline = _open_and_connections(conn)[1]
    fleet = Fleet(url, n, tag=tag, poll_seconds=1.0, listen=True)
    try:
        # Created while the workers start (they serve only once told to), then kept from being due.
        task_ids = [eng.start(NAME, {}, actor=ACTOR) for _ in range(tasks)]
        conn.execute(
            "UPDATE tasks SET next_run_at = %s WHERE task_id = ANY(%s)",
            (datetime.now(UTC) + timedelta(days=1), task_ids),
        )
        _settle(conn)
        fleet.serve(conn)
        window = CpuWindow([proc.pid for proc in fleet.procs if proc.pid is not None])
        conn.execute("UPDATE tasks SET next_run_at = %s WHERE task_id = ANY(%s)", (datetime.now(UTC), task_ids))
        go = datetime.now(UTC)
        most_connections = _wait_all_terminal(conn, timeout=600)
        cpu = window.close()
    finally:
        fleet.stop(conn)
    checked = verify(eng, conn, task_ids)
    reports = fleet.reports(conn)
    seconds = (checked.pop("last_event_at") - go).total_seconds()
    reported = sum(r["transitions"] for r in reports.values())

    def per_transition(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds / checked["transitions"] * 1e6, 1)

    return {
        "workers": n,
        "tasks": tasks,
        "transitions": checked["transitions"],
        "seconds": round(seconds, 3),
        "rate": checked["transitions"] / seconds,
        "workers_reported_transitions": reported,
        "claimed": sum(r["claimed"] for r in reports.values()),
        "conflicts": sum(r["conflicts"] + r["lease_losses"] + r["failures"] for r in reports.values()),
        "worker_cpu_us_per_transition": per_transition(cpu["worker_s"]),
        "postgres_cpu_us_per_transition": per_transition(cpu["server_s"]),
        "other_cpu_share": None if cpu["other_share"] is None else round(cpu["other_share"], 3),
        "connections_per_worker": round((most_connections - baseline) / n, 1),
        "machine_cpu_busy": None if cpu["busy"] is None else round(cpu["busy"], 3),
        "verified": checked,
    }


def latency_run(
    url: str,
    eng: Engine,
    conn: psycopg.Connection[Any],
    tasks: int,
    rate: float,
    *,
    listen: bool,
    poll_seconds: float,
    tag: str,
) -> dict[str, Any]:
    """2 idle workers; tasks started one at a time at `rate` a second; claim latency as the workers report it."""
    _settle(conn)
    fleet = Fleet(url, 2, tag=tag, poll_seconds=poll_seconds, listen=listen)
    try:
        fleet.serve(conn)
        time.sleep(poll_seconds if not listen else 0.0)  # the pollers' phases spread over a whole interval
        window = CpuWindow([proc.pid for proc in fleet.procs if proc.pid is not None])
        task_ids = []
        t0 = time.perf_counter()
        for i in range(tasks):
            pause = t0 + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            task_ids.append(eng.start(NAME, {}, actor=ACTOR))
        _wait_all_terminal(conn, timeout=120)
        cpu = window.close()
    finally:
        fleet.stop(conn)
    checked = verify(eng, conn, task_ids)
    checked.pop("last_event_at")
    reports = fleet.reports(conn)
    # A cross-check from the log: start event to the first transition (claim, load, one model step, append).
    rows = conn.execute(
        "SELECT EXTRACT(EPOCH FROM (b.at - a.at)) * 1000 FROM events a JOIN events b ON b.task_id = a.task_id"
        " AND b.seq = 2 WHERE a.seq = 1 AND a.task_id = ANY(%s)",
        (task_ids,),
    ).fetchall()
    first = sorted(float(r[0]) for r in rows)
    per_worker = {
        name: {k: r[k] for k in ("claimed", "claim_latency_p50_ms", "claim_latency_p99_ms")}
        for name, r in sorted(reports.items())
    }
    active = [r for r in per_worker.values() if r["claimed"]]
    return {
        "listen": listen,
        "poll_seconds": poll_seconds,
        "tasks": tasks,
        "rate_per_s": rate,
        "claim_latency_p50_ms": max(r["claim_latency_p50_ms"] for r in active),
        "claim_latency_p99_ms": max(r["claim_latency_p99_ms"] for r in active),
        "per_worker": per_worker,
        "other_cpu_share": None if cpu["other_share"] is None else round(cpu["other_share"], 3),
        "machine_cpu_busy": None if cpu["busy"] is None else round(cpu["busy"], 3),
        "start_to_first_transition_ms": {
            "p50": round(_quantile(first, 0.50), 2),
            "p99": round(_quantile(first, 0.99), 2),
            "max": round(first[-1], 2),
        },
        "verified": checked,
    }


def _quantile(ordered: list[float], q: float) -> float:
    """The worker's own definition (engine/worker.py), so the cross-check reads the same way."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the run --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    rounds: int
    tasks: int
    latency_tasks: int
    latency_rate: float
    warm_s: float
    run_s: float
    wait_s: float  # at most this long, before each worker run, for other work to leave the CPUs alone
    redo: int  # worker runs that may be discarded (other work busy meanwhile) and run again, in all


FULL = Plan(rounds=3, tasks=2000, latency_tasks=400, latency_rate=40.0, warm_s=0.3, run_s=2.0, wait_s=60.0, redo=8)
QUICK = Plan(rounds=1, tasks=300, latency_tasks=120, latency_rate=40.0, warm_s=0.15, run_s=0.5, wait_s=5.0, redo=2)

RAW_KINDS = {
    "best": "raw best: one CTE statement, autocommit (PgRaw.best)",
    "transition": "engine: Engine.transition (task held)",
}


class Quiet:
    """Each measurement waits (a while at most) for other work to leave the CPUs alone, and is run again if
    other work took more than `DISTURBED` of them meanwhile (`plan.redo` times in all; the output counts them)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.redo = plan.redo
        self.waited: list[float] = []
        self.discarded: list[dict[str, Any]] = []
        self.kept_disturbed: list[dict[str, Any]] = []  # disturbed, but the budget for running again was spent

    def run(self, label: str, measure: Callable[[], tuple[T, float | None]]) -> T:
        while True:
            self.waited.append(wait_quiet(self.plan.wait_s))
            value, other = measure()
            if other is None or other <= DISTURBED:
                return value
            if self.redo == 0:
                self.kept_disturbed.append({"what": label, "other_cpu_share": round(other, 3)})
                return value
            self.redo -= 1
            self.discarded.append({"what": label, "other_cpu_share": round(other, 3)})
            print(
                f"  {label}: discarded, other work took {other:.0%} of the CPUs; running it again",
                file=sys.stderr,
                flush=True,
            )


def raw_sample(pool: Pool, kind: str, n: int, plan: Plan) -> tuple[tuple[float, float, float | None], float | None]:
    """append.py's measurement (the harness's `Pool`) with `n` of its writer processes, and the share other work
    took meanwhile."""
    window = CpuWindow([proc.pid for proc in pool.procs[:n] if proc.pid is not None])
    sample = pool.measure(f"pg:{kind}", n, plan.warm_s, plan.run_s)
    return sample, window.close()["other_share"]


def measure_all(plan: Plan, url: str) -> dict[str, Any]:
    eng = make_engine(url)
    conn = psycopg.connect(libpq(url), autocommit=True)
    quiet = Quiet(plan)
    workers: dict[int, list[dict[str, Any]]] = {n: [] for n in FLEETS}
    raw: dict[str, dict[int, list[tuple[float, float, float | None]]]] = {k: {n: [] for n in FLEETS} for k in RAW_KINDS}
    with tempfile.TemporaryDirectory(prefix="railyard_bench_") as tmp:
        pool = Pool(Config(pg_url=url, sqlite_url=f"sqlite:///{Path(tmp) / 'unused.db'}"), max(FLEETS))
        try:
            for r in range(plan.rounds):
                order = FLEETS if r % 2 == 0 else tuple(reversed(FLEETS))  # drift touches every fleet alike
                for n in order:

                    def one_run(n: int = n, r: int = r) -> tuple[dict[str, Any], float | None]:
                        run = throughput_run(url, eng, conn, n, plan.tasks, f"r{r}-n{n}-{len(quiet.waited)}")
                        return run, run["other_cpu_share"]

                    run = quiet.run(f"{n} worker(s)", one_run)
                    workers[n].append(run)
                    print(
                        f"  round {r + 1}/{plan.rounds}: {n} worker(s) {run['rate']:.0f} transitions/s "
                        f"({run['transitions']} in {run['seconds']:.2f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
                    for kind in RAW_KINDS:
                        raw[kind][n].append(quiet.run(f"raw {kind} x{n}", partial(raw_sample, pool, kind, n, plan)))
        finally:
            pool.close()
    print("  claim latency ...", file=sys.stderr, flush=True)

    def listen() -> tuple[dict[str, Any], float | None]:
        run = latency_run(
            url,
            eng,
            conn,
            plan.latency_tasks,
            plan.latency_rate,
            listen=True,
            poll_seconds=5.0,
            tag=f"lat-listen-{len(quiet.waited)}",
        )
        return run, run["other_cpu_share"]

    def poll() -> tuple[dict[str, Any], float | None]:
        run = latency_run(
            url,
            eng,
            conn,
            plan.latency_tasks,
            plan.latency_rate,
            listen=False,
            poll_seconds=0.5,
            tag=f"lat-poll-{len(quiet.waited)}",
        )
        return run, run["other_cpu_share"]

    latency = {"listen": quiet.run("claim latency, LISTEN", listen), "poll": quiet.run("claim latency, poll", poll)}
    conn.close()
    eng.close()
    summaries = {str(n): _summary_runs(runs) for n, runs in workers.items()}
    return {
        "workers": summaries,
        "cpu_bound": _cpu_bound(summaries),
        "raw": {k: {str(n): summary(v) for n, v in by_n.items()} for k, by_n in raw.items()},
        "waited_for_quiet_s": quiet.waited,
        "runs_discarded": quiet.discarded,
        "kept_disturbed": quiet.kept_disturbed,
        "latency": latency,
    }


def _summary_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [run["rate"] for run in runs]
    return {
        "median": round(statistics.median(rates)),
        "min": round(min(rates)),
        "max": round(max(rates)),
        "rounds": [round(x) for x in rates],
        "worker_cpu_us_per_transition": _median_or_none([run["worker_cpu_us_per_transition"] for run in runs]),
        "postgres_cpu_us_per_transition": _median_or_none([run["postgres_cpu_us_per_transition"] for run in runs]),
        "connections_per_worker": max(run["connections_per_worker"] for run in runs),
        "machine_cpu_busy": _median_or_none([run["machine_cpu_busy"] for run in runs]),
        "other_cpu_share": _median_or_none([run["other_cpu_share"] for run in runs]),
        "runs": runs,
    }


def _cpu_bound(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the machine could do at most if every CPU did nothing but this: CPUs / CPU per transition."""
    out = {}
    nproc = os.cpu_count() or 1
    for n, w in summaries.items():
        if w["postgres_cpu_us_per_transition"] is None or w["worker_cpu_us_per_transition"] is None:
            continue
        us = w["worker_cpu_us_per_transition"] + w["postgres_cpu_us_per_transition"]
        out[n] = {"nproc": nproc, "us_per_transition": round(us, 1), "tps": round(nproc / us * 1e6)}
    return out


def _median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def ratios_and_targets(
    fig: dict[str, Any],
    nproc: int | None,
) -> tuple[dict[str, float], dict[str, list[float]], list[dict[str, Any]]]:
    ratios: dict[str, float] = {}
    per_round: dict[str, list[float]] = {}

    def ratio(name: str, top: dict[str, Any], bottom: dict[str, Any]) -> None:
        ratios[name] = top["median"] / bottom["median"]
        per_round[name] = [round(a / b, 3) for a, b in zip(top["rounds"], bottom["rounds"], strict=True)]

    w, best, tr = fig["workers"], fig["raw"]["best"], fig["raw"]["transition"]
    ratio("workers_2w_vs_1w", w["2"], w["1"])
    ratio("workers_4w_vs_1w", w["4"], w["1"])
    ratio("raw_best_2w_vs_1w", best["2"], best["1"])
    ratio("raw_best_4w_vs_1w", best["4"], best["1"])
    ratio("engine_transition_4w_vs_1w", tr["4"], tr["1"])
    for n in FLEETS:
        ratio(f"workers_{n}w_vs_raw_best", w[str(n)], best[str(n)])
    for n in FLEETS:
        ratio(f"workers_{n}w_vs_engine_transition", w[str(n)], tr[str(n)])
    latency = fig["latency"]
    ratios["claim_p99_poll_vs_listen"] = latency["poll"]["claim_latency_p99_ms"] / max(
        latency["listen"]["claim_latency_p99_ms"], 0.001
    )
    note = "4 worker processes / 1, transitions per second, PostgreSQL"
    cpu_one = fig["cpu_bound"].get("1")
    if cpu_one is not None:
        ratios["cpu_bound_vs_1w"] = cpu_one["tps"] / w["1"]["median"]
    if (nproc or 0) < 4:
        note += (
            f"; this machine has {nproc} CPUs for the workers and the database: raw best appends scale "
            f"{ratios['raw_best_4w_vs_1w']:.2f}x from 1 to 4 processes here"
        )
        if cpu_one is not None:
            note += (
                f", and at {cpu_one['us_per_transition']:.0f} us of CPU per worker transition (worker + server) "
                f"no number of workers can exceed {cpu_one['tps']} transitions/s, "
                f"{ratios['cpu_bound_vs_1w']:.2f}x one worker"
            )
    targets = [
        target("workers_4w_vs_1w", ratios["workers_4w_vs_1w"], ">=", 2.5, note, per_round["workers_4w_vs_1w"]),
        target(
            "claim_latency_p99_ms",
            latency["listen"]["claim_latency_p99_ms"],
            "<",
            50.0,
            "runnable to claimed, LISTEN/NOTIFY, 2 idle workers polling every 5 s (the worse worker's p99)",
        ),
    ]
    return ratios, per_round, targets


def report(
    fig: dict[str, Any],
    pg: dict[str, Any],
    ratios: dict[str, float],
    per_round: dict[str, list[float]],
    targets: list[dict[str, Any]],
    plan: Plan,
) -> None:
    print()
    print(f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']})")
    print(
        f"Throughput, transitions per second (median of {plan.rounds} round(s) [min-max]; workers: {plan.tasks:,} "
        f"tasks x {TRANSITIONS_PER_TASK} transitions, {CONCURRENCY} threads per process)"
    )
    print(
        f"    {'processes':<10} {'workers':>18} {'raw best (CTE)':>22} {'Engine.transition':>22} "
        f"{'workers/raw':>11} {'worker CPU':>10} {'server CPU':>10} {'conns/worker':>12} {'CPUs busy':>9} "
        f"{'other':>6}"
    )
    for n in FLEETS:
        w, b, t = fig["workers"][str(n)], fig["raw"]["best"][str(n)], fig["raw"]["transition"][str(n)]

        def cell(x: dict[str, Any]) -> str:
            return f"{x['median']:>6} [{x['min']}-{x['max']}]"

        def us(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.0f} us"

        def pct(value: float | None) -> str:
            return "n/a" if value is None else f"{value * 100:.0f} %"

        print(
            f"    {n:<10} {cell(w):>18} {cell(b):>22} {cell(t):>22} {ratios[f'workers_{n}w_vs_raw_best']:>10.2f}x "
            f"{us(w['worker_cpu_us_per_transition']):>10} {us(w['postgres_cpu_us_per_transition']):>10} "
            f"{w['connections_per_worker']:>12} {pct(w['machine_cpu_busy']):>9} {pct(w['other_cpu_share']):>6}"
        )
    print(
        "    (worker CPU and server CPU: the worker processes' and the local PostgreSQL server's CPU time per "
        "transition;\n     conns/worker: most connections per worker process during the run; other: the share "
        "of the CPUs taken by anything else, the kernel included)"
    )
    if fig["runs_discarded"]:
        print(
            f"    {len(fig['runs_discarded'])} measurement(s) discarded and run again, other work having taken "
            + ", ".join(f"{d['other_cpu_share']:.0%} ({d['what']})" for d in fig["runs_discarded"])
            + " of the CPUs"
        )
    for n, bound in fig["cpu_bound"].items():
        print(
            f"    CPU bound with {n} worker(s): {bound['nproc']} CPUs / {bound['us_per_transition']:.0f} us of CPU "
            f"per transition (worker + server) = {bound['tps']:.0f} transitions per second"
        )
    print(
        "Claim latency, runnable to claimed, milliseconds (2 idle worker processes; per worker p50/p99 from the "
        "workers table)"
    )
    for key, label in (("listen", "LISTEN/NOTIFY, poll 5 s"), ("poll", "LISTEN off, poll 0.5 s")):
        lat = fig["latency"][key]
        workers = ", ".join(
            f"{r['claimed']} claims p50 {r['claim_latency_p50_ms']} p99 {r['claim_latency_p99_ms']}"
            for r in lat["per_worker"].values()
        )
        first = lat["start_to_first_transition_ms"]
        print(
            f"    {label:<26} p50 {lat['claim_latency_p50_ms']:>8} p99 {lat['claim_latency_p99_ms']:>8}   "
            f"({workers}; {lat['tasks']} tasks at {lat['rate_per_s']:.0f}/s; start to first transition "
            f"p50 {first['p50']} p99 {first['p99']}; other work {lat['other_cpu_share']})"
        )
    if fig["kept_disturbed"]:
        print(
            f"WARNING: {len(fig['kept_disturbed'])} measurement(s) kept although other work took more than "
            f"{DISTURBED:.0%} of the CPUs meanwhile (no runs left to redo them): "
            + ", ".join(f"{d['what']} {d['other_cpu_share']:.0%}" for d in fig["kept_disturbed"])
            + ". The figures are disturbed by it; rerun on a quiet machine."
        )
    print("Ratios (of the medians; in brackets the same ratio round by round):")
    for name, value in ratios.items():
        spread = per_round.get(name)
        bracket = f"  [{min(spread):.2f}-{max(spread):.2f}]" if spread else ""
        print(f"    {name:<36} {value:6.2f}x{bracket}")
    print_targets(targets)


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    plan = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    idle_busy = background_busy(1.0 if plan is FULL else 0.5)
    print(
        f"Railyard worker benchmark ({mode}: {plan.rounds} round(s) of {plan.tasks:,} tasks per fleet of "
        f"{', '.join(map(str, FLEETS))} worker processes; raw appends {plan.run_s} s per figure; claim latency over "
        f"{plan.latency_tasks} tasks)",
        flush=True,
    )
    host = machine(None)
    print(f"Machine: {host['nproc']} CPUs ({host['cpu']}), Python {host['python']}, railyard {host['commit']}")
    print_background(idle_busy)
    with bench_database(pg_server_url(args.postgres_url)) as (pg_url, pg):
        if pg_url is None:
            print("This benchmark needs PostgreSQL; nothing measured.")
            print(json.dumps({"bench": "workers", "mode": mode, "postgresql": pg, "targets": [], "all_met": False}))
            return 0
        migrations.upgrade(pg_url)
        fig = measure_all(plan, pg_url)

    host = machine(pg.get("server_version"))
    ratios, per_round, targets = ratios_and_targets(fig, host["nproc"])
    report(fig, pg, ratios, per_round, targets, plan)
    elapsed = time.perf_counter() - started
    print(f"({elapsed:.0f} s)")
    w, raw, lat = fig["workers"], fig["raw"], fig["latency"]
    result = {
        "bench": "workers",
        "mode": mode,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(elapsed, 1),
        "plan": {
            "rounds": plan.rounds,
            "tasks": plan.tasks,
            "transitions_per_task": TRANSITIONS_PER_TASK,
            "threads_per_worker": CONCURRENCY,
            "latency_tasks": plan.latency_tasks,
            "latency_rate_per_s": plan.latency_rate,
            "raw_run_s": plan.run_s,
            "raw_warm_s": plan.warm_s,
        },
        "machine": host,
        "background_cpu_busy": None if idle_busy is None else round(idle_busy, 3),
        "postgresql": pg,
        "unit": "transitions per second; latency in milliseconds",
        "figures": {
            **{f"workers_{n}w": w[str(n)]["median"] for n in FLEETS},
            "claim_latency_listen_p50_ms": lat["listen"]["claim_latency_p50_ms"],
            "claim_latency_listen_p99_ms": lat["listen"]["claim_latency_p99_ms"],
            "worker_cpu_us_per_transition_1w": w["1"]["worker_cpu_us_per_transition"],
            "postgres_cpu_us_per_transition_1w": w["1"]["postgres_cpu_us_per_transition"],
            "connections_per_worker": max(w[str(n)]["connections_per_worker"] for n in FLEETS),
        },
        "baselines": {
            **{f"raw_best_{n}w": raw["best"][str(n)]["median"] for n in FLEETS},
            **{f"engine_transition_{n}w": raw["transition"][str(n)]["median"] for n in FLEETS},
            "claim_latency_poll_p50_ms": lat["poll"]["claim_latency_p50_ms"],
            "claim_latency_poll_p99_ms": lat["poll"]["claim_latency_p99_ms"],
        },
        "waited_for_quiet_s": fig["waited_for_quiet_s"],
        "runs_discarded": fig["runs_discarded"],
        "kept_disturbed": fig["kept_disturbed"],
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "ratios_per_round": per_round,
        "targets": targets,
        "all_met": all(t["met"] is True for t in targets),
        "verified": {n: [run["verified"] for run in w[n]["runs"]] for n in w}
        | {f"latency_{k}": v["verified"] for k, v in lat.items()},
        "detail": fig,
    }
    print(json.dumps(result, separators=(",", ":"), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
