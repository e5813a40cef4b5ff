"""Scale benchmark: whether what workers, the pages and operators run stays flat when PostgreSQL holds a million
tasks and ten million events, against the same measurements at 10,000 tasks in the same run.

Two databases on the same server, measured side by side. The small one holds the live work only: 10,000 tasks
of 10 events each, 9,000 of them runnable (due, at an agent state) and 1,000 waiting at an approval. The large
one holds the same live work and 990,000 finished tasks of 10 events each (1,000,000 tasks, 10,000,000 events).
In each of 5 rounds every latency below is measured on one database and then the other (which goes first
alternates), so that a machine that slows down or speeds up touches both alike; the figure is the median of
the rounds:

  claim             `Store.claim(owner, limit=1, lease_seconds=60)` as a worker calls it; each claimed task is
                    then postponed to now (so the next claim takes the next due task, as a step's append does)
                    and released, untimed
  load              `Engine.load` of a task drawn at random from the database's tasks (row, snapshot, events
                    after it), live and finished ones in proportion
  approvals         `queries.approvals(limit=50)`, what `GET /api/approvals` runs
  work queue        `engine.api.views.work_queue` for a holder of the approval role, what `/work` and
                    `GET /api/work` run (the counts per kind, then a page of 50 rows, no task loaded)
  status            what `railyard status` runs: `Store.status_counts` and `Store.workers`

Then, for each database:

  replay            `Engine.audit.replay_all(jobs=N)` over every task, in a process of its own started before any
                    data was generated: events per second and its peak RSS (and its largest job's); the small
                    database is replayed before and after the large one, and its rate is the mean of the two
  bytes             `pg_table_size`, `pg_indexes_size` and `pg_total_relation_size` of events, tasks and
                    snapshots per row, and the database's size per event

Each latency is the p50 (and the p99) of many calls after a warm-up, with both databases vacuumed and analysed
after their load (what autovacuum would have done by then). The target of each figure: within 1.5x of the same
figure at 10,000 tasks.

The data is the engine's own: one task of each kind (ended, runnable, at the approval) is run by the real
`Engine` with a `ScriptedModel` on a `MemoryStore`; its events (the same transitions and data, agent turns
included) are sealed again for every generated task with the engine's hash chain and folded with its `apply`
(`harness.sealed_log`), and bulk-loaded with binary COPY (`harness.BulkLoad`), indexes, foreign keys and the
database's triggers in place, by one process per CPU. Before measuring, each kind of generated task is loaded
by `Engine.load`, its chain checked by `verify_chain`, and `Engine.replay` finds nothing in it; the replay of
every task then proves all of them.

    python bench/scale.py                  # full run: 1,000,000 tasks, 5 minutes on 2 idle CPUs (16 busy), 12 GB
    python bench/scale.py --tasks 100000   # the same with 100,000 tasks in the large database
    python bench/scale.py --quick          # 1,000 live tasks, 10,000 in all: about a minute, a smoke test
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from harness import (
    ACTOR,
    SNAPSHOT_EVERY,
    BulkLoad,
    Step,
    background_busy,
    bench_database,
    bench_parser,
    cpu_ticks,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    replay_all_memory,
    sealed_log,
    start_memory_child,
    steps_of,
    target,
    wait_quiet,
)
from pydantic import BaseModel, ConfigDict
from sqlalchemy import event

from engine import (
    ANYONE,
    Action,
    Agent,
    Approval,
    Engine,
    MemoryStore,
    Registry,
    ScriptedModel,
    SqlStore,
    StaticRoles,
    Terminal,
    Workflow,
    migrations,
    verify_chain,
)
from engine.api.tokens import Principal
from engine.api.views import work_queue
from engine.audit.parallel import available_jobs
from engine.core.canonical import now
from engine.runtime import queries
from engine.store import postgres

APPROVER = "ann"
ROLE = "approver"
PAGE = 50


class TickArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    note: str


class AskArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str


#: An agent state that loops (each turn a real agent event), can ask for an approval, or ends.
SCALE = Workflow(
    name="bench_scale",
    version=1,
    description="Agent turns that loop, ask a person, or end: the shapes of tasks a database fills with.",
    states=[
        Agent(
            "working",
            actions=[Action("tick", "working", TickArgs), Action("ask", "review", AskArgs), Action("finish", "done")],
        ),
        Approval("review", role=ROLE, actions=[Action("approve", "done"), Action("reject", "done")]),
        Terminal("done"),
    ],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)

EVENTS_PER_TASK = 10


def make_engine(url: str) -> Engine:
    return Engine(
        url, registry=Registry([SCALE]), authoriser=StaticRoles({APPROVER: [ROLE]}), snapshot_every=SNAPSHOT_EVERY
    )


# -- the data ---------------------------------------------------------------------------------------------
def _tick(n: int) -> dict[str, Any]:
    note = "checked the order, the customer's history and the refund policy"
    return {"tool_calls": [{"name": "tick", "arguments": {"n": n, "note": note}}]}


#: The model's turns for each kind of task: every task has EVENTS_PER_TASK events (`start` and 9 turns).
TURNS: dict[str, list[dict[str, Any]]] = {
    "ended": [*(_tick(n) for n in range(8)), {"tool_calls": [{"name": "finish", "arguments": {}}]}],
    "runnable": [_tick(n) for n in range(9)],
    "approval": [
        *(_tick(n) for n in range(8)),
        {"tool_calls": [{"name": "ask", "arguments": {"reason": "the amount is above the agent's limit"}}]},
    ],
}
STATUS = {"ended": "terminal", "runnable": "runnable", "approval": "blocked"}


def templates() -> dict[str, list[Step]]:
    """One log of each kind, written by the real engine (agent turns through `ScriptedModel`), as steps."""
    eng = Engine(store=MemoryStore(), registry=Registry([SCALE]), authoriser=StaticRoles({}))
    out = {}
    for kind, turns in TURNS.items():
        task_id = eng.start(SCALE.name, {}, actor=ACTOR)
        task = eng.run(task_id, model=ScriptedModel(turns), max_turns=len(turns))
        events = eng.store.events(task_id)
        assert len(events) == EVENTS_PER_TASK and str(task.status) == STATUS[kind], (kind, task.state, len(events))
        out[kind] = steps_of(events)
    return out


def load_kind(dsn: str, kind: str, count: int, start_at: datetime, spacing: timedelta, every: int) -> dict[str, Any]:
    """COPY `count` tasks of one kind, the n-th started at `start_at + n * spacing`; keeps every `every`-th id."""
    steps = templates()[kind]
    sample: list[str] = []
    started, cpu = time.perf_counter(), time.process_time()
    with BulkLoad(dsn) as bulk:
        for n in range(count):
            task = bulk.add(SCALE, sealed_log(SCALE, str(uuid.uuid4()), steps, start_at + n * spacing))
            if n % every == 0:
                sample.append(task.task_id)
    return {
        "events": count * len(steps),
        "seconds": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu,
        "sample": sample,
    }


def load_parallel(dsn: str, kind: str, count: int, start_at: datetime, end_at: datetime, keep: int) -> dict[str, Any]:
    """`load_kind` in one process per CPU (spawned: each opens its own connection), the time range cut in shares."""
    shares = max(1, min(available_jobs(), count))
    spacing = (end_at - start_at) / max(count, 1)
    sizes = [count // shares + (1 if i < count % shares else 0) for i in range(shares)]
    every = max(1, count // max(keep, 1))
    args = []
    first = 0
    for size in sizes:
        args.append((dsn, kind, size, start_at + first * spacing, spacing, every))
        first += size
    started = time.perf_counter()
    with mp.get_context("spawn").Pool(shares) as pool:
        parts = pool.starmap(load_kind, args)
    return {
        "events": sum(p["events"] for p in parts),
        "seconds": time.perf_counter() - started,
        "generator_cpu_s": sum(p["cpu_s"] for p in parts),
        "processes": shares,
        "sample": [tid for p in parts for tid in p["sample"]],
    }


def vacuum(dsn: str) -> float:
    """VACUUM (ANALYZE) the loaded tables, as autovacuum would have by then (and so that it does not start during a
    measurement); the seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # terminal_counts too: a bulk load updates its few rows once per COPY statement, leaving dead versions.
        for table in ("tasks", "events", "snapshots", "task_fields", "terminal_counts"):
            conn.execute(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - started


#: What `Engine.load` descends, and so what a server must keep in memory for a load to cost the same at any size:
#: the tasks' rows and the indexes that lead with the task id (the primary key, and the pattern index of the id
#: prefix search, which the planner takes for an equality as readily), the snapshots and their primary key, the
#: events' primary key (a task's events after its newest snapshot, whose rows a finished task does not have).
LOAD_RELATIONS = (
    "SELECT c.oid::regclass::text, pg_relation_size(c.oid) FROM pg_class c WHERE c.oid IN ("
    "'tasks'::regclass, 'snapshots'::regclass) OR c.oid IN ("
    "SELECT i.indexrelid FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
    "WHERE a.attname = 'task_id' AND (i.indrelid = 'tasks'::regclass OR i.indisprimary AND i.indrelid IN "
    "('snapshots'::regclass, 'events'::regclass))) ORDER BY 1"
)


def load_working_set(dsn: str) -> dict[str, int]:
    """The bytes of each relation `Engine.load` reads (`LOAD_RELATIONS`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: size for name, size in conn.execute(LOAD_RELATIONS).fetchall()}


def shared_buffers(dsn: str) -> int:
    """The server's `shared_buffers`, in bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT setting::bigint * pg_size_bytes(unit) FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def prewarm(dsn: str, relations: list[str]) -> str | None:
    """Read `relations` into `shared_buffers` (`pg_prewarm`), as a server that has been serving them holds them:
    a bulk load and a vacuum go through a small ring of buffers and leave almost nothing there. None when done,
    else why not."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
            for relation in relations:
                conn.execute("SELECT pg_prewarm(%s::regclass)", (relation,))
    except psycopg.Error as error:
        return f"{type(error).__name__}: {str(error).strip()}"
    return None


def memory_plan(small_dsn: str, large_dsn: str, warm: bool) -> dict[str, Any]:
    """`shared_buffers` against the loads' working sets; both prewarmed when `warm` and both fit."""
    buffers = shared_buffers(large_dsn)
    sets = {"small": load_working_set(small_dsn), "large": load_working_set(large_dsn)}
    total = sum(sum(found.values()) for found in sets.values())
    fits = total <= 0.9 * buffers  # room left for the claims', the pages' and the catalogs' own pages
    refused = None
    if warm and fits:
        for dsn, name in ((small_dsn, "small"), (large_dsn, "large")):
            refused = refused or prewarm(dsn, sorted(sets[name]))
    return {
        "shared_buffers_bytes": buffers,
        "load_working_set_bytes": {name: sum(found.values()) for name, found in sets.items()},
        "load_relations_bytes": sets,
        "fits": fits,
        "prewarmed": warm and fits and refused is None,
        "prewarm_refused": refused,
    }


def describe_memory(memory: dict[str, Any]) -> str:
    mib = 1024 * 1024
    sets = memory["load_working_set_bytes"]
    line = (
        f"shared_buffers {memory['shared_buffers_bytes'] / mib:,.0f} MiB; what Engine.load reads (tasks and snapshots, "
        f"their indexes by task id, the events' primary key) {sets['small'] / mib:,.0f} MiB small, "
        f"{sets['large'] / mib:,.0f} MiB large: "
    )
    if not memory["fits"]:
        return line + (
            "they do not fit: loads at the large size read some of their pages from the operating system's "
            "cache (docs/operations.md, PostgreSQL's memory); not prewarmed"
        )
    if memory["prewarm_refused"]:
        return line + f"they fit; not prewarmed ({memory['prewarm_refused']})"
    return line + ("they fit, prewarmed (pg_prewarm)" if memory["prewarmed"] else "they fit; not prewarmed")


def check_generated(eng: Engine, ids: dict[str, str]) -> None:
    """Each kind of generated task is one the engine accepts: it loads, its chain holds, its replay finds nothing."""
    for kind, task_id in ids.items():
        task = eng.load(task_id)
        assert str(task.status) == STATUS[kind] and task.seq == EVENTS_PER_TASK, (kind, task)
        findings = verify_chain(eng.store.events(task_id))
        assert not findings, (kind, findings[:3])
        report = eng.replay(task_id)
        assert report.ok, (kind, report.findings[:3])


# -- measurements -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    live: int  # tasks not ended: runnable ones and those at the approval
    approvals: int  # of them, at the approval
    tasks: int  # every task of the large database, once the finished ones are added
    rounds: int
    claims: int  # calls per round and database, of each kind
    loads: int
    pages: int
    queues: int
    statuses: int
    wait_s: float  # at most this long for other work to leave the CPUs alone before each round


FULL = Plan(
    live=10_000,
    approvals=1_000,
    tasks=1_000_000,
    rounds=5,
    claims=400,
    loads=400,
    pages=20,
    queues=6,
    statuses=20,
    wait_s=20,
)
QUICK = Plan(
    live=1_000, approvals=100, tasks=10_000, rounds=2, claims=100, loads=100, pages=5, queues=2, statuses=5, wait_s=2
)


class Database:
    """One of the two databases measured side by side: its engine, the tasks to load, what its status must count."""

    def __init__(self, name: str, url: str, ids: list[str], live: list[str], expect: dict[str, int]) -> None:
        self.name = name
        self.url = url
        self.eng = make_engine(url)
        # Each load takes a task not loaded before in the run, so that no round finds the pages an earlier one read.
        rng = random.Random(7)
        self.any_tasks = iter(rng.sample(ids, len(ids)))
        self.live_tasks = iter(rng.sample(live, len(live)))
        self.live = live
        self.expect = expect
        self.owner = f"bench-scale-{name}"
        self.principal = Principal(actor=APPROVER, roles=frozenset({ROLE}), token_hash="bench")

    def close(self) -> None:
        self.eng.close()

    def claim(self) -> float:
        """`Store.claim` as a worker calls it (timed); then, untimed, what the step's append would do to the
        task's due time (postponed to now: the next claim takes the next due task) and the release."""
        store = self.eng.store
        t0 = time.perf_counter()
        found = store.claim(self.owner, limit=1, lease_seconds=60)
        elapsed = time.perf_counter() - t0
        assert len(found) == 1, "a claim found no due task"
        for c in found:
            store.postpone(c.task_id, c.epoch, now())
            store.release(c.task_id, c.epoch)
        return elapsed

    def load(self) -> float:
        """`Engine.load` of any task: in the large database almost always a finished one, its pages rarely cached."""
        return self._load(next(self.any_tasks))

    def load_live(self) -> float:
        """`Engine.load` of a live task: what a worker's step does after its claim."""
        return self._load(next(self.live_tasks))

    def _load(self, task_id: str) -> float:
        t0 = time.perf_counter()
        self.eng.load(task_id)
        return time.perf_counter() - t0

    def approvals_page(self) -> float:
        t0 = time.perf_counter()
        found, _ = queries.approvals(self.eng, limit=PAGE)
        elapsed = time.perf_counter() - t0
        assert len(found) == min(PAGE, self.expect["blocked"]), len(found)
        return elapsed

    def work_queue(self) -> float:
        t0 = time.perf_counter()
        found = work_queue(self.eng, self.principal, limit=PAGE)
        elapsed = time.perf_counter() - t0
        assert len(found.rows) == min(PAGE, self.expect["blocked"]), len(found.rows)
        return elapsed

    def status(self) -> float:
        """What `railyard status` asks the store (engine/cli/tasks.py)."""
        t0 = time.perf_counter()
        at = now()
        counts = self.eng.store.status_counts(at)
        self.eng.store.workers(seen_since=at - timedelta(seconds=60))
        elapsed = time.perf_counter() - t0
        got = {c["status"]: c["tasks"] for c in counts}
        assert got == {k: v for k, v in self.expect.items() if v}, got
        return elapsed


#: The latencies, each measured in every round on both databases: (name, what runs, calls per round).
LATENCIES: list[tuple[str, Callable[[Database], float], Callable[[Plan], int]]] = [
    ("claim", Database.claim, lambda p: p.claims),
    ("load", Database.load, lambda p: p.loads),
    ("load_live", Database.load_live, lambda p: p.loads),
    ("approvals_page", Database.approvals_page, lambda p: p.pages),
    ("work_queue", Database.work_queue, lambda p: p.queues),
    ("status", Database.status, lambda p: p.statuses),
]
WARM = 5


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "p50_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


def measure_rounds(small: Database, large: Database, plan: Plan) -> dict[str, Any]:
    """Each latency in `plan.rounds` rounds, the two databases one after the other in each (the order swapped from
    round to round), so that a machine that slows down or speeds up touches both alike."""
    rounds: list[dict[str, Any]] = []
    for n in range(plan.rounds):
        waited = wait_quiet(plan.wait_s)
        before = cpu_ticks()
        this: dict[str, Any] = {"waited_s": waited, small.name: {}, large.name: {}}
        for name, run, calls in LATENCIES:
            for db in (small, large) if n % 2 == 0 else (large, small):
                for _ in range(WARM):
                    run(db)
                this[db.name][name] = percentiles([run(db) for _ in range(calls(plan))])
        after = cpu_ticks()
        if before is not None and after is not None and after[1] > before[1]:
            this["cpu_busy"] = round((after[0] - before[0]) / (after[1] - before[1]), 3)
        rounds.append(this)
        print(f"  round {n + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"rounds": rounds}
    for db in (small, large):
        out[db.name] = {
            name: {
                key: round(statistics.median(r[db.name][name][key] for r in rounds), 3)
                for key in ("p50_ms", "p99_ms", "mean_ms")
            }
            for name, _, _ in LATENCIES
        }
    return out


def sent(db: Database, call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The SQLAlchemy statements `call` sends to the database, with their parameters (psycopg's style)."""
    store = db.eng.store
    assert isinstance(store, SqlStore)
    seen: list[tuple[str, Any]] = []

    def note(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        call()
    finally:
        event.remove(store.engine, "before_cursor_execute", note)
    return seen


def plans(db: Database, ended_id: str | None) -> dict[str, list[str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statements behind the latencies, as the store sends them (a claim's UPDATE
    in a transaction rolled back): where a figure grows, the plan says why."""
    at = now()
    claim = {"owner": "explain", "until": at + timedelta(seconds=60), "now": at, "limit": 1, "workflows": None}
    wanted: list[tuple[str, str, Any]] = [
        ("claim", postgres.CLAIM, claim),
        ("load of a live task", postgres.LOAD, {"task_id": db.live[0]}),
    ]
    if ended_id is not None:
        wanted.append(("load of a finished task", postgres.LOAD, {"task_id": ended_id}))
    for what, call in (("approvals_page", db.approvals_page), ("status", db.status)):
        wanted += [(f"{what}, statement {n}", q, p) for n, (q, p) in enumerate(sent(db, call), start=1)]
    out: dict[str, list[str]] = {}
    with psycopg.connect(libpq(db.url)) as conn:
        for name, sql, params in wanted:
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
            conn.rollback()
            out[name] = [re.sub(r"'\{[^}]{80,}\}'", "'{...}'", r[0]) for r in rows]
    return out


#: What `railyard status` ran before migration 0009, for reference: one GROUP BY over the whole tasks table.
WHOLE_TABLE_STATUS = (
    "SELECT workflow, status, count(*), sum(CASE WHEN lease_expires_at > now() THEN 1 ELSE 0 END), min(next_run_at)"
    " FROM tasks GROUP BY workflow, status ORDER BY workflow, status"
)


def whole_table_status(dsn: str, n: int) -> dict[str, float]:
    """The p50 of `WHOLE_TABLE_STATUS` by hand (psycopg), after one untimed run."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(WHOLE_TABLE_STATUS).fetchall()
        seconds = []
        for _ in range(n):
            t0 = time.perf_counter()
            conn.execute(WHOLE_TABLE_STATUS).fetchall()
            seconds.append(time.perf_counter() - t0)
    return percentiles(seconds)


def sizes(dsn: str) -> dict[str, Any]:
    """Bytes on disk per row: each table's heap (with its TOAST and free-space maps), its indexes, and all of it."""
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("events", "tasks", "snapshots"):
            row = conn.execute(
                f"SELECT count(*), pg_table_size('{table}'), pg_indexes_size('{table}'), "
                f"pg_total_relation_size('{table}') FROM {table}"
            ).fetchone()
            assert row is not None
            rows, heap, indexes, total = row
            out[table] = {
                "rows": rows,
                "table_bytes": heap,
                "index_bytes": indexes,
                "total_bytes": total,
                "table_per_row": round(heap / rows, 1),
                "index_per_row": round(indexes / rows, 1),
                "total_per_row": round(total / rows, 1),
            }
        db = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        assert db is not None
        out["database_bytes"] = db[0]
        out["database_per_event"] = round(db[0] / out["events"]["rows"], 1)
    return out


# -- the run ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """One figure compared across the two sizes: where it is in a size's results, and which way is worse."""

    name: str
    label: str
    path: tuple[str, ...]
    unit: str
    worse_up: bool = True  # a latency or a size; a rate is worse down

    def read(self, results: dict[str, Any]) -> float:
        value: Any = results
        for key in self.path:
            value = value[key]
        return float(value)

    def ratio(self, small: float, large: float) -> float | None:
        """How much worse the large database's figure is (1.0: the same)."""
        if not small or not large:
            return None
        return large / small if self.worse_up else small / large


FIGURES = [
    Figure("claim_p50_ms", "Store.claim p50", ("claim", "p50_ms"), "ms"),
    Figure("claim_p99_ms", "Store.claim p99", ("claim", "p99_ms"), "ms"),
    Figure("load_p50_ms", "Engine.load of any task p50", ("load", "p50_ms"), "ms"),
    Figure("load_p99_ms", "Engine.load of any task p99", ("load", "p99_ms"), "ms"),
    Figure("load_live_p50_ms", "Engine.load of a live task p50", ("load_live", "p50_ms"), "ms"),
    Figure("approvals_page_p50_ms", "queries.approvals(limit=50) p50", ("approvals_page", "p50_ms"), "ms"),
    Figure("work_queue_p50_ms", "work_queue, a page of 50, p50", ("work_queue", "p50_ms"), "ms"),
    Figure("status_p50_ms", "railyard status's queries p50", ("status", "p50_ms"), "ms"),
    Figure("replay_events_per_s", "replay_all events/s", ("replay", "events_per_s"), "events/s", worse_up=False),
    Figure("replay_peak_rss_mb", "replay_all peak RSS (largest process)", ("replay", "rss_mb"), "MB"),
    Figure("event_bytes", "events: table + indexes per event", ("bytes", "events", "total_per_row"), "B"),
    Figure("database_bytes_per_event", "database size per event", ("bytes", "database_per_event"), "B"),
]
LIMIT = 1.5


def load_live(dsn: str, plan: Plan, at: datetime) -> list[str]:
    """The live tasks, started in the hour before `at` (after every finished task): their ids."""
    hour = at - timedelta(hours=1)
    runnable = load_parallel(dsn, "runnable", plan.live - plan.approvals, hour, at, plan.live)
    approval = load_parallel(dsn, "approval", plan.approvals, hour, at, plan.live)
    return [*runnable["sample"], *approval["sample"]]


def replay_figures(*runs: dict[str, Any]) -> dict[str, Any]:
    """Replay runs of one database: the mean rate and the largest peak RSS (of the process or one of its jobs)."""
    return {
        "events_per_s": round(statistics.fmean(r["events_per_s"] for r in runs)),
        "rss_mb": max(max(r["peak_rss_mb"], r["worker_peak_rss_mb"]) for r in runs),
        "findings": sum(r["findings"] for r in runs),
        "runs": list(runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--tasks", type=int, help="tasks in the large database (default 1,000,000; quick 10,000)")
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN (ANALYZE, BUFFERS) of each statement on both databases"
    )
    parser.add_argument(
        "--no-prewarm",
        action="store_true",
        help="measure with shared_buffers as the load and vacuum left it, even where what loads read fits in it",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.tasks is not None:
        if args.tasks <= plan.live:
            parser.error(f"--tasks must be more than the {plan.live:,} live tasks")
        plan = Plan(**{**plan.__dict__, "tasks": args.tasks})
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    idle_busy = background_busy(0.5)
    host = machine(None)
    ended = plan.tasks - plan.live
    print(
        f"Railyard scale benchmark ({mode}): {plan.live:,} live tasks ({plan.approvals:,} at an approval) in one "
        f"database, the same and {ended:,} finished ones in another: {plan.tasks:,} tasks, "
        f"{plan.tasks * EVENTS_PER_TASK:,} events"
    )
    print(f"Machine: {host['nproc']} CPUs ({host['cpu']}), Python {host['python']}, railyard {host['commit']}")
    print_background(idle_busy)
    jobs = available_jobs()
    # Started before any data is generated (see start_memory_child): the small database is replayed before and after
    # the large one, so that its rate is taken on both sides of the long run.
    children = [start_memory_child(jobs, "scale") for _ in range(3)]
    server = pg_server_url(args.postgres_url)
    with bench_database(server) as (small_url, pg), bench_database(server) as (large_url, _):
        if small_url is None or large_url is None:
            for child in children:
                child.kill()
            print("PostgreSQL is required for this benchmark; nothing measured.")
            print(json.dumps({"bench": "scale", "mode": mode, "measured": False, "postgresql": pg}))
            return 1
        small_dsn, large_dsn = libpq(small_url), libpq(large_url)
        at = datetime.now(UTC)
        loads: dict[str, Any] = {}
        for url in (small_url, large_url):
            migrations.upgrade(url)
        small_ids = load_live(small_dsn, plan, at)
        large_live = load_live(large_dsn, plan, at)
        print(f"  loading {ended:,} finished tasks ...", file=sys.stderr, flush=True)
        # Enough finished ids that no load in any round repeats one.
        keep = 2 * (plan.loads + WARM) * plan.rounds
        finished = load_parallel(large_dsn, "ended", ended, at - timedelta(days=30), at - timedelta(hours=1), keep)
        loads["ended"] = {
            "events": finished["events"],
            "seconds": round(finished["seconds"], 1),
            "events_per_s": round(finished["events"] / finished["seconds"]),
            "generator_cpu_s": round(finished["generator_cpu_s"], 1),
            "processes": finished["processes"],
        }
        loads["vacuum_s"] = {"small": round(vacuum(small_dsn), 1), "large": round(vacuum(large_dsn), 1)}
        print(
            f"  loaded {finished['events']:,} events in {finished['seconds']:.0f} s "
            f"({loads['ended']['events_per_s']:,}/s, {finished['processes']} processes), "
            f"vacuumed in {loads['vacuum_s']['large']:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        memory = memory_plan(small_dsn, large_dsn, warm=not args.no_prewarm)
        print(f"  {describe_memory(memory)}", file=sys.stderr, flush=True)
        live = {"terminal": 0, "runnable": plan.live - plan.approvals, "blocked": plan.approvals}
        # Loads are drawn from every task of the database: in the large one, live and finished in proportion.
        share = round(len(finished["sample"]) * plan.live / ended)
        large_ids = random.Random(11).sample(large_live, min(share, len(large_live))) + finished["sample"]
        small = Database("small", small_url, small_ids, small_ids, live)
        large = Database("large", large_url, large_ids, large_live, {**live, "terminal": ended})
        try:
            check_generated(small.eng, {"runnable": small_ids[0], "approval": small_ids[-1]})
            check_generated(large.eng, {"ended": finished["sample"][0]})
            print(f"  measuring at {plan.live:,} and at {plan.tasks:,} tasks ...", file=sys.stderr, flush=True)
            measured = measure_rounds(small, large, plan)
            explained = {"small": plans(small, None), "large": plans(large, finished["sample"][0])}
        finally:
            small.close()
            large.close()
        results: dict[str, dict[str, Any]] = {"small": measured["small"], "large": measured["large"]}
        results["small"]["bytes"] = sizes(small_dsn)
        results["large"]["bytes"] = sizes(large_dsn)
        for name, dsn in (("small", small_dsn), ("large", large_dsn)):
            results[name]["whole_table_status"] = whole_table_status(dsn, plan.statuses)
        print("  replay --all ...", file=sys.stderr, flush=True)
        before = replay_all_memory(children[0], small_url)
        results["large"]["replay"] = replay_figures(replay_all_memory(children[1], large_url))
        results["small"]["replay"] = replay_figures(before, replay_all_memory(children[2], small_url))
    assert results["small"]["replay"]["findings"] == results["large"]["replay"]["findings"] == 0

    rows = []
    targets = []
    ratios: dict[str, float] = {}
    for fig in FIGURES:
        a, b = fig.read(results["small"]), fig.read(results["large"])
        ratio = fig.ratio(a, b)
        if ratio is not None:
            ratios[fig.name] = round(ratio, 3)
        per_round = None
        if fig.path[0] in {name for name, _, _ in LATENCIES}:
            pairs = [(fig.read(r["small"]), fig.read(r["large"])) for r in measured["rounds"]]
            per_round = [x for x in (fig.ratio(*p) for p in pairs) if x is not None]
        rows.append((fig.label, a, b, ratio, fig.unit))
        side = "large / small" if fig.worse_up else "small / large"
        note = f"{fig.label}: {side}, {plan.tasks:,} tasks against {plan.live:,}"
        targets.append(target(fig.name, ratio, "<", LIMIT, note, per_round))
    elapsed = time.perf_counter() - started
    print()
    print(
        f"PostgreSQL {pg['server_version']}; at {plan.live:,} tasks and at {plan.tasks:,} (latencies: medians of "
        f"{plan.rounds} rounds; ratio: how much worse at {plan.tasks:,}):"
    )
    width = max(len(r[0]) for r in rows)
    for label, a, b, ratio, unit in rows:
        shown = "n/a" if ratio is None else f"{ratio:.2f}x"
        print(f"    {label:<{width}}  {a:>12,.3f} {unit:<8} {b:>12,.3f} {unit:<8} {shown}")
    ev = results["large"]["bytes"]["events"]
    print(
        f"    events at {plan.tasks:,} tasks: {ev['table_per_row']:.0f} B of table and {ev['index_per_row']:.0f} B of "
        f"index per event; tasks {results['large']['bytes']['tasks']['total_per_row']:.0f} B per task, snapshots "
        f"{results['large']['bytes']['snapshots']['total_per_row']:.0f} B per snapshot"
    )
    before_0009 = [results[name]["whole_table_status"]["p50_ms"] for name in ("small", "large")]
    print(
        f"    for reference, the GROUP BY over the whole tasks table that status ran before migration 0009: "
        f"{before_0009[0]:,.3f} ms and {before_0009[1]:,.3f} ms ({before_0009[1] / before_0009[0]:.1f}x)"
    )
    print(f"    {describe_memory(memory)}")
    busy = [r["cpu_busy"] for r in measured["rounds"] if "cpu_busy" in r]
    if busy:
        print(
            f"    CPUs busy during the rounds (everything, PostgreSQL included): {', '.join(f'{b:.0%}' for b in busy)}"
        )
    if args.explain:
        for name, found in explained.items():
            for what, lines in found.items():
                print(f"\nEXPLAIN (ANALYZE, BUFFERS), {what}, {name} database:")
                print("\n".join(f"    {line}" for line in lines))
        print()
    print_targets(targets)
    waited = sum(r["waited_s"] for r in measured["rounds"])
    print(f"({elapsed:.0f} s; waited {waited:.0f} s in all for the CPUs to be quiet)")
    result = {
        "bench": "scale",
        "mode": mode,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(elapsed, 1),
        "plan": plan.__dict__,
        "machine": machine(pg.get("server_version")),
        "background_cpu_busy": None if idle_busy is None else round(idle_busy, 3),
        "unit": "milliseconds, events per second, MB, bytes",
        "figures": {fig.name: fig.read(results["large"]) for fig in FIGURES},
        "baselines": {fig.name: fig.read(results["small"]) for fig in FIGURES},
        "ratios": ratios,
        "targets": targets,
        "all_met": all(t["met"] is True for t in targets),
        "memory": memory,
        "detail": {**results, "rounds": measured["rounds"], "loads": loads, "plans": explained},
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
