"""How many model calls one worker keeps in flight, and the CPU it spends around each, when the model is slow.

Real agent tasks wait on models for one to thirty seconds a turn; what decides how many machines a team needs
is how many calls one `railyard worker` process holds at once and the CPU it spends around each. This runs
real `railyard worker` processes on PostgreSQL against `fake_model.py` (a separate process, the OpenAI wire,
through the official SDK) that answers after a set latency, on a workflow of one agent state whose only action
ends the task: one model call and one append per task.

For each latency, concurrency and number of worker processes it reports tasks/s, the ratio to the
Little's-law limit (calls in flight / latency), calls in flight at the fake server (most and mean), worker CPU
per task (= per model turn here), the fake server's CPU apart, worker peak RSS and PostgreSQL connections per
worker; then checks each task is terminal and its log replays clean.

`--quick`: fixed 1 s latency, concurrency 64 and 256, one process. The full run adds 1,024, two processes, and
a lognormal latency (median 2 s, p99 10 s). The refund workflow and the Anthropic wire are not measured yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    background_busy,
    bench_database,
    bench_parser,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    target,
    wait_quiet,
)

from engine import Engine, Registry, StaticRoles, migrations

HERE = Path(__file__).resolve().parent
RAILYARD = Path(sys.executable).with_name("railyard")
WORKFLOW_MODULE = """
from engine import Action, Agent, Terminal, Workflow

