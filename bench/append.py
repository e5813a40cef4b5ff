"""Append benchmark: what one transition costs through the engine, against raw SQL measured in the same run.

On PostgreSQL, with 1 and 4 concurrent writers (processes, each on its own task):

  (a) raw naive   psycopg by hand: BEGIN; UPDATE tasks ... WHERE seq = expected; INSERT event; COMMIT
  (b) raw best    the same work as one statement (a data-modifying CTE), autocommit, one round trip
  (c) engine      `Engine.transition` on a task the caller already holds (state and seq known)

and, with 1 writer, a stateless read-then-write: raw (BEGIN; SELECT; UPDATE; INSERT; COMMIT)
against `Engine.fire` (load, then append). Beside that self-loop (one task, `{"n": i}`), the peer shape of
issue #33: each operation on a different one of 100 tasks, round robin, the tick carrying a pydantic-validated
payload of about 200 bytes with a nested dict (`harness.peer_args`): (b) and (c), and the stateless pair, on
PostgreSQL with 1 writer, and raw sqlite3 against `Engine.transition` on SQLite, each against its own raw
baseline in the same rounds. On SQLite (WAL): sqlite3 by hand (BEGIN IMMEDIATE;
UPDATE; INSERT; COMMIT) against the engine. Then `Engine.load` of a task with 10,000 events
from its snapshot. Last, what observability costs on SQLite, in this process: `Engine.transition`
with nothing turned on (and neither opentelemetry nor prometheus_client imported: checked) against
the same with metrics and traces on (the SDK's tracer provider, spans batched to an exporter that
drops them).

The raw baselines write what the engine writes: the tasks row (seq, state, status, last_hash,
updated_at) and an events row with every column, its canonical JSON data and its sha256 chain
hash, into the schema the Alembic migrations build. Before measuring, the engine loads and
verifies a task that the raw code advanced, which proves the rows are equivalent.

Rates are medians over interleaved rounds (each round: warm-up, then a timed run of fixed
duration). The last line of output is one JSON object: figures, baselines, ratios and targets.

    python bench/append.py            # full run, a few minutes
    python bench/append.py --quick    # under a minute
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import timeit
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    ACTOR,
    BENCH_WORKFLOW,
    Config,
    Pool,
    background_busy,
    bench_database,
    bench_parser,
    check_raw_matches_engine,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    summary,
    target,
    tick_engine,
)

from engine import (
    Engine,
    fold,
    migrations,
)
from engine.observability import hooks

WRITERS = (1, 4)
LOAD_EVENTS = 10_000


# -- the run --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    rounds: int
    warm_s: float
    run_s: float
    load_samples: int


FULL = Plan(rounds=5, warm_s=0.3, run_s=2.0, load_samples=500)
QUICK = Plan(rounds=2, warm_s=0.15, run_s=0.5, load_samples=200)

LABELS = {
    "naive": "(a) raw naive: BEGIN; UPDATE; INSERT; COMMIT",
    "best": "(b) raw best: one CTE statement, autocommit",
    "transition": "(c) engine: Engine.transition (task held)",
    "read_write": "raw read-then-write: BEGIN; SELECT; UPDATE; INSERT; COMMIT",
    "fire": "engine: Engine.fire (load, then append)",
    "peer_best": "peer shape (b) raw best: one CTE statement, autocommit",
    "peer_transition": "peer shape (c) engine: Engine.transition (task held)",
    "peer_read_write": "peer shape raw read-then-write: BEGIN; SELECT; UPDATE; INSERT; COMMIT",
    "peer_fire": "peer shape engine: Engine.fire (load, then append)",
}
SQLITE_LABELS = {
    "naive": "raw sqlite3: BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT",
    "transition": "engine: Engine.transition (task held)",
    "read_write": "raw read-then-write: BEGIN IMMEDIATE; SELECT; UPDATE; INSERT; COMMIT",
    "fire": "engine: Engine.fire (load, then append)",
    "peer_naive": "peer shape raw sqlite3: BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT",
    "peer_transition": "peer shape engine: Engine.transition (task held)",
}
#: The peer shape (issue #33), beside the self-loop: each operation on a different one of 100 tasks, round robin,
#: the tick carrying a pydantic-validated payload of about 200 bytes with a nested dict (`harness.peer_args`).
PEER_PG = ("peer_best", "peer_transition", "peer_read_write", "peer_fire")
PEER_SQLITE = ("peer_naive", "peer_transition")


def run_rounds(pool: Pool, plan: Plan, series: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Interleaved rounds: every (kind, writers) once per round, so drift touches them all alike."""
    samples: dict[tuple[str, int], list[tuple[float, float, float | None]]] = {s: [] for s in series}
    for r in range(plan.rounds):
        for kind, writers in series:
            samples[(kind, writers)].append(pool.measure(kind, writers, plan.warm_s, plan.run_s))
        print(f"  round {r + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
    return {s: summary(v) for s, v in samples.items()}


def measure_load(url: str, plan: Plan) -> dict[str, Any]:
    """`Engine.load` of a task with 10,000 events (written by the engine, so its snapshots are the
    engine's own); then again with the most events past the newest snapshot that the engine leaves."""
    eng = tick_engine(url)
    try:
        task_id = eng.start(BENCH_WORKFLOW.name, {}, actor=ACTOR)
        task = eng.load(task_id)
        t0 = time.perf_counter()
        for n in range(1, LOAD_EVENTS):
            task = eng.transition(task, "tick", {"n": n}, actor=ACTOR)
        build_s = time.perf_counter() - t0
        assert task.seq == LOAD_EVENTS

        def past_snapshot() -> int:
            snaps = eng.store.snapshots(task_id)
            return task.seq - (snaps[-1].seq if snaps else 0)

        out: dict[str, Any] = {
            "events": LOAD_EVENTS,
            "snapshot_every": eng.snapshot_every,
            "build_transitions_per_s": round((LOAD_EVENTS - 1) / build_s),
            "past_snapshot": past_snapshot(),
            "at_snapshot_ms": _time_loads(eng, task_id, plan.load_samples),
        }
        for n in range(eng.snapshot_every - 1 - past_snapshot()):
            task = eng.transition(task, "tick", {"n": n}, actor=ACTOR)
        out["tail_events"] = past_snapshot()
        out["with_tail_ms"] = _time_loads(eng, task_id, plan.load_samples)
        # For context only: what the snapshot saves (read every event and fold from zero).
        samples = []
        for _ in range(3 if plan is FULL else 1):
            t0 = time.perf_counter()
            fold(BENCH_WORKFLOW, eng.store.events(task_id))
            samples.append((time.perf_counter() - t0) * 1000)
        out["fold_from_zero_ms"] = round(statistics.median(samples), 1)
        return out
    finally:
        eng.close()


def _time_loads(eng: Engine, task_id: str, samples: int) -> dict[str, float]:
    for _ in range(50):
        eng.load(task_id)
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        eng.load(task_id)
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "median": round(statistics.median(times), 3),
        "p95": round(statistics.quantiles(times, n=20)[-1], 3),
        "mean": round(statistics.fmean(times), 3),
    }


