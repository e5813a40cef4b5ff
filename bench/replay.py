"""Replay benchmark: how fast `Engine.replay` checks logs read from PostgreSQL, against a raw read of the same rows.

On PostgreSQL (the engine for real audits):

  (a) one task with 100,000 events      `Engine.replay(task, jobs=N)`: every hash recomputed, the chain, seq,
                                         each transition's legality, the fold against the row and
                                         every snapshot (one every 10 events, as the engine writes them)
  (b) 10,000 tasks x 20 events           `Engine.audit.replay_all(workflow=..., jobs=N)`, the same checks per task
  raw                                    psycopg by hand: `SELECT <every events column> ... ORDER BY ...`
                                         of the same rows, fetched, nothing computed

N is the number of CPUs available, what `railyard replay` uses by default (`engine.audit.parallel`); the
same replays in one process (`jobs=1`) are measured next to them. And the peak memory (`ru_maxrss`)
of `Engine.audit.replay_all(jobs=N)` over every task, of its process and of its largest job, each run in its
own subprocess, once over the data of (a) and (b) and again after more long tasks bring the database
to 1,000,000 events: flat memory means the two are about the same. The subprocesses are started
before any data is generated, because Linux carries a parent's peak RSS into a child across exec.

Next to each rate it prints the measuring process's own CPU time per row: on a machine that other
work keeps busy the rates fall, the CPU time much less.

The data is sealed with the engine's own hash chain (real hashes over real bodies: the hash `seal`
computes, `harness.sealed_log`), its snapshots folded with the engine's own `apply`, and bulk-loaded
with COPY (`harness.BulkLoad`): nothing goes through `Engine.fire`. Before
measuring, `Engine.load` and `Engine.replay` accept a generated task, which proves the rows are ones
the engine wrote or would write.

Rates are medians over rounds (each round: raw then engine, interleaved). The last line of output is one
JSON object: figures, baselines, ratios and targets.

    python bench/replay.py            # full run, several minutes (1,000,000 events are generated)
    python bench/replay.py --quick    # under a minute
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from harness import (
    BUSY_WARNING,
    EVENT_COLUMNS,
    SNAPSHOT_EVERY,
    background_busy,
    bench_database,
    bench_parser,
    libpq,
    load_tasks,
    machine,
    pg_server_url,
    print_targets,
    replay_all_memory,
    start_memory_child,
    target,
    tick_workflow,
)

from engine import Engine, Registry, StaticRoles, migrations
from engine.audit.parallel import available_jobs

#: (a) and (b) live in two workflows, so replay_all(workflow=...) reads exactly (b)'s tasks.
LONG = tick_workflow("bench_long")
SHORT = tick_workflow("bench_short")


@dataclass(frozen=True)
class Plan:
    rounds: int
    long_events: int
    short_tasks: int
    short_events: int
    memory_total: int  # events in the database for the second memory measurement


FULL = Plan(rounds=5, long_events=100_000, short_tasks=10_000, short_events=20, memory_total=1_000_000)
QUICK = Plan(rounds=2, long_events=20_000, short_tasks=1_000, short_events=20, memory_total=120_000)


def make_engine(url: str) -> Engine:
    return Engine(url, registry=Registry([LONG, SHORT]), authoriser=StaticRoles({}), snapshot_every=SNAPSHOT_EVERY)


# -- measurements --------------------------------------------------------------------------------------------
#: (wall seconds, rows or events, this process's CPU seconds)
Sample = tuple[float, int, float]


def raw_read(dsn: str, sql: str, params: tuple[Any, ...]) -> Sample:
    """A plain SELECT of every events column, fetched by psycopg and dropped."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        started, cpu = time.perf_counter(), time.process_time()
        cur.execute(sql, params)
        n = 0
        while batch := cur.fetchmany(10_000):
            n += len(batch)
        return time.perf_counter() - started, n, time.process_time() - cpu


def replay_one(eng: Engine, task_id: str, jobs: int) -> Sample:
    started, cpu = time.perf_counter(), time.process_time()
    report = eng.replay(task_id, jobs=jobs)
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    assert report.ok, report.findings[:3]
    return elapsed, report.events, used


def replay_many(eng: Engine, workflow: str, jobs: int) -> Sample:
    started, cpu = time.perf_counter(), time.process_time()
    events = 0
    for report in eng.audit.replay_all(workflow=workflow, jobs=jobs):
        assert report.ok, (report.task_id, report.findings[:3])
        events += report.events
    return time.perf_counter() - started, events, time.process_time() - cpu


