"""Append benchmark: what one transition costs through the engine, against raw SQL measured in the same run.

On PostgreSQL, with 1 and 4 concurrent writers (processes, each on its own task):

  (a) raw naive   psycopg by hand: BEGIN; UPDATE tasks ... WHERE seq = expected; INSERT event; COMMIT
  (b) raw best    the same work as one statement (a data-modifying CTE), autocommit, one round trip
  (c) engine      `Engine.transition` on a task the caller already holds (state and seq known)

and, with 1 writer, a stateless read-then-write: raw (BEGIN; SELECT; UPDATE; INSERT; COMMIT)
against `Engine.fire` (load, then append). On SQLite (WAL): sqlite3 by hand (BEGIN IMMEDIATE;
UPDATE; INSERT; COMMIT) against the engine. Then `Engine.load` of a task with 10,000 events
from its snapshot.

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

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import platform
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import make_url

from engine import (
    Action,
    Agent,
    Engine,
    Registry,
    StaticRoles,
    Terminal,
    Workflow,
    fold,
    migrations,
    verify_chain,
)

DEFAULT_PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ACTOR = "bench"
WRITERS = (1, 4)
LOAD_EVENTS = 10_000


# -- the workflow under test ---------------------------------------------------------------------
class TickArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


def tick_workflow(name: str) -> Workflow:
    """A self-loop, so one task can take any number of transitions (the append and replay benchmarks')."""
    return Workflow(
        name=name,
        version=1,
        description="A self-loop so one task can take thousands of transitions.",
        states=[
            Agent("working", actions=[Action("tick", "working", TickArgs), Action("finish", "done")]),
            Terminal("done"),
        ],
    )


BENCH_WORKFLOW = tick_workflow("bench_tick")


def make_engine(url: str) -> Engine:
    return Engine(url, registry=Registry([BENCH_WORKFLOW]), authoriser=StaticRoles({}))


# -- the hand-written transition: same rows, same hash, no engine code -------------------------------
def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _hand_event(task_id: str, seq: int, prev_hash: str, n: int) -> tuple[datetime, str, str]:
    """(at, data JSON, hash) of the `tick` event `seq`: sha256(prev_hash || canonical JSON of the body)."""
    at = datetime.now(UTC)
    data = {"args": {"n": n}}
    body = {
        "task_id": task_id,
        "seq": seq,
        "at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "actor": ACTOR,
        "from_state": "working",
        "trigger": "tick",
        "to_state": "working",
        "data": data,
    }
    digest = hashlib.sha256((prev_hash + _canonical(body)).encode("utf-8")).hexdigest()
    return at, _canonical(data), digest


class Conflict(Exception):
    pass


PG_UPDATE = (
    "UPDATE tasks SET seq = %s, state = %s, status = %s, last_hash = %s, updated_at = %s"
    " WHERE task_id = %s AND seq = %s"
)
PG_INSERT = (
    "INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
PG_CTE = (
    "WITH upd AS (UPDATE tasks SET seq = %s::int, state = %s::text, status = %s::text, last_hash = %s::text,"
    " updated_at = %s::timestamptz WHERE task_id = %s::text AND seq = %s::int RETURNING task_id)"
    " INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
    " SELECT upd.task_id, %s::int, %s::timestamptz, %s::text, %s::text, %s::text, %s::text, %s::text,"
    " %s::text, %s::text FROM upd"
)
PG_SELECT = "SELECT seq, state, last_hash FROM tasks WHERE task_id = %s"

SQLITE_UPDATE = (
    "UPDATE tasks SET seq = ?, state = ?, status = ?, last_hash = ?, updated_at = ? WHERE task_id = ? AND seq = ?"
)
SQLITE_INSERT = (
    "INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SQLITE_SELECT = "SELECT seq, state, last_hash FROM tasks WHERE task_id = ?"


def _sqlite_time(at: datetime) -> str:
    """How SQLAlchemy stores a DateTime on SQLite (naive UTC text), so the rows match the engine's."""
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")


class PgRaw:
    """One psycopg connection (autocommit) advancing one task by hand."""

    def __init__(self, dsn: str, task_id: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.cur = self.conn.cursor()
        self.task_id = task_id
        self.cur.execute(PG_SELECT, (task_id,))
        row = self.cur.fetchone()
        assert row is not None
        self.seq, _, self.last_hash = row
        self.n = 0

    def close(self) -> None:
        self.conn.close()

    def naive(self) -> None:
        """(a) BEGIN; UPDATE ... WHERE seq = expected; INSERT; COMMIT: four round trips."""
        self.n += 1
        seq = self.seq + 1
        at, data, digest = _hand_event(self.task_id, seq, self.last_hash, self.n)
        with self.conn.transaction():
            self.cur.execute(PG_UPDATE, (seq, "working", "runnable", digest, at, self.task_id, self.seq))
            if self.cur.rowcount != 1:
                raise Conflict(self.task_id)
            self.cur.execute(
                PG_INSERT, (self.task_id, seq, at, ACTOR, "working", "tick", "working", data, self.last_hash, digest)
            )
        self.seq, self.last_hash = seq, digest

    def best(self) -> None:
        """(b) the same work as one data-modifying CTE in autocommit: one round trip."""
        self.n += 1
        seq = self.seq + 1
        at, data, digest = _hand_event(self.task_id, seq, self.last_hash, self.n)
        self.cur.execute(
            PG_CTE,
            (
                seq,
                "working",
                "runnable",
                digest,
                at,
                self.task_id,
                self.seq,
                seq,
                at,
                ACTOR,
                "working",
                "tick",
                "working",
                data,
                self.last_hash,
                digest,
            ),
        )
        if self.cur.rowcount != 1:
            raise Conflict(self.task_id)
        self.seq, self.last_hash = seq, digest

    def read_write(self) -> None:
        """Stateless by hand: BEGIN; SELECT the row; UPDATE ... WHERE seq = read; INSERT; COMMIT."""
        self.n += 1
        with self.conn.transaction():
            self.cur.execute(PG_SELECT, (self.task_id,))
            row = self.cur.fetchone()
            assert row is not None
            expected, state, prev_hash = row
            seq = expected + 1
            at, data, digest = _hand_event(self.task_id, seq, prev_hash, self.n)
            self.cur.execute(PG_UPDATE, (seq, "working", "runnable", digest, at, self.task_id, expected))
            if self.cur.rowcount != 1:
                raise Conflict(self.task_id)
            self.cur.execute(
                PG_INSERT, (self.task_id, seq, at, ACTOR, state, "tick", "working", data, prev_hash, digest)
            )
        self.seq, self.last_hash = seq, digest  # bookkeeping only: the next read_write reads again


class SqliteRaw:
    """sqlite3 by hand, configured as the engine configures SQLite (WAL, synchronous=NORMAL)."""

    def __init__(self, path: str, task_id: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=30000"):
            self.conn.execute(f"PRAGMA {pragma}")
        self.task_id = task_id
        row = self.conn.execute(SQLITE_SELECT, (task_id,)).fetchone()
        self.seq, _, self.last_hash = row
        self.n = 0

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def naive(self) -> None:
        """BEGIN IMMEDIATE; UPDATE ... WHERE seq = expected; INSERT; COMMIT."""
        self.n += 1
        seq = self.seq + 1
        at, data, digest = _hand_event(self.task_id, seq, self.last_hash, self.n)
        when = _sqlite_time(at)
        with self._immediate():
            cur = self.conn.execute(SQLITE_UPDATE, (seq, "working", "runnable", digest, when, self.task_id, self.seq))
            if cur.rowcount != 1:
                raise Conflict(self.task_id)
            self.conn.execute(
                SQLITE_INSERT,
                (self.task_id, seq, when, ACTOR, "working", "tick", "working", data, self.last_hash, digest),
            )
        self.seq, self.last_hash = seq, digest

    def read_write(self) -> None:
        """BEGIN IMMEDIATE; SELECT; UPDATE; INSERT; COMMIT."""
        self.n += 1
        with self._immediate():
            expected, state, prev_hash = self.conn.execute(SQLITE_SELECT, (self.task_id,)).fetchone()
            seq = expected + 1
            at, data, digest = _hand_event(self.task_id, seq, prev_hash, self.n)
            when = _sqlite_time(at)
            cur = self.conn.execute(SQLITE_UPDATE, (seq, "working", "runnable", digest, when, self.task_id, expected))
            if cur.rowcount != 1:
                raise Conflict(self.task_id)
            self.conn.execute(
                SQLITE_INSERT, (self.task_id, seq, when, ACTOR, state, "tick", "working", data, prev_hash, digest)
            )
        self.seq, self.last_hash = seq, digest  # bookkeeping only: the next read_write reads again


class EngineWriter:
    """The engine advancing one task: `transition` (task held) or `fire` (load, then append)."""

    def __init__(self, eng: Engine, task_id: str) -> None:
        self.eng = eng
        self.task_id = task_id
        self.task = eng.load(task_id)
        self.n = 0

    def transition(self) -> None:
        self.n += 1
        self.task = self.eng.transition(self.task, "tick", {"n": self.n}, actor=ACTOR)

    def fire(self) -> None:
        self.n += 1
        self.eng.fire(self.task_id, "tick", {"n": self.n}, actor=ACTOR)


# -- what each kind of measurement runs -------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    pg_url: str | None  # SQLAlchemy URL of the bench database
    sqlite_url: str


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Runners:
    """Per process: engines, connections and one task per kind, created on first use (after spawn)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.engines: dict[str, Engine] = {}
        self.closers: list[Callable[[], None]] = []
        self.steps: dict[str, Callable[[], None]] = {}

    def engine(self, backend: str) -> Engine:
        if backend not in self.engines:
            url = self.cfg.pg_url if backend == "pg" else self.cfg.sqlite_url
            assert url is not None
            self.engines[backend] = make_engine(url)
        return self.engines[backend]

    def step(self, kind: str) -> Callable[[], None]:
        if kind not in self.steps:
            self.steps[kind] = self._make(kind)
        return self.steps[kind]

    def _make(self, kind: str) -> Callable[[], None]:
        backend, what = kind.split(":")
        eng = self.engine(backend)
        task_id = eng.start(BENCH_WORKFLOW.name, {}, actor=ACTOR)
        if what in ("transition", "fire"):
            writer = EngineWriter(eng, task_id)
            return writer.transition if what == "transition" else writer.fire
        raw: PgRaw | SqliteRaw
        if backend == "pg":
            assert self.cfg.pg_url is not None
            raw = PgRaw(libpq(self.cfg.pg_url), task_id)
        else:
            raw = SqliteRaw(make_url(self.cfg.sqlite_url).database or "", task_id)
        self.closers.append(raw.close)
        if what == "best" and isinstance(raw, PgRaw):
            return raw.best
        return raw.naive if what == "naive" else raw.read_write

    def close(self) -> None:
        for close in self.closers:
            close()
        for eng in self.engines.values():
            eng.close()


def _worker(cfg: Config, inbox: Any, outbox: Any, wid: int) -> None:
    runners = Runners(cfg)
    try:
        while True:
            command = inbox.get()
            if command is None:
                break
            kind, warm_s, run_s = command
            step = runners.step(kind)
            until = time.perf_counter() + warm_s
            while time.perf_counter() < until:
                step()
            outbox.put(("ready", wid))
            if inbox.get() is None:  # "go", or None when the run is being torn down
                break
            done = 0
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            deadline = t0 + run_s
            while True:
                step()
                done += 1
                t1 = time.perf_counter()
                if t1 >= deadline:
                    break
            outbox.put(("done", wid, done, t0, t1, time.process_time() - cpu0))
    except BaseException:
        outbox.put(("error", wid, traceback.format_exc()))
    finally:
        runners.close()


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat (Linux); None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


BUSY_WARNING = 0.15


def background_busy(seconds: float) -> float | None:
    """How busy the CPUs are (0..1) while this benchmark does nothing: other work disturbs the figures."""
    before = _cpu_ticks()
    time.sleep(seconds)
    after = _cpu_ticks()
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class Pool:
    """Writer processes (spawned: each makes its own connections); measurement `n` uses the first n."""

    def __init__(self, cfg: Config, size: int) -> None:
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.procs = [
            ctx.Process(target=_worker, args=(cfg, self.inboxes[w], self.outbox, w), daemon=True) for w in range(size)
        ]
        for proc in self.procs:
            proc.start()

    def _receive(self, tag: str) -> tuple[Any, ...]:
        message = self.outbox.get(timeout=300)
        if message[0] == "error":
            raise RuntimeError(f"writer {message[1]} failed:\n{message[2]}")
        assert message[0] == tag, message
        return tuple(message)

    def measure(self, kind: str, writers: int, warm_s: float, run_s: float) -> tuple[float, float, float | None]:
        """Transitions per second of `writers` processes together (each on its own task); the writers'
        own CPU time per transition in microseconds (the client's share, not the server's); and how busy
        the machine's CPUs were meanwhile (0..1, every process, the database server included)."""
        for w in range(writers):
            self.inboxes[w].put((kind, warm_s, run_s))
        for _ in range(writers):
            self._receive("ready")
        before = _cpu_ticks()
        for w in range(writers):
            self.inboxes[w].put("go")
        results = [self._receive("done") for _ in range(writers)]
        after = _cpu_ticks()
        total = sum(r[2] for r in results)
        wall = max(r[4] for r in results) - min(r[3] for r in results)
        busy = None
        if before is not None and after is not None and after[1] > before[1]:
            busy = (after[0] - before[0]) / (after[1] - before[1])
        return total / wall, sum(r[5] for r in results) / total * 1e6, busy

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()


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
}
SQLITE_LABELS = {
    "naive": "raw sqlite3: BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT",
    "transition": "engine: Engine.transition (task held)",
    "read_write": "raw read-then-write: BEGIN IMMEDIATE; SELECT; UPDATE; INSERT; COMMIT",
    "fire": "engine: Engine.fire (load, then append)",
}


def run_rounds(pool: Pool, plan: Plan, series: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Interleaved rounds: every (kind, writers) once per round, so drift touches them all alike."""
    samples: dict[tuple[str, int], list[tuple[float, float, float | None]]] = {s: [] for s in series}
    for r in range(plan.rounds):
        for kind, writers in series:
            samples[(kind, writers)].append(pool.measure(kind, writers, plan.warm_s, plan.run_s))
        print(f"  round {r + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
    return {s: summary(v) for s, v in samples.items()}


def summary(samples: list[tuple[float, float, float | None]]) -> dict[str, Any]:
    rates = [rate for rate, _, _ in samples]
    busy = [b for _, _, b in samples if b is not None]
    return {
        "median": round(statistics.median(rates)),
        "min": round(min(rates)),
        "max": round(max(rates)),
        "rounds": [round(r) for r in rates],
        "client_cpu_us": round(statistics.median(cpu for _, cpu, _ in samples), 1),
        "machine_cpu_busy": round(statistics.median(busy), 3) if busy else None,
    }


def check_raw_matches_engine(cfg: Config, backend: str) -> None:
    """The raw code's rows must be rows the engine accepts: same columns, same chain, same fold."""
    runners = Runners(cfg)
    try:
        eng = runners.engine(backend)
        task_id = eng.start(BENCH_WORKFLOW.name, {}, actor=ACTOR)
        url = cfg.pg_url if backend == "pg" else cfg.sqlite_url
        assert url is not None
        raw: PgRaw | SqliteRaw = (
            PgRaw(libpq(url), task_id) if backend == "pg" else SqliteRaw(make_url(url).database or "", task_id)
        )
        steps = [raw.naive, raw.read_write] + ([raw.best] if isinstance(raw, PgRaw) else [])
        for step in steps:
            for _ in range(10):
                step()
        raw.close()
        events = eng.store.events(task_id)
        findings = verify_chain(events)
        if findings:
            raise SystemExit(f"{backend}: raw rows break the engine's hash chain: {findings[:3]}")
        task = eng.load(task_id)  # folds and checks the fold against the row the raw code wrote
        assert task.seq == 1 + 10 * len(steps), task.seq
        writer = EngineWriter(eng, task_id)  # and the engine can continue the raw chain
        writer.transition()
        writer.fire()
    finally:
        runners.close()


def measure_load(url: str, plan: Plan) -> dict[str, Any]:
    """`Engine.load` of a task with 10,000 events (written by the engine, so its snapshots are the
    engine's own); then again with the most events past the newest snapshot that the engine leaves."""
    eng = make_engine(url)
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


def _figure_line(label: str, fig: dict[str, Any]) -> str:
    spread = f"[{fig['min']}-{fig['max']}]"
    busy = "" if fig["machine_cpu_busy"] is None else f"{fig['machine_cpu_busy'] * 100:>5.0f} %"
    return f"    {label:<66} {fig['median']:>6} {spread:<13} {fig['client_cpu_us']:>6.0f} us {busy}"


def target(
    name: str, value: float | None, op: str, threshold: float, note: str, rounds: list[float] | None = None
) -> dict[str, Any]:
    """A target judged on `value` (the ratio of medians); `rounds_met` says how many rounds alone met it."""

    def ok(v: float) -> bool:
        return v >= threshold if op == ">=" else v < threshold

    out = {
        "name": name,
        "value": None if value is None else round(value, 3),
        "op": op,
        "threshold": threshold,
        "met": None if value is None else ok(value),
        "note": note,
    }
    if rounds:
        out["rounds_met"] = f"{sum(ok(v) for v in rounds)}/{len(rounds)}"
    return out


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes, `--quick` and `--postgres-url`; described by the doc's first paragraph."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run, under a minute")
    parser.add_argument(
        "--postgres-url",
        help="server on which to create (and drop) the bench database; default RAILYARD_BENCH_POSTGRES_URL, "
        "RAILYARD_TEST_POSTGRES_URL, or the local `test` database",
    )
    return parser


def print_targets(targets: list[dict[str, Any]]) -> None:
    """The targets block every benchmark prints before its JSON line: verdict, name, value, threshold, note."""
    width = max((len(t["name"]) for t in targets), default=0)
    print("Targets:")
    for t in targets:
        verdict = {True: "MET", False: "NOT MET", None: "NOT MEASURED"}[t["met"]]
        value = t["value"]
        shown = "n/a" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)
        rounds = f", met in {t['rounds_met']} rounds" if "rounds_met" in t else ""
        print(f"    {verdict:<13} {t['name']:<{width}} {shown} {t['op']} {t['threshold']}  ({t['note']}{rounds})")


def machine(pg_version: str | None) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "postgresql": pg_version,
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "commit": _commit(),
    }


def _commit() -> str | None:
    """The checkout measured: HEAD, plus `-dirty` if engine/ has uncommitted changes."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "engine"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def pg_server_url(arg: str | None) -> str:
    return (
        arg
        or os.environ.get("RAILYARD_BENCH_POSTGRES_URL")
        or os.environ.get("RAILYARD_TEST_POSTGRES_URL")
        or DEFAULT_PG_SERVER
    )


def pg_unreachable(server: str) -> str | None:
    try:
        with psycopg.connect(libpq(server), connect_timeout=3):
            return None
    except psycopg.Error as exc:
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def bench_database(server: str) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """A fresh PostgreSQL database for this run (dropped at the end), or None if the server is unreachable."""
    info: dict[str, Any] = {"available": False, "reason": pg_unreachable(server)}
    if info["reason"] is not None:
        print(f"PostgreSQL not reachable at {make_url(server).render_as_string()}: {info['reason']}")
        print("Measuring SQLite only; the PostgreSQL targets are reported as not measured.")
        yield None, info
        return
    name = f"railyard_bench_{secrets.token_hex(6)}"
    with psycopg.connect(libpq(server), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        for setting in ("server_version", "fsync", "synchronous_commit", "shared_buffers"):
            row = conn.execute(f"SHOW {setting}").fetchone()
            info[setting] = str(row[0]) if row else None
    info["available"] = True
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False), info
    finally:
        with psycopg.connect(libpq(server), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure_all(plan: Plan, pg_url: str | None, sqlite_url: str) -> dict[str, Any]:
    cfg = Config(pg_url=pg_url, sqlite_url=sqlite_url)
    for backend in (["pg"] if pg_url else []) + ["sqlite"]:
        check_raw_matches_engine(cfg, backend)
    out: dict[str, Any] = {}
    pool = Pool(cfg, max(WRITERS) if pg_url else 1)
    try:
        if pg_url is not None:
            series = [(f"pg:{k}", 1) for k in ("naive", "best", "transition", "read_write", "fire")]
            series += [(f"pg:{k}", 4) for k in ("naive", "best", "transition")]
            figures = run_rounds(pool, plan, series)
            out["postgresql"] = {
                str(w): {k.split(":")[1]: v for (k, n), v in figures.items() if n == w} for w in WRITERS
            }
        kinds = ("naive", "transition", "read_write", "fire")
        figures = run_rounds(pool, plan, [(f"sqlite:{k}", 1) for k in kinds])
        out["sqlite"] = {k.split(":")[1]: v for (k, _), v in figures.items()}
    finally:
        pool.close()
    print(f"  loading a task with {LOAD_EVENTS:,} events ...", file=sys.stderr, flush=True)
    out["load"] = {"sqlite": measure_load(sqlite_url, plan)}
    if pg_url is not None:
        out["load"]["postgresql"] = measure_load(pg_url, plan)
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
    sq = fig["sqlite"]
    ratio("sqlite_transition_vs_raw", sq["transition"], sq["naive"])
    ratio("sqlite_fire_vs_read_write", sq["fire"], sq["read_write"])

    def ratio_target(name: str, threshold: float, note: str) -> dict[str, Any]:
        return target(name, ratios.get(name), ">=", threshold, note, per_round.get(name))

    pg_load = fig["load"].get("postgresql")
    targets = [
        ratio_target("pg_1w_transition_vs_naive", 1.0, "Engine.transition / (a) raw naive, PostgreSQL, 1 writer"),
        ratio_target(
            "pg_1w_transition_vs_best", 0.7, "Engine.transition / (b) raw best (one CTE), PostgreSQL, 1 writer"
        ),
        ratio_target("pg_1w_fire_vs_read_write", 1.0, "Engine.fire / raw read-then-write, PostgreSQL, 1 writer"),
        ratio_target("pg_4w_vs_1w_engine", 2.5, "Engine.transition, 4 writer processes / 1, one task each, PostgreSQL"),
        ratio_target(
            "sqlite_transition_vs_raw",
            0.3,
            "Engine.transition / raw sqlite3 (BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT), WAL",
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
    if idle_busy is not None:
        print(
            f"Before the run the machine's CPUs were {idle_busy * 100:.0f} % busy with other work"
            + (
                ""
                if idle_busy < BUSY_WARNING
                else " -- WARNING: something else is running; the figures below are disturbed by it"
            ),
            flush=True,
        )
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
