"""How many model calls one worker keeps in flight, and the CPU it spends around each, when the model is slow.

Real agent tasks wait on models for one to thirty seconds a turn; what decides how many machines a team needs
is how many calls one `railyard worker` process holds at once and the CPU it spends around each. This runs
real `railyard worker` processes on PostgreSQL against `fake_model.py` (a separate process, through the official
SDKs, on the OpenAI wire and in one case on the Anthropic wire) that answers after a set latency, on two
workflows: one agent state whose only action ends the task (one model call and one append per task), and the
reference refund workflow end to end (three model turns, a read tool, an approval the benchmark grants as a
refund approver, a write tool against the fake payment provider).

For each case it reports tasks/s, the ratio to the Little's-law limit (calls in flight / (turns per task x
mean latency)) and to the rate the CPUs allow, model turns per task and calls in flight at the fake server (most and
mean), worker CPU per model turn and per task, the fake server's, PostgreSQL's and (for the refund) the approver's
CPU per task apart, worker peak RSS, PostgreSQL connections per worker and the sessions opened per task; then
checks each task is terminal and its log replays clean, each model call answered is one turn in the logs, and for
the refund that each payment moved money exactly once, under its task's one action id. The one-turn cases are
measured between 10 % and 90 % of the tasks done; the refund over the whole run (see `Run.whole`).

`--quick`: fixed 1 s latency, one process: the one-turn workflow at concurrency 64 and 256 on the OpenAI wire and
256 on the Anthropic wire, the refund at 64. The full run adds 512 and 1,024 (2 s), two processes, a lognormal
latency (median 2 s, p99 10 s), and the refund at 256 with one and two processes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    background_busy,
    bench_database,
    bench_parser,
    cpu_ticks,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    reference_ms,
    target,
    wait_quiet,
)
from sqlalchemy import insert
from sqlalchemy.engine import make_url

from engine import Engine, RailyardError, Registry, StaticRoles, event_code, migrations
from engine.runtime import queries

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # the reference workflows and their fakes live in the project's `workflows` package
from workflows import REFUND_V1, fakes  # noqa: E402
from workflows.fakes import schema as fake_tables  # noqa: E402
from workflows.refund import APPROVER  # noqa: E402

RAILYARD = Path(sys.executable).with_name("railyard")
WORKFLOW_MODULE = """
from engine import ANYONE, Action, Agent, Terminal, Workflow
from workflows.refund import REFUND_V1

ONE_TURN = Workflow(
    name="one_turn",
    version=1,
    description="One model turn: the only action ends the task.",
    states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")],
    operator_role=ANYONE,
)
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: The bench's own connections carry this name, so those counted per worker are the workers' alone.
BENCH_APP = "llm_bound"
#: Who starts the refunds, and who approves them: neither is the model that proposes, as the workflow requires.
CLERK, APPROVER_ACTOR = "bench-clerk", "bench-approver"
#: The refund tasks' orders (the workflow's order ids are O- and four digits): one each, past the seeded ones.
FIRST_ORDER, LAST_ORDER = 3000, 9999
#: Model turns a task takes on its path: the refund looks the order up, finds it eligible and proposes.
TURNS = {"one_turn": 1, "refund": 3}


@dataclass(frozen=True)
class Case:
    latency: str  # fake_model.py's --latency
    median_s: float  # the latency's median: how many tasks make a run of the intended length
    concurrency: int
    processes: int
    workflow: str = "one_turn"
    wire: str = "openai"

    @property
    def name(self) -> str:
        return f"{self.workflow} {self.wire} {self.latency} c={self.concurrency} p={self.processes}"

    @property
    def mean_s(self) -> float:
        """The latency's mean, which Little's law takes (the time a call spends in flight, on average): for a
        lognormal, median x exp(sigma^2 / 2), with sigma from its p99 as `fake_model.latency_of` draws it. The
        median would overstate the limit: 2 s median and 10 s p99 have a mean of 2.54 s."""
        kind, *values = self.latency.split(":")
        if kind == "lognormal":
            median, p99 = float(values[0]), float(values[1])
            sigma = (math.log(p99) - math.log(median)) / 2.326
            return median * math.exp(sigma * sigma / 2)
        return float(values[0])