def measure_observability(url: str, plan: Plan) -> dict[str, Any]:
    """Transitions per second on a held task, observability off and on, in interleaved rounds."""
    libraries = {"opentelemetry", "prometheus_client"}
    loaded = sorted(libraries & {m.split(".")[0] for m in sys.modules})
    assert not loaded, f"imported before anything was turned on: {loaded}"
    eng = tick_engine(url)
    try:
        task = eng.load(eng.start(BENCH_WORKFLOW.name, {}, actor=ACTOR))
        off_loaded = sorted(libraries & {m.split(".")[0] for m in sys.modules})
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        rates: dict[str, list[float]] = {"off": [], "on": []}
        n = 0
        for _ in range(plan.rounds):
            for mode in ("off", "on"):
                hooks.disable()
                if mode == "on":
                    hooks.enable_metrics()
                    hooks.enable_tracing(provider)
                for deadline, timed in ((plan.warm_s, False), (plan.run_s, True)):
                    done, t0 = 0, time.perf_counter()
                    while time.perf_counter() - t0 < deadline:
                        n += 1
                        task = eng.transition(task, "tick", {"n": n}, actor=ACTOR)
                        done += 1
                    if timed:
                        rates[mode].append(done / (time.perf_counter() - t0))
        hooks.disable()
        provider.shutdown()
    finally:
        eng.close()
    # What "off" costs: the flag each hook point reads (two per transition a worker makes: the step and the append).
    flag_ns = min(timeit.repeat("hooks.active", globals={"hooks": hooks}, number=1_000_000, repeat=5)) * 1000
    return {
        "libraries_imported_while_off": off_loaded,
        "flag_check_ns": round(flag_ns, 1),
        **{mode: {"median": round(statistics.median(r)), "rounds": [round(x) for x in r]} for mode, r in rates.items()},
    }