def median_rate(samples: list[Sample]) -> dict[str, Any]:
    """Rate per wall second, and the client's own CPU per row (what the rate would be bound by alone)."""
    rates = [n / s for s, n, _ in samples]
    cpu = [c / n * 1e6 for _, n, c in samples]
    return {
        "median": round(statistics.median(rates)),
        "rounds": [round(r) for r in rates],
        "client_cpu_us": round(statistics.median(cpu), 2),
    }


def check_generated(eng: Engine, task_id: str) -> None:
    """The bulk rows are rows the engine accepts: it loads the task and its replay finds nothing."""
    task = eng.load(task_id)
    assert task.seq == len(list(eng.store.audit_stream(task_ids=[task_id], with_snapshots=False))) - 1
    assert eng.replay(task_id).ok


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    plan = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    idle_busy = background_busy(0.5)
    host = machine(None)
    print(
        f"Railyard replay benchmark ({mode}: {plan.rounds} rounds; one task of {plan.long_events:,} events, "
        f"{plan.short_tasks:,} tasks x {plan.short_events} events, memory up to {plan.memory_total:,} events)"
    )
    print(f"Machine: {host['nproc']} CPUs ({host['cpu']}), Python {host['python']}, railyard {host['commit']}")
    if idle_busy is not None and idle_busy >= BUSY_WARNING:
        print(f"WARNING: the CPUs were {idle_busy * 100:.0f} % busy with other work before the run", flush=True)
    jobs = available_jobs()
    print(f"Parallel replay: {jobs} jobs (one per CPU available, as `railyard replay` does by default)")
    children = [start_memory_child(jobs), start_memory_child(jobs)]
    with bench_database(pg_server_url(args.postgres_url)) as (url, pg):
        if url is None:
            for child in children:
                child.kill()
            print("PostgreSQL is required for this benchmark; nothing measured.")
            print(json.dumps({"bench": "replay", "mode": mode, "measured": False, "postgresql": pg}))
            return 1
        migrations.upgrade(url)
        dsn = libpq(url)
        t0 = time.perf_counter()
        long_id = load_tasks(dsn, LONG, 1, plan.long_events)[0]
        short_ids = load_tasks(dsn, SHORT, plan.short_tasks, plan.short_events)
        print(
            f"  generated and loaded {plan.long_events + plan.short_tasks * plan.short_events:,} events in "
            f"{time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        with make_engine(url) as eng:
            check_generated(eng, long_id)
            check_generated(eng, short_ids[0])
            one_sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE task_id = %s ORDER BY seq"
            many_sql = (
                f"SELECT {EVENT_COLUMNS} FROM events WHERE task_id IN (SELECT task_id FROM tasks WHERE "
                "workflow = %s) ORDER BY task_id, seq"
            )
            samples: dict[str, list[Sample]] = {
                "raw_one": [],
                "engine_one": [],
                "serial_one": [],
                "raw_many": [],
                "engine_many": [],
                "serial_many": [],
            }
            for round_no in range(plan.rounds):
                samples["raw_one"].append(raw_read(dsn, one_sql, (long_id,)))
                samples["engine_one"].append(replay_one(eng, long_id, jobs))
                samples["serial_one"].append(replay_one(eng, long_id, 1))
                samples["raw_many"].append(raw_read(dsn, many_sql, (SHORT.name,)))
                samples["engine_many"].append(replay_many(eng, SHORT.name, jobs))
                samples["serial_many"].append(replay_many(eng, SHORT.name, 1))
                print(f"  round {round_no + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
        figures = {name: median_rate(s) for name, s in samples.items()}
        print("  replay --all in a subprocess ...", file=sys.stderr, flush=True)
        memory_small = replay_all_memory(children[0], url)
        have = plan.long_events + plan.short_tasks * plan.short_events
        extra = max(0, plan.memory_total - have)
        t0 = time.perf_counter()
        for _ in range(extra // plan.long_events):
            load_tasks(dsn, LONG, 1, plan.long_events)
        if extra % plan.long_events:
            load_tasks(dsn, LONG, 1, extra % plan.long_events)
        print(f"  loaded {extra:,} more events in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        memory_large = replay_all_memory(children[1], url)
    assert memory_small["findings"] == memory_large["findings"] == 0

    one, many = figures["engine_one"]["median"], figures["engine_many"]["median"]
    ratios = {
        "one_task_vs_raw": one / figures["raw_one"]["median"],
        "many_tasks_vs_raw": many / figures["raw_many"]["median"],
    }
    growth = max(memory_large["peak_rss_mb"], memory_large["worker_peak_rss_mb"]) - max(
        memory_small["peak_rss_mb"], memory_small["worker_peak_rss_mb"]
    )
    targets = [
        target(
            "one_task_events_per_s",
            one,
            ">=",
            100_000,
            f"Engine.replay(jobs={jobs}), one task of {plan.long_events:,} events, hashes verified",
        ),
        target(
            "many_tasks_events_per_s",
            many,
            ">=",
            100_000,
            f"Engine.audit.replay_all(jobs={jobs}), {plan.short_tasks:,} tasks x {plan.short_events} events",
        ),
        target("one_task_vs_raw", ratios["one_task_vs_raw"], ">=", 0.3, "replay / raw SELECT, one task"),
        target("many_tasks_vs_raw", ratios["many_tasks_vs_raw"], ">=", 0.3, "replay_all / raw SELECT, many tasks"),
        target(
            "peak_rss_mb",
            max(memory_large["peak_rss_mb"], memory_large["worker_peak_rss_mb"]),
            "<",
            200.0,
            f"replay --all over {memory_large['events']:,} events, peak RSS of the process and of each job",
        ),
        target(
            "rss_growth_mb",
            growth,
            "<",
            20.0,
            f"peak RSS over {memory_large['events']:,} events minus over {memory_small['events']:,}",
        ),
    ]
    elapsed = time.perf_counter() - started
    print()
    print(
        f"PostgreSQL {pg['server_version']}, events per second (median of {plan.rounds} rounds [min-max]), and "
        "this process's CPU time per row (median):"
    )
    for name, label in (
        ("raw_one", f"raw SELECT, one task of {plan.long_events:,} events"),
        ("engine_one", f"Engine.replay, same task, {jobs} jobs"),
        ("serial_one", "Engine.replay, same task, in one process"),
        ("raw_many", f"raw SELECT, {plan.short_tasks:,} tasks x {plan.short_events} events"),
        ("engine_many", f"Engine.replay_all, same tasks, {jobs} jobs"),
        ("serial_many", "Engine.replay_all, same tasks, in one process"),
    ):
        fig = figures[name]
        whose = " (this process; the jobs' own CPU is not counted)" if name.startswith("engine") else ""
        print(
            f"    {label:<52} {fig['median']:>9,}  [{min(fig['rounds']):,}-{max(fig['rounds']):,}]  "
            f"client CPU {fig['client_cpu_us']} µs per row{whose}"
        )
    for memory in (memory_small, memory_large):
        print(
            f"    replay --all over {memory['events']:>9,} events in {memory['tasks']:,} tasks: peak RSS "
            f"{memory['peak_rss_mb']} MB, largest job {memory['worker_peak_rss_mb']} MB (interpreter and imports "
            f"alone: {memory['import_rss_mb']} MB), "
            f"{memory['events_per_s']:,} events/s"
        )
    print_targets(targets)
    print(f"({elapsed:.0f} s)")
    result = {
        "bench": "replay",
        "mode": mode,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(elapsed, 1),
        "plan": plan.__dict__,
        "machine": machine(pg.get("server_version")),
        "background_cpu_busy": None if idle_busy is None else round(idle_busy, 3),
        "unit": "events per second; memory in MB",
        "figures": {
            "one_task_events_per_s": one,
            "many_tasks_events_per_s": many,
            "one_task_client_cpu_us": figures["engine_one"]["client_cpu_us"],
            "many_tasks_client_cpu_us": figures["engine_many"]["client_cpu_us"],
            "jobs": jobs,
            "one_task_serial_events_per_s": figures["serial_one"]["median"],
            "many_tasks_serial_events_per_s": figures["serial_many"]["median"],
            "peak_rss_mb": memory_large["peak_rss_mb"],
            "rss_growth_mb": round(growth, 1),
        },
        "baselines": {
            "raw_one_task_rows_per_s": figures["raw_one"]["median"],
            "raw_many_tasks_rows_per_s": figures["raw_many"]["median"],
        },
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "targets": targets,
        "all_met": all(t["met"] is True for t in targets),
        "detail": {"rates": figures, "memory": [memory_small, memory_large]},
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