def with_app(url: str, name: str) -> str:
    """`url` with libpq's `application_name`, so pg_stat_activity tells whose each connection is."""
    return make_url(url).update_query_dict({"application_name": name}).render_as_string(hide_password=False)


@contextlib.contextmanager
def fake_model(latency: str) -> Iterator[tuple[int, int]]:
    """The fake provider running: (port, pid)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "fake_model.py"), "--latency", latency],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stats(port: int, reset: bool = False) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/stats", method="POST" if reset else "GET", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name: [0] state, [1] ppid, ... [11] utime, [12] stime, [13] cutime,
    [14] cstime (in clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def postgres_cpu_s(conn: psycopg.Connection[Any]) -> float | None:
    """CPU seconds so far of the whole PostgreSQL server, if it runs on this machine: the postmaster, its live
    children, and the children it reaped (cutime + cstime), since backends come and go (a pool's overflow
    connections are closed when given back). Other databases on the same server count too; the CPUs-busy figure
    says how much else was running. None when the server's processes are not readable here."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        master = int(_stat(int(row[0]))[1]) if row else 0
        fields = _stat(master)
    except (OSError, IndexError, ValueError):
        return None
    ticks = sum(int(f) for f in fields[11:15])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                child = _stat(int(entry.name))
                if int(child[1]) == master:
                    ticks += int(child[11]) + int(child[12])
    return ticks / CLOCK_TICKS


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def terminal_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM tasks WHERE status = 'terminal'").fetchone()
    return int(row[0]) if row else 0


def connections(conn: psycopg.Connection[Any], database: str) -> int:
    """The workers' engine connections to the bench database (application_name `railyard`, the engine's): not
    the bench's own, nor those of the fake order and payment systems the refund's tools call (`railyard-fakes`),
    which stand for remote services and would be elsewhere in production."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        " AND application_name = 'railyard'",
        (database,),
    ).fetchone()
    return int(row[0]) if row else 0


def database_stats(conn: psycopg.Connection[Any], database: str) -> tuple[int, float]:
    """The bench database's sessions ever opened (their growth is connection churn: a pool's overflow connections
    are closed when given back) and milliseconds its statements have been executing, ended sessions included
    (CPU, and waits on locks and commits), from pg_stat_database (PostgreSQL 14+)."""
    row = conn.execute("SELECT sessions, active_time FROM pg_stat_database WHERE datname = %s", (database,)).fetchone()
    return (int(row[0] or 0), float(row[1] or 0.0)) if row else (0, 0.0)


@dataclass(frozen=True)
class Snapshot:
    """The counters a window is the difference of: wall clock, CPU seconds of each party, the machine's jiffies,
    and the bench database's sessions and active time."""

    at: float
    workers: float
    server: float
    postgres: float | None
    approver: float
    ticks: tuple[int, int] | None
    sessions: int
    active_ms: float

    @classmethod
    def take(
        cls,
        conn: psycopg.Connection[Any],
        database: str,
        workers: list[subprocess.Popen[str]],
        port: int,
        approver: Approver | None,
    ) -> Snapshot:
        return cls(
            time.monotonic(),
            sum(cpu_s(w.pid) for w in workers),
            float(stats(port)["cpu_s"]),
            postgres_cpu_s(conn),
            approver.cpu_s if approver else 0.0,
            cpu_ticks(),
            *database_stats(conn, database),
        )