def _figure_line(label: str, fig: dict[str, Any]) -> str:
    spread = f"[{fig['min']}-{fig['max']}]"
    busy = "" if fig["machine_cpu_busy"] is None else f"{fig['machine_cpu_busy'] * 100:>5.0f} %"
    return f"    {label:<66} {fig['median']:>6} {spread:<13} {fig['client_cpu_us']:>6.0f} us {busy}"


def task_updates(pg_url: str) -> dict[str, int]:
    """How many UPDATEs of `tasks` the PostgreSQL series made, and how many were HOT (the new row version on the
    same page, no index written: issue #33, migration 0018). Read once the writers' connections have closed,
    which is when their statistics are flushed."""
    with psycopg.connect(libpq(pg_url)) as conn:
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks'"
        ).fetchone()
    assert row is not None
    return {"updates": int(row[0]), "hot": int(row[1])}


def measure_all(plan: Plan, pg_url: str | None, sqlite_url: str) -> dict[str, Any]:
    cfg = Config(pg_url=pg_url, sqlite_url=sqlite_url)
    for backend in (["pg"] if pg_url else []) + ["sqlite"]:
        check_raw_matches_engine(cfg, backend)
    out: dict[str, Any] = {}
    pool = Pool(cfg, max(WRITERS) if pg_url else 1)
    try:
        if pg_url is not None:
            series = [(f"pg:{k}", 1) for k in ("naive", "best", "transition", "read_write", "fire", *PEER_PG)]
            series += [(f"pg:{k}", 4) for k in ("naive", "best", "transition")]
            figures = run_rounds(pool, plan, series)
            out["postgresql"] = {
                str(w): {k.split(":")[1]: v for (k, n), v in figures.items() if n == w} for w in WRITERS
            }
        kinds = ("naive", "transition", "read_write", "fire", *PEER_SQLITE)
        figures = run_rounds(pool, plan, [(f"sqlite:{k}", 1) for k in kinds])
        out["sqlite"] = {k.split(":")[1]: v for (k, _), v in figures.items()}
    finally:
        pool.close()
    if pg_url is not None:
        out["postgresql_updates"] = task_updates(pg_url)
    print(f"  loading a task with {LOAD_EVENTS:,} events ...", file=sys.stderr, flush=True)
    out["load"] = {"sqlite": measure_load(sqlite_url, plan)}
    if pg_url is not None:
        out["load"]["postgresql"] = measure_load(pg_url, plan)
    print("  observability off and on ...", file=sys.stderr, flush=True)
    out["observability"] = measure_observability(sqlite_url, plan)
    return out