ONE_TURN = Workflow(
    name="one_turn",
    version=1,
    description="One model turn: the only action ends the task.",
    states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")],
)
"""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Case:
    latency: str  # fake_model.py's --latency
    median_s: float  # for the Little's-law limit
    concurrency: int
    processes: int

    @property
    def name(self) -> str:
        return f"{self.latency} c={self.concurrency} p={self.processes}"


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


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def terminal_count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM tasks WHERE status = 'terminal'").fetchone()
    return int(row[0]) if row else 0


def connections(conn: psycopg.Connection[Any], database: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (database,)
    ).fetchone()
    return int(row[0]) if row else 0


def run_case(case: Case, url: str, workdir: Path, tasks: int) -> dict[str, Any]:
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        # The append-only guard (migration 0007) refuses TRUNCATE; the bench database's owner sets it aside.
        conn.execute("SET session_replication_role = replica")
        conn.execute("TRUNCATE events, snapshots, tasks CASCADE")
    sys.path.insert(0, str(workdir))
    from llm_bench_workflows import ONE_TURN  # type: ignore[import-not-found]

    with Engine(url, Registry([ONE_TURN]), authoriser=StaticRoles({})) as eng:
        ids = [eng.start("one_turn", {}, actor="bench") for _ in range(tasks)]
    with fake_model(case.latency) as (port, _server_pid):
        env = {
            **os.environ,
            "RAILYARD_DATABASE_URL": url,
            "RAILYARD_WORKFLOWS": "llm_bench_workflows",
            "PYTHONPATH": str(workdir),
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "OPENAI_API_KEY": "bench",
            "RAILYARD_LOG_LEVEL": "WARNING",
        }
        argv = [str(RAILYARD), "worker", "--concurrency", str(case.concurrency), "--model", "openai:bench-model"]
        # The workers' logs go to a file: a pipe nobody reads fills up, and a worker blocked on its log is what
        # the figures would measure.
        logs = [(workdir / f"worker-{i}.log").open("w") for i in range(case.processes)]
        workers = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True) for log in logs]
        try:
            with psycopg.connect(libpq(url), autocommit=True) as conn:
                # The window: from 10 % of the tasks done to 90 %, so start-up and the tail do not count.
                low, high = tasks // 10, tasks - tasks // 10
                deadline = time.monotonic() + 60 + tasks * case.median_s / case.concurrency * 4
                started_at = cpu0 = server0 = None
                most_connections = 0
                done = 0
                while done < high and time.monotonic() < deadline:
                    done = terminal_count(conn)
                    most_connections = max(most_connections, connections(conn, database))
                    if started_at is None and done >= low:
                        started_at, done_at_start = time.monotonic(), done
                        cpu0 = sum(cpu_s(w.pid) for w in workers)
                        server0 = stats(port)["cpu_s"]
                        stats(port, reset=True)
                    if any(w.poll() is not None for w in workers):
                        tail = (workdir / "worker-0.log").read_text()[-2000:]
                        raise RuntimeError(f"a worker exited: {tail}")
                    time.sleep(0.2)
                if started_at is None or done < high:
                    raise RuntimeError(f"{case.name}: {done} of {tasks} tasks done before the deadline")
                elapsed = time.monotonic() - started_at
                counted = done - done_at_start
                worker_cpu = sum(cpu_s(w.pid) for w in workers) - (cpu0 or 0.0)
                served = stats(port)
                server_cpu = served["cpu_s"] - (server0 or 0.0)
                rss = max(peak_rss_mib(w.pid) for w in workers)
                while terminal_count(conn) < tasks and time.monotonic() < deadline:
                    time.sleep(0.2)
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
    rate = counted / elapsed
    limit = case.concurrency * case.processes / case.median_s
    with Engine(url, Registry([ONE_TURN]), authoriser=StaticRoles({})) as eng:
        reports = list(eng.replay_all(jobs=1))
        ended = sum(eng.load(task_id).terminal for task_id in ids)
    return {
        "case": case.name,
        "tasks": tasks,
        "tasks_per_s": round(rate, 1),
        "littles_law_limit": round(limit, 1),
        "ratio": round(rate / limit, 3),
        "most_inflight": served["most_inflight"],
        "mean_inflight": served["mean_inflight"],
        "worker_cpu_ms_per_task": round(worker_cpu / counted * 1000, 2),
        "server_cpu_ms_per_task": round(server_cpu / counted * 1000, 2),
        "worker_rss_mib": round(rss, 1),
        "pg_connections_per_worker": round(most_connections / case.processes, 1),
        "all_terminal": ended == tasks,
        "replay_findings": sum(len(r.findings) for r in reports),
    }


def main() -> int:
    parser = bench_parser(__doc__)
    args = parser.parse_args()
    cases = [Case("fixed:1", 1.0, c, 1) for c in (64, 256)]
    if not args.quick:
        cases += [Case("fixed:1", 1.0, 512, 1), Case("fixed:2", 2.0, 1024, 1), Case("fixed:1", 1.0, 256, 2)]
        cases += [Case("lognormal:2:10", 2.0, 256, 1)]
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
        for case in cases:
            tasks = max(200, int(case.concurrency * case.processes * 6 / case.median_s))
            result = run_case(case, url, workdir, tasks)
            results.append(result)
            print(
                f"{case.name:>28}: {result['tasks_per_s']:7.1f} tasks/s, {result['ratio']:.2f} of Little's law "
                f"({result['littles_law_limit']:.0f}), in flight max {result['most_inflight']} mean "
                f"{result['mean_inflight']}, worker CPU {result['worker_cpu_ms_per_task']} ms/task, server "
                f"{result['server_cpu_ms_per_task']} ms/task, RSS {result['worker_rss_mib']:.0f} MiB, "
                f"{result['pg_connections_per_worker']} PG connections/worker"
                + ("" if result["all_terminal"] and not result["replay_findings"] else "  ** NOT ALL VERIFIED **"),
                flush=True,
            )
    by_name = {r["case"]: r for r in results}
    one_turn = [r["worker_cpu_ms_per_task"] for r in results if r["case"].startswith("fixed:1 ")]
    targets = [
        target("worker CPU per model turn, ms (median)", sorted(one_turn)[len(one_turn) // 2], "<", 2.5, "issue #18")
    ]
    if "fixed:2 c=1024 p=1" in by_name:
        big = by_name["fixed:2 c=1024 p=1"]
        targets += [
            target("model calls in flight, one worker", big["most_inflight"], ">=", 1000, "issue #18"),
            target("worker RSS at 1,024 in hand, MiB", big["worker_rss_mib"], "<", 300.01, "issue #18"),
            target("PostgreSQL connections, one worker", big["pg_connections_per_worker"], "<", 10.01, "issue #18"),
        ]
    if "fixed:1 c=512 p=1" in by_name:
        targets.append(
            target(
                "share of Little's law at 512 in flight",
                by_name["fixed:1 c=512 p=1"]["ratio"],
                ">=",
                0.8,
                "issue #18 (or within 1.2x of the CPU-bound rate)",
            )
        )
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