class Approver:
    """Grants every refund standing at its approval gate, through `Engine.approve`, as a refund approver who
    neither started the task nor proposed the refund (the workflow's separation of duties), on the digest of the
    prepared call it was shown; from a thread of the benchmark, whose CPU it counts apart."""

    def __init__(self, url: str) -> None:
        self.engine = Engine(
            with_app(url, BENCH_APP), Registry([REFUND_V1]), authoriser=StaticRoles({APPROVER_ACTOR: {APPROVER}})
        )
        self.approved = 0
        self.refused: list[str] = []
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="approver", daemon=True)

    def __enter__(self) -> Approver:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.engine.close()

    def _run(self) -> None:
        try:
            self._approve_all()
        except Exception as exc:  # the run then ends at its deadline; this says why
            self.refused.append(f"the approver stopped: {type(exc).__name__}: {exc}"[:300])
            raise

    def _approve_all(self) -> None:
        while not self._stop.is_set():
            page, _ = queries.approvals(self.engine, role=APPROVER, limit=500)
            for pending in page:
                try:
                    self.engine.approve(
                        pending["task_id"],
                        actor=APPROVER_ACTOR,
                        prepared_digest=pending["digest"],
                        comment="granted by the benchmark",
                    )
                    self.approved += 1
                except RailyardError as refusal:
                    self.refused.append(f"{pending['task_id']}: {refusal.code}: {refusal}"[:300])
            self.cpu_s = time.thread_time()
            if not page:
                self._stop.wait(0.05)


def add_orders(url: str, n: int) -> list[str]:
    """`n` orders of customer C-100 in the fake order system, each with one piece of evidence, half in EUR and half
    in USD: a task of its own for each, as in a shop, where a refund locks only its own order's row (a few orders
    shared by every task would serialise the payments on their row locks, which is the bench's doing, not the
    engine's)."""
    if n > LAST_ORDER - FIRST_ORDER + 1:
        raise SystemExit(
            f"{n} refund tasks: at most {LAST_ORDER - FIRST_ORDER + 1} orders have ids of the workflow's form"
        )
    numbers = range(FIRST_ORDER, FIRST_ORDER + n)
    orders: list[dict[str, Any]] = [
        {
            "order_id": f"O-{k}",
            "customer_id": "C-100",
            "currency": ("EUR", "USD")[k % 2],
            "total": 5_000 + k,
            "refunded": 0,
            "status": "delivered",
            "placed_at": datetime(2026, 11, 2, 9, 0, tzinfo=UTC),
        }
        for k in numbers
    ]
    evidence = [
        {"evidence_id": f"EV-{k}", "order_id": f"O-{k}", "kind": "photo", "note": "Arrived damaged."} for k in numbers
    ]
    books = fakes.systems(url)
    with books.backend.write() as conn:
        conn.execute(insert(fake_tables.orders), orders)
        conn.execute(insert(fake_tables.evidence), evidence)
    return [str(order["order_id"]) for order in orders]


def start_tasks(eng: Engine, case: Case, tasks: int, orders: list[str]) -> list[str]:
    if case.workflow == "refund":
        customer = {"customer_id": "C-100", "message": "My order arrived damaged."}
        return [eng.start("refund", customer | {"order_id": order}, actor=CLERK, version=1) for order in orders]
    return [eng.start("one_turn", {}, actor=CLERK) for _ in range(tasks)]


def worker_env(case: Case, url: str, port: int, workdir: Path) -> tuple[dict[str, str], list[str]]:
    env = {
        **os.environ,
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "llm_bench_workflows",
        "PYTHONPATH": os.pathsep.join([str(workdir), str(ROOT)]),
    }
    if case.wire == "anthropic":
        env |= {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "bench"}
    else:
        env |= {"OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1", "OPENAI_API_KEY": "bench"}
    # One process each (the case says how many): their CPU is read from their own pids.
    argv = [str(RAILYARD), "worker", "--processes", "1", "--concurrency", str(case.concurrency)]
    argv += ["--model", f"{case.wire}:bench-model"]
    return env, argv


@dataclass(frozen=True)
class Window:
    first: Snapshot
    last: Snapshot
    served: dict[str, Any]  # the fake server's counts over the window
    tasks: int  # tasks the window covers
    seconds: float
    most_connections: int
    over: str  # which part of the run it is