def ratios_and_targets(
    fig: dict[str, Any],
) -> tuple[dict[str, float], dict[str, list[float]], list[dict[str, Any]]]:
    """Ratios of medians (what the targets judge), and the same ratio round by round (its spread)."""
    ratios: dict[str, float] = {}
    per_round: dict[str, list[float]] = {}

    def ratio(name: str, top: dict[str, Any], bottom: dict[str, Any]) -> None:
        ratios[name] = top["median"] / bottom["median"]
        per_round[name] = [round(a / b, 3) for a, b in zip(top["rounds"], bottom["rounds"], strict=True)]

    pg = fig.get("postgresql")
    if pg is not None:
        one, four = pg["1"], pg["4"]
        ratio("pg_1w_transition_vs_naive", one["transition"], one["naive"])
        ratio("pg_1w_transition_vs_best", one["transition"], one["best"])
        ratio("pg_1w_fire_vs_read_write", one["fire"], one["read_write"])
        ratio("pg_4w_vs_1w_engine", four["transition"], one["transition"])
        ratio("pg_4w_vs_1w_raw_naive", four["naive"], one["naive"])
        ratio("pg_4w_vs_1w_raw_best", four["best"], one["best"])
        ratio("pg_4w_transition_vs_naive", four["transition"], four["naive"])
        ratio("pg_4w_transition_vs_best", four["transition"], four["best"])
        ratio("pg_peer_transition_vs_best", one["peer_transition"], one["peer_best"])
        ratio("pg_peer_fire_vs_read_write", one["peer_fire"], one["peer_read_write"])
    sq = fig["sqlite"]
    ratio("sqlite_transition_vs_raw", sq["transition"], sq["naive"])
    ratio("sqlite_fire_vs_read_write", sq["fire"], sq["read_write"])
    ratio("sqlite_peer_transition_vs_raw", sq["peer_transition"], sq["peer_naive"])
    ratio("sqlite_observed_vs_plain", fig["observability"]["on"], fig["observability"]["off"])

    def ratio_target(name: str, threshold: float, note: str) -> dict[str, Any]:
        return target(name, ratios.get(name), ">=", threshold, note, per_round.get(name))

    pg_load = fig["load"].get("postgresql")
    updates = fig.get("postgresql_updates")
    targets = [
        target(
            "pg_hot_update_share",
            round(updates["hot"] / updates["updates"], 3) if updates and updates["updates"] else None,
            ">=",
            0.9,
            "issue #33: UPDATEs of tasks that were HOT (no index written), every PostgreSQL series of the run",
        ),
        ratio_target("pg_1w_transition_vs_naive", 1.0, "Engine.transition / (a) raw naive, PostgreSQL, 1 writer"),
        ratio_target(
            "pg_1w_transition_vs_best", 0.7, "Engine.transition / (b) raw best (one CTE), PostgreSQL, 1 writer"
        ),
        ratio_target("pg_1w_fire_vs_read_write", 1.0, "Engine.fire / raw read-then-write, PostgreSQL, 1 writer"),
        ratio_target(
            "pg_peer_transition_vs_best",
            0.8,
            "issue #33, peer shape: Engine.transition / one raw CTE statement, 100 tasks round robin, PostgreSQL",
        ),
        ratio_target(
            "pg_peer_fire_vs_read_write",
            1.0,
            "issue #33, peer shape: Engine.fire / raw select + update + insert, PostgreSQL",
        ),
        ratio_target(
            "sqlite_peer_transition_vs_raw",
            0.5,
            "issue #33, peer shape: Engine.transition / raw sqlite3 insert + update, WAL, synchronous=NORMAL",
        ),
        ratio_target("pg_4w_vs_1w_engine", 2.5, "Engine.transition, 4 writer processes / 1, one task each, PostgreSQL"),
        ratio_target(
            "sqlite_transition_vs_raw",
            0.3,
            "Engine.transition / raw sqlite3 (BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT), WAL",
        ),
        ratio_target(
            "sqlite_observed_vs_plain",
            0.7,
            "Engine.transition with metrics and traces on / with nothing on, SQLite, one process",
        ),
        target(
            "sqlite_libraries_imported_while_off",
            len(fig["observability"]["libraries_imported_while_off"]),
            "<",
            1,
            "opentelemetry and prometheus_client modules loaded while nothing is turned on",
        ),
        target(
            "pg_load_10k_ms",
            pg_load["at_snapshot_ms"]["median"] if pg_load else None,
            "<",
            5.0,
            "median Engine.load, 10,000 events, from its snapshot, PostgreSQL",
        ),
        target(
            "sqlite_load_10k_ms",
            fig["load"]["sqlite"]["at_snapshot_ms"]["median"],
            "<",
            5.0,
            "median Engine.load, 10,000 events, from its snapshot, SQLite",
        ),
    ]
    return ratios, per_round, targets


def report(
    fig: dict[str, Any],
    pg: dict[str, Any],
    ratios: dict[str, float],
    per_round: dict[str, list[float]],
    targets: list[dict[str, Any]],
) -> None:
    header = f"    {'transitions per second':<66} {'median':>6} {'[min-max]':<13} {'client CPU':>9} {'CPUs busy':>9}"
    print()
    if "postgresql" in fig:
        print(f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']})")
        print(header)
        for w in WRITERS:
            print(f"  {w} writer" + (" processes, one task each" if w > 1 else ""))
            for key, one in fig["postgresql"][str(w)].items():
                print(_figure_line(LABELS[key], one))
    updates = fig.get("postgresql_updates")
    if updates:
        print(f"  UPDATEs of tasks: {updates['updates']:,}, of which HOT (no index written): {updates['hot']:,}")
    print("SQLite (WAL, synchronous=NORMAL), 1 writer")
    print(header)
    for key, one in fig["sqlite"].items():
        print(_figure_line(SQLITE_LABELS[key], one))
    print(
        f"Engine.load of a task with {LOAD_EVENTS:,} events (snapshot every "
        f"{fig['load']['sqlite']['snapshot_every']} events), milliseconds:"
    )
    for backend, one in fig["load"].items():
        at, tail = one["at_snapshot_ms"], one["with_tail_ms"]
        print(
            f"    {backend:<10} {one['past_snapshot']} events past the newest snapshot: median {at['median']}, "
            f"p95 {at['p95']}; {one['tail_events']} events past it: median {tail['median']}, p95 {tail['p95']}; "
            f"no snapshot (fold from zero): {one['fold_from_zero_ms']}"
        )
    obs = fig["observability"]
    print(
        f"Observability (SQLite, Engine.transition, one process): off {obs['off']['median']}/s, "
        f"metrics and traces on {obs['on']['median']}/s; libraries imported while off: "
        f"{obs['libraries_imported_while_off'] or 'none'}; one flag check while off: {obs['flag_check_ns']} ns"
    )
    print("Ratios (of the medians; in brackets the same ratio round by round, lowest to highest):")
    for name, value in ratios.items():
        print(f"    {name:<34} {value:5.2f}x  [{min(per_round[name]):.2f}-{max(per_round[name]):.2f}]")
    print_targets(targets)


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    plan = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    idle_busy = background_busy(1.0 if plan is FULL else 0.5)
    print(
        f"Railyard append benchmark ({mode}: {plan.rounds} interleaved rounds x {plan.run_s} s per figure after "
        f"a {plan.warm_s} s warm-up; figures are medians over rounds)",
        flush=True,
    )

    host = machine(None)
    print(
        f"Machine: {host['nproc']} CPUs ({host['cpu']}), Python {host['python']}, SQLite {host['sqlite']}, "
        f"railyard {host['commit']}"
    )
    print_background(idle_busy)
    with (
        bench_database(pg_server_url(args.postgres_url)) as (pg_url, pg),
        tempfile.TemporaryDirectory(prefix="railyard_bench_") as tmp,
    ):
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        migrations.upgrade(sqlite_url)
        if pg_url is not None:
            migrations.upgrade(pg_url)
        fig = measure_all(plan, pg_url, sqlite_url)

    ratios, per_round, targets = ratios_and_targets(fig)
    report(fig, pg, ratios, per_round, targets)
    elapsed = time.perf_counter() - started
    print(f"({elapsed:.0f} s)")

    def median(*path: str) -> float | None:
        node: Any = fig
        for key in path:
            if key not in node:
                return None
            node = node[key]
        return float(node["median"])

    result = {
        "bench": "append",
        "mode": mode,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(elapsed, 1),
        "plan": {"rounds": plan.rounds, "run_s": plan.run_s, "warm_s": plan.warm_s},
        "machine": machine(pg.get("server_version")),
        "background_cpu_busy": None if idle_busy is None else round(idle_busy, 3),
        "postgresql": pg,
        "unit": "transitions per second; load in milliseconds",
        "figures": {
            "pg_1w_engine_transition": median("postgresql", "1", "transition"),
            "pg_1w_engine_fire": median("postgresql", "1", "fire"),
            "pg_4w_engine_transition": median("postgresql", "4", "transition"),
            "sqlite_engine_transition": median("sqlite", "transition"),
            "sqlite_engine_fire": median("sqlite", "fire"),
            "sqlite_engine_transition_observed": median("observability", "on"),
            "pg_load_10k_ms": fig["load"]["postgresql"]["at_snapshot_ms"]["median"] if pg_url else None,
            "sqlite_load_10k_ms": fig["load"]["sqlite"]["at_snapshot_ms"]["median"],
        },
        "baselines": {
            "pg_1w_raw_naive": median("postgresql", "1", "naive"),
            "pg_1w_raw_best": median("postgresql", "1", "best"),
            "pg_1w_raw_read_write": median("postgresql", "1", "read_write"),
            "pg_4w_raw_naive": median("postgresql", "4", "naive"),
            "pg_4w_raw_best": median("postgresql", "4", "best"),
            "sqlite_raw": median("sqlite", "naive"),
            "sqlite_raw_read_write": median("sqlite", "read_write"),
            "sqlite_engine_transition_unobserved": median("observability", "off"),
        },
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "ratios_per_round": per_round,
        "targets": targets,
        "all_met": all(t["met"] is True for t in targets),
        "detail": fig,
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