class Run:
    """The workers of one case at work, watched from one connection of the bench's own."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        database: str,
        workers: list[subprocess.Popen[str]],
        port: int,
        approver: Approver | None,
        workdir: Path,
        deadline: float,
    ) -> None:
        self.conn, self.database, self.workers, self.port = conn, database, workers, port
        self.approver, self.workdir, self.deadline = approver, workdir, deadline
        self.most_connections = 0

    def snapshot(self) -> Snapshot:
        return Snapshot.take(self.conn, self.database, self.workers, self.port, self.approver)

    def done(self) -> int:
        """Tasks terminal now; on the way, the most worker connections seen, and whether every worker still runs."""
        self.most_connections = max(self.most_connections, connections(self.conn, self.database))
        if any(w.poll() is not None for w in self.workers):
            tail = (self.workdir / "worker-0.log").read_text()[-2000:]
            raise RuntimeError(f"a worker exited: {tail}")
        if time.monotonic() > self.deadline:
            raise RuntimeError(f"{terminal_count(self.conn)} tasks done before the deadline")
        return terminal_count(self.conn)

    def middle(self, tasks: int) -> Window:
        """From 10 % of the tasks terminal to 90 %, so start-up and the tail do not count."""
        low, high = tasks // 10, tasks - tasks // 10
        while (done_first := self.done()) < low:
            time.sleep(0.2)
        first = self.snapshot()
        stats(self.port, reset=True)
        while (done_last := self.done()) < high:
            time.sleep(0.2)
        last = self.snapshot()
        window = Window(
            first,
            last,
            stats(self.port),
            done_last - done_first,
            last.at - first.at,
            self.most_connections,
            "middle 80 %",
        )
        while self.done() < tasks:
            time.sleep(0.2)
        return window

    def whole(self, tasks: int) -> Window:
        """From the moment every task is made due (the workers started and claiming) to the last event.

        The refund's tasks pass through a worker twice, and an approved task queues behind older due ones (a claim
        takes the oldest due first): in a batch its completions bunch at the end, so a window of completions would
        measure that bunch. The whole run holds every step of every task."""
        logs = [self.workdir / f"worker-{i}.log" for i in range(len(self.workers))]
        until = time.monotonic() + 30
        while time.monotonic() < until and not all("claiming (" in log.read_text() for log in logs):
            self.done()
            time.sleep(0.1)
        first = self.snapshot()
        stats(self.port, reset=True)
        go = datetime.now(UTC)
        self.conn.execute("UPDATE tasks SET next_run_at = %s WHERE status <> 'terminal'", (go,))
        while self.done() < tasks:
            time.sleep(0.2)
        last = self.snapshot()
        row = self.conn.execute("SELECT max(at) FROM events").fetchone()
        seconds = (row[0] - go).total_seconds() if row and row[0] else last.at - first.at
        return Window(first, last, stats(self.port), tasks, seconds, self.most_connections, "whole run")


def run_case(case: Case, url: str, workdir: Path, tasks: int) -> dict[str, Any]:
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        # The append-only guard (migration 0007) refuses TRUNCATE; the bench database's owner sets it aside.
        conn.execute("SET session_replication_role = replica")
        conn.execute("TRUNCATE events, snapshots, tasks CASCADE")
    bench_url = with_app(url, BENCH_APP)
    fakes.systems(bench_url).reset()  # the seeded orders only, and empty payment books
    orders = add_orders(bench_url, tasks) if case.workflow == "refund" else []
    fakes.close(bench_url)
    sys.path.insert(0, str(workdir))
    from llm_bench_workflows import ONE_TURN  # type: ignore[import-not-found]

    registry = Registry([ONE_TURN, REFUND_V1])
    with Engine(bench_url, registry, authoriser=StaticRoles({})) as eng:
        ids = start_tasks(eng, case, tasks, orders)
    whole = case.workflow == "refund"
    if whole:  # kept from being due until the workers are claiming
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("UPDATE tasks SET next_run_at = %s", (datetime.now(UTC) + timedelta(days=1),))
    approver = Approver(url) if case.workflow == "refund" else None
    speed = reference_ms()  # how fast the machine is right now: a VM's speed drifts from case to case
    with fake_model(case.latency) as (port, _server_pid), approver or contextlib.nullcontext():
        env, argv = worker_env(case, url, port, workdir)
        # The workers' logs go to a file: a pipe nobody reads fills up, and a worker blocked on its log is what
        # the figures would measure.
        logs = [(workdir / f"worker-{i}.log").open("w") for i in range(case.processes)]
        workers = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True) for log in logs]
        try:
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                # Generous: a case on a busy machine may take several times its Little's-law time.
                deadline = time.monotonic() + 120 + tasks * TURNS[case.workflow] * case.median_s / case.concurrency * 8
                run = Run(conn, database, workers, port, approver, workdir, deadline)
                window = run.whole(tasks) if whole else run.middle(tasks)
            rss = max(peak_rss_mib(w.pid) for w in workers)
            totals = stats(port)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    w.kill()
            for log in logs:
                log.close()
    found = figures(case, tasks, window, rss, totals, approver) | {"reference_work_ms": speed}
    return found | verify(registry, url, ids, case, totals)


def figures(
    case: Case, tasks: int, window: Window, rss: float, totals: dict[str, Any], approver: Approver | None
) -> dict[str, Any]:
    first, last, counted = window.first, window.last, window.tasks
    worker_cpu = last.workers - first.workers
    server_cpu = last.server - first.server
    approver_cpu = last.approver - first.approver
    pg_cpu = None if first.postgres is None or last.postgres is None else last.postgres - first.postgres
    rate = counted / window.seconds
    turns_per_task = totals["requests_total"] / tasks
    limit = case.concurrency * case.processes / (case.mean_s * turns_per_task)
    busy = None
    if first.ticks is not None and last.ticks is not None and last.ticks[1] > first.ticks[1]:
        busy = round((last.ticks[0] - first.ticks[0]) / (last.ticks[1] - first.ticks[1]), 2)
    # The rate the CPUs allow: a worker process is one interpreter, so it cannot pass one task per its CPU per task;
    # and the machine's CPUs are shared by the workers, the fake server, PostgreSQL and the approver.
    spent = worker_cpu + server_cpu + (pg_cpu or 0.0) + approver_cpu
    cpu_bound = min(case.processes * counted / worker_cpu, (os.cpu_count() or 1) * counted / spent)
    result = {
        "case": case.name,
        "workflow": case.workflow,
        "wire": case.wire,
        "tasks": tasks,
        "measured_over": window.over,
        "tasks_per_s": round(rate, 1),
        "littles_law_limit": round(limit, 1),
        "ratio": round(rate / limit, 3),
        "cpu_bound_tasks_per_s": round(cpu_bound, 1),
        "share_of_cpu_bound": round(rate / cpu_bound, 3),
        "model_turns_per_task": round(turns_per_task, 2),
        "most_inflight": window.served["most_inflight"],
        "mean_inflight": window.served["mean_inflight"],
        "worker_cpu_ms_per_turn": round(worker_cpu / max(window.served["answered"], 1) * 1000, 2),
        "worker_cpu_ms_per_task": round(worker_cpu / counted * 1000, 2),
        "server_cpu_ms_per_task": round(server_cpu / counted * 1000, 2),
        "postgres_cpu_ms_per_task": None if pg_cpu is None else round(pg_cpu / counted * 1000, 2),
        "postgres_active_ms_per_task": round((last.active_ms - first.active_ms) / counted, 2),
        "pg_sessions_per_task": round((last.sessions - first.sessions) / counted, 2),
        "worker_rss_mib": round(rss, 1),
        "pg_connections_per_worker": round(window.most_connections / case.processes, 1),
        "machine_cpu_busy": busy,
        "answers": totals["answers"],
    }
    if approver is not None:
        result["approver_cpu_ms_per_task"] = round(approver_cpu / counted * 1000, 2)
        result["approved"] = approver.approved
        result["approvals_refused"] = approver.refused[:5]
    return result


def verify(registry: Registry, url: str, ids: list[str], case: Case, totals: dict[str, Any]) -> dict[str, Any]:
    """Every task replays clean (chain, legality, its row is the fold of its log) and is terminal; every model call
    answered is one turn in the logs; for the refund, every paid task paid once: one action id per task, money
    moved exactly once under each, under no other."""
    bench_url = with_app(url, BENCH_APP)
    with Engine(bench_url, registry, authoriser=StaticRoles({})) as eng:
        reports = list(eng.audit.replay_all(jobs=1))
        histories = {task_id: eng.history(task_id) for task_id in ids} if case.workflow == "refund" else {}
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute("SELECT task_id, state, status FROM tasks").fetchall()
        turns = conn.execute("SELECT count(*) FROM events WHERE actor LIKE 'model:%'").fetchone()
    out: dict[str, Any] = {
        "ended": dict(Counter(state for _, state, _ in rows)),
        "all_terminal": sorted(r[0] for r in rows) == sorted(ids) and all(r[2] == "terminal" for r in rows),
        "replayed": len(reports),
        "replay_findings": sum(len(r.findings) for r in reports),
        "turns_logged": int(turns[0]) if turns else 0,
        "turns_served": totals["requests_total"],
    }
    if case.workflow == "refund":
        # The action ids under which each paid task's payment was recorded as intended (one, however many attempts).
        paid = [
            {e.data["intent"]["action_id"] for e in events if e.data.get("intent", {}).get("tool") == "payments_refund"}
            for events in histories.values()
            if events[-1].to_state == "completed"
        ]
        executions = fakes.systems(bench_url).payments.executions()  # money moved, per idempotency key
        fakes.close(bench_url)
        out["writes_once"] = (
            all(len(keys) == 1 for keys in paid)
            and set(executions) == set().union(*paid)
            and all(n == 1 for n in executions.values())
        )
        out["payments_executed"] = sum(executions.values())
        # The path the tasks took, by trigger, and the codes on it: a read that timed out, a repair or a retry.
        out["triggers"] = dict(Counter(e.trigger for events in histories.values() for e in events))
        out["codes"] = dict(Counter(c for events in histories.values() for e in events if (c := event_code(e.data))))
    out["verified"] = (
        out["all_terminal"]
        and out["replayed"] == len(ids)
        and not out["replay_findings"]
        and out["turns_logged"] == out["turns_served"]
        and out.get("writes_once", True) is not False
    )
    return out


def cases(quick: bool) -> list[Case]:
    found = [Case("fixed:1", 1.0, c, 1) for c in (64, 256)]
    found.append(Case("fixed:1", 1.0, 256, 1, wire="anthropic"))
    if not quick:
        found += [Case("fixed:1", 1.0, 512, 1), Case("fixed:2", 2.0, 1024, 1), Case("fixed:1", 1.0, 256, 2)]
        found.append(Case("lognormal:2:10", 2.0, 256, 1))
    found.append(Case("fixed:1", 1.0, 64, 1, workflow="refund"))
    if not quick:
        found += [Case("fixed:1", 1.0, 256, p, workflow="refund") for p in (1, 2)]
    return found


def show(result: dict[str, Any]) -> str:
    """Two lines a case: the rate against its bounds, then what each party spent per task."""
    approver = ""
    if "approver_cpu_ms_per_task" in result:
        approver = f", approver {result['approver_cpu_ms_per_task']} ms"
    postgres = "n/a" if result["postgres_cpu_ms_per_task"] is None else f"{result['postgres_cpu_ms_per_task']} ms"
    busy = "n/a" if result["machine_cpu_busy"] is None else f"{result['machine_cpu_busy']:.0%}"
    verdict = "" if result["verified"] else f"  ** NOT ALL VERIFIED: {json.dumps(result['ended'])} **"
    return (
        f"{result['case']:>40}: {result['tasks_per_s']:7.1f} tasks/s ({result['measured_over']}), "
        f"{result['ratio']:.2f} of Little's law ({result['littles_law_limit']:.0f}), "
        f"{result['share_of_cpu_bound']:.2f} of the CPU-bound rate ({result['cpu_bound_tasks_per_s']:.0f}); "
        f"{result['model_turns_per_task']} turns/task, in flight max {result['most_inflight']} mean "
        f"{result['mean_inflight']}{verdict}\n"
        f"{'':>42}CPU per task: worker {result['worker_cpu_ms_per_task']} ms ({result['worker_cpu_ms_per_turn']} "
        f"ms/turn), fake server {result['server_cpu_ms_per_task']} ms, PostgreSQL {postgres} (the server; "
        f"{result['postgres_active_ms_per_task']} ms active in this database){approver}; RSS "
        f"{result['worker_rss_mib']:.0f} MiB, {result['pg_connections_per_worker']} PG connections/worker, "
        f"{result['pg_sessions_per_task']} sessions opened/task; CPUs {busy} busy; reference work "
        f"{result['reference_work_ms']} ms"
    )


def at_512_target(result: dict[str, Any]) -> dict[str, Any]:
    """Issue #18's target at 512 in flight and 1 s: at least 0.8 of Little's law or, where the CPUs are the bound
    (the rate they allow is below Little's law), within 1.2x of that rate. Judged on the bound that applies, which
    the note names with both shares."""
    littles, cpu = result["littles_law_limit"], result["cpu_bound_tasks_per_s"]
    shares = (
        f"{result['ratio']:.3f} of Little's law ({littles:.0f}/s), "
        f"{result['share_of_cpu_bound']:.3f} of the CPU-bound rate ({cpu:.0f}/s)"
    )
    if littles <= cpu:
        return target(
            "share of Little's law at 512 in flight",
            result["ratio"],
            ">=",
            0.8,
            f"issue #18; Little's law is the bound here, the CPUs allow more: {shares}",
        )
    return target(
        "share of the CPU-bound rate at 512 in flight",
        result["share_of_cpu_bound"],
        ">=",
        round(1 / 1.2, 3),
        f"issue #18: within 1.2x of it; the CPUs are the bound here: {shares}",
    )


def main() -> int:
    parser = bench_parser(__doc__)
    args = parser.parse_args()
    wait_quiet(30)
    print_background(background_busy(1.0))
    results = []
    with bench_database(pg_server_url(args.postgres_url)) as (url, info), tempfile.TemporaryDirectory() as tmp:
        if url is None:
            print("llm_bound needs PostgreSQL (workers claim with SKIP LOCKED); not measured")
            return 0
        migrations.upgrade(url)
        workdir = Path(tmp)
        (workdir / "llm_bench_workflows.py").write_text(WORKFLOW_MODULE, encoding="utf-8")
        # Each case holds its concurrency full for about six model latencies (four with --quick, to stay under
        # a minute), and at least 200 tasks.
        rounds = 4 if args.quick else 6
        for case in cases(args.quick):
            tasks = max(200, int(case.concurrency * case.processes * rounds / (case.median_s * TURNS[case.workflow])))
            result = run_case(case, url, workdir, tasks)
            results.append(result)
            print(show(result), flush=True)
    by_name = {r["case"]: r for r in results}
    one_turn = [r["worker_cpu_ms_per_turn"] for r in results if r["case"].startswith("one_turn openai fixed:1 ")]
    targets = [
        target("worker CPU per model turn, ms (median)", sorted(one_turn)[len(one_turn) // 2], "<", 2.5, "issue #18")
    ]
    if "one_turn openai fixed:2 c=1024 p=1" in by_name:
        big = by_name["one_turn openai fixed:2 c=1024 p=1"]
        targets += [
            target("model calls in flight, one worker", big["most_inflight"], ">=", 1000, "issue #18"),
            target("worker RSS at 1,024 in hand, MiB", big["worker_rss_mib"], "<", 300.01, "issue #18"),
            target("PostgreSQL connections, one worker", big["pg_connections_per_worker"], "<", 10.01, "issue #18"),
        ]
    if "one_turn openai fixed:1 c=512 p=1" in by_name:
        targets.append(at_512_target(by_name["one_turn openai fixed:1 c=512 p=1"]))
    print_targets(targets)
    print(
        json.dumps(
            {
                "bench": "llm_bound",
                "results": results,
                "targets": targets,
                "machine": machine(info.get("server_version")),
            }
        )
    )
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
