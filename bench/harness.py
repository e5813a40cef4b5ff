"""What the benchmarks share: the workflow they drive, the raw-SQL baselines written by hand, writer processes,
engine-valid logs generated in bulk and loaded with COPY, `replay --all` in a process of its own for its peak
memory, the machine's facts and how busy its CPUs are, the bench database, statistics and the targets they print.

Each benchmark (`append.py`, `agent_step.py`, `replay.py`, `workers.py`, `scale.py`, ...) imports from here and
from no other benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import secrets
import sqlite3
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import make_url

from engine import (
    ANYONE,
    Action,
    Agent,
    Engine,
    Registry,
    StaticRoles,
    Terminal,
    Workflow,
    verify_chain,
)
from engine.core.canonical import GENESIS_HASH, canonical_json, sha256_hex
from engine.core.definition import START
from engine.core.events import Event, stored_body, with_stored_data
from engine.core.fold import apply, initial
from engine.core.payloads import EventData
from engine.core.task import TaskState
from engine.core.timers import next_run_at

DEFAULT_PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ACTOR = "bench"


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
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )


BENCH_WORKFLOW = tick_workflow("bench_tick")


class PeerArgs(BaseModel):
    """The payload the peers were measured with (issue #33): about 200 bytes, a nested dict, validated."""

    model_config = ConfigDict(extra="forbid")
    n: int
    order_ref: str
    note: str
    detail: dict[str, dict[str, int | str]]


def peer_args(n: int) -> dict[str, Any]:
    """The peer shape's arguments for step `n`: 200-odd bytes of canonical JSON."""
    return {
        "n": n,
        "order_ref": f"C-{n % 10_000:05d}",
        "note": "refund requested after a late delivery; customer asked twice",
        "detail": {"order": {"id": f"O-{n:08d}", "cents": 4_250 + n % 100}, "channel": {"name": "email", "tries": 2}},
    }


#: The same self-loop with the peers' payload: each operation on a different one of PEER_TASKS tasks.
PEER_WORKFLOW = Workflow(
    name="bench_peer",
    version=1,
    description="A self-loop whose tick carries the peers' 200-byte validated payload.",
    states=[
        Agent("working", actions=[Action("tick", "working", PeerArgs), Action("finish", "done")]),
        Terminal("done"),
    ],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)
PEER_TASKS = 100


def tick_engine(url: str) -> Engine:
    """An engine that knows only the self-loops the raw baselines write (`BENCH_WORKFLOW`, `PEER_WORKFLOW`)."""
    return Engine(url, registry=Registry([BENCH_WORKFLOW, PEER_WORKFLOW]), authoriser=StaticRoles({}))


# -- the hand-written transition: same rows, same hash, no engine code -------------------------------
def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _hand_event(
    task_id: str, seq: int, prev_hash: str, n: int, args: dict[str, Any] | None = None
) -> tuple[datetime, str, str]:
    """(at, data JSON, hash) of the `tick` event `seq`: sha256(prev_hash || canonical JSON of the body)."""
    at = datetime.now(UTC)
    data = {"args": {"n": n} if args is None else args}
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


class PeerRaw:
    """The peer shape by hand: one connection (autocommit), PEER_TASKS tasks advanced round robin, each step's
    event carrying `peer_args` (not validated: the physical limit)."""

    def __init__(self, pg_dsn: str | None, sqlite_path: str | None, task_ids: list[str]) -> None:
        self.pg = pg_dsn is not None
        if pg_dsn is not None:
            self.conn: Any = psycopg.connect(pg_dsn, autocommit=True)
        else:
            self.conn = sqlite3.connect(sqlite_path or "", isolation_level=None, timeout=30)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=30000"):
                self.conn.execute(f"PRAGMA {pragma}")  # as SqliteRaw: as the engine configures SQLite
        self.cur = self.conn.cursor()
        self.heads: list[tuple[str, int, str]] = []
        for task_id in task_ids:
            self.cur.execute(PG_SELECT if self.pg else SQLITE_SELECT, (task_id,))
            seq, _, last_hash = self.cur.fetchone()
            self.heads.append((task_id, seq, last_hash))
        self.n = 0

    def close(self) -> None:
        self.conn.close()

    def _next(self) -> tuple[int, str, int, str, datetime, str, str]:
        self.n += 1
        i = self.n % len(self.heads)
        task_id, expected, prev_hash = self.heads[i]
        seq = expected + 1
        at, data, digest = _hand_event(task_id, seq, prev_hash, self.n, peer_args(self.n))
        self.heads[i] = (task_id, seq, digest)
        return i, task_id, expected, prev_hash, at, data, digest

    def best(self) -> None:
        """PostgreSQL: one data-modifying CTE in autocommit, one round trip."""
        _, task_id, expected, prev, at, data, digest = self._next()
        seq = expected + 1
        row = (seq, "working", "runnable", digest, at, task_id, expected)
        self.cur.execute(PG_CTE, (*row, seq, at, ACTOR, "working", "tick", "working", data, prev, digest))
        if self.cur.rowcount != 1:
            raise Conflict(task_id)

    def read_write(self) -> None:
        """PostgreSQL, stateless: BEGIN; SELECT the row; UPDATE ... WHERE seq = read; INSERT; COMMIT."""
        self.n += 1
        i = self.n % len(self.heads)
        task_id = self.heads[i][0]
        with self.conn.transaction():
            self.cur.execute(PG_SELECT, (task_id,))
            expected, state, prev_hash = self.cur.fetchone()
            seq = expected + 1
            at, data, digest = _hand_event(task_id, seq, prev_hash, self.n, peer_args(self.n))
            self.cur.execute(PG_UPDATE, (seq, "working", "runnable", digest, at, task_id, expected))
            if self.cur.rowcount != 1:
                raise Conflict(task_id)
            self.cur.execute(PG_INSERT, (task_id, seq, at, ACTOR, state, "tick", "working", data, prev_hash, digest))
        self.heads[i] = (task_id, seq, digest)

    def naive(self) -> None:
        """SQLite: BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT."""
        _, task_id, expected, prev, at, data, digest = self._next()
        seq = expected + 1
        when = _sqlite_time(at)
        self.cur.execute("BEGIN IMMEDIATE")
        try:
            self.cur.execute(SQLITE_UPDATE, (seq, "working", "runnable", digest, when, task_id, expected))
            if self.cur.rowcount != 1:
                raise Conflict(task_id)
            self.cur.execute(
                SQLITE_INSERT, (task_id, seq, when, ACTOR, "working", "tick", "working", data, prev, digest)
            )
            self.cur.execute("COMMIT")
        except BaseException:
            self.cur.execute("ROLLBACK")
            raise


class PeerEngine:
    """The engine on the peer shape: PEER_TASKS tasks round robin, `transition` (each task held) or `fire`."""

    def __init__(self, eng: Engine, task_ids: list[str]) -> None:
        self.eng = eng
        self.tasks = [eng.load(t) for t in task_ids]
        self.n = 0

    def transition(self) -> None:
        self.n += 1
        i = self.n % len(self.tasks)
        self.tasks[i] = self.eng.transition(self.tasks[i], "tick", peer_args(self.n), actor=ACTOR)

    def fire(self) -> None:
        self.n += 1
        self.eng.fire(self.tasks[self.n % len(self.tasks)].task_id, "tick", peer_args(self.n), actor=ACTOR)


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


# -- bulk data: sealed by the engine's functions, loaded with COPY -------------------------------------------
@dataclass(frozen=True, slots=True)
class Step:
    """One event of a generated log before it is sealed: everything but the task, seq, time and hashes. `text` is
    the canonical JSON of `data`, encoded once however many tasks take the step."""

    actor: str
    from_state: str | None
    trigger: str
    to_state: str
    data: EventData
    text: str


def step(actor: str, from_state: str | None, trigger: str, to_state: str, data: EventData) -> Step:
    return Step(actor, from_state, trigger, to_state, data, canonical_json(data))


def steps_of(events: Iterable[Event]) -> list[Step]:
    """The steps of a log the engine wrote, to be sealed again for other tasks: the same transitions and data."""
    return [step(e.actor, e.from_state, e.trigger, e.to_state, e.data) for e in events]


def sealed_log(
    definition: Workflow, task_id: str, steps: Iterable[Step], start_at: datetime
) -> Iterator[tuple[Event, TaskState]]:
    """`steps` as task `task_id`'s events, one microsecond apart, and the fold after each, as the engine would
    have written them: each hash is `sha256(prev_hash || canonical body)`, the body built around the data's
    text by `stored_body` (what replay checks a stored event with), and each fold is the engine's own `apply`."""
    prev = GENESIS_HASH
    task: TaskState | None = None
    for seq, s in enumerate(steps, start=1):
        at = start_at + timedelta(microseconds=seq - 1)
        digest = sha256_hex(prev + stored_body(task_id, seq, at, s.actor, s.from_state, s.trigger, s.to_state, s.text))
        event = with_stored_data(
            Event(task_id, seq, at, s.actor, s.from_state, s.trigger, s.to_state, s.data, prev, digest), s.text
        )
        task = initial(definition, event) if task is None else apply(definition, task, event)
        yield event, task
        prev = digest


def start_step(definition: Workflow, actor: str = ACTOR) -> Step:
    """The `start` event of a task of `definition` with an empty input, as `Engine.start` writes it."""
    return step(
        actor,
        None,
        START,
        definition.initial_state,
        {"workflow": definition.ref, "digest": definition.digest, "input": {}},
    )


def task_log(definition: Workflow, n_events: int, start_at: datetime) -> Iterator[tuple[Event, TaskState]]:
    """A task's events (`start`, then `tick`s) and the fold after each, as the engine would have written them."""
    state = definition.initial_state
    ticks = (step(ACTOR, state, "tick", state, {"args": {"n": seq}}) for seq in range(2, n_events + 1))
    return sealed_log(definition, str(uuid.uuid4()), itertools.chain([start_step(definition)], ticks), start_at)


#: A snapshot every this many events, as the engine writes them by default.
SNAPSHOT_EVERY = 10
EVENT_COLUMNS = "task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, hash"
TASK_COLUMNS = (
    "task_id, workflow, version, digest, state, status, seq, last_hash, created_at, updated_at, next_run_at, started_by"
)
SNAPSHOT_COLUMNS = "task_id, seq, hash, doc, created_at"
#: The columns' types, for a binary COPY.
EVENT_TYPES = ["text", "int4", "timestamptz", "text", "text", "text", "text", "text", "text", "text"]
TASK_TYPES = ["text", "text", "int4", "text", "text", "text", "int4", "text", "timestamptz", "timestamptz"]
TASK_TYPES += ["timestamptz", "text"]
SNAPSHOT_TYPES = ["text", "int4", "text", "text", "timestamptz"]


class BulkLoad:
    """Rows for COPY, a batch at a time: each task's row, its events and its snapshots (one every
    `SNAPSHOT_EVERY` events), in one transaction per batch, the rows first (the events reference them).

    What a row holds is what the engine's `append` leaves: the fold's state, status, seq and last hash, the time
    of its first and last event, `next_run_at` by the engine's own rule (`engine.core.timers`), the starter.
    """

    def __init__(self, dsn: str, batch_events: int = 50_000) -> None:
        self.conn = psycopg.connect(dsn)
        self.batch_events = batch_events
        self.rows: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.snapshots: list[tuple[Any, ...]] = []
        self.loaded_events = 0

    def __enter__(self) -> BulkLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.flush()
        finally:
            self.conn.close()

    def add(self, definition: Workflow, log: Iterable[tuple[Event, TaskState]]) -> TaskState:
        """Queue one task's log (and its row); returns its final state."""
        first: Event | None = None
        event: Event | None = None
        task: TaskState | None = None
        for event, task in log:
            first = first or event
            self.events.append(
                (
                    event.task_id,
                    event.seq,
                    event.at,
                    event.actor,
                    event.from_state,
                    event.trigger,
                    event.to_state,
                    event.stored_data if event.stored_data is not None else canonical_json(event.data),
                    event.prev_hash,
                    event.hash,
                )
            )
            if event.seq % SNAPSHOT_EVERY == 0:
                self.snapshots.append((event.task_id, event.seq, event.hash, canonical_json(task.to_doc()), event.at))
        assert first is not None and event is not None and task is not None
        self.rows.append(
            (
                task.task_id,
                definition.name,
                definition.version,
                definition.digest,
                task.state,
                str(task.status),
                task.seq,
                task.last_hash,
                first.at,
                event.at,
                next_run_at(definition, task.state, event.at),
                first.actor,
            )
        )
        if len(self.events) >= self.batch_events:
            self.flush()
        return task

    def flush(self) -> None:
        with self.conn.cursor() as cur:
            for table, columns, types, values in (
                ("tasks", TASK_COLUMNS, TASK_TYPES, self.rows),
                ("events", EVENT_COLUMNS, EVENT_TYPES, self.events),
                ("snapshots", SNAPSHOT_COLUMNS, SNAPSHOT_TYPES, self.snapshots),
            ):
                if values:
                    # Binary: psycopg's C dumpers write a row in about 3 µs, against 12 µs for text (measured).
                    with cur.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
                        copy.set_types(types)
                        for value in values:
                            copy.write_row(value)
        self.conn.commit()
        self.loaded_events += len(self.events)
        self.rows, self.events, self.snapshots = [], [], []


def load_tasks(dsn: str, definition: Workflow, n_tasks: int, n_events: int) -> list[str]:
    """Generate and COPY `n_tasks` tasks of `n_events` events each, with their snapshots and rows; returns the ids."""
    at = datetime.now(UTC) - timedelta(days=1)
    with BulkLoad(dsn) as bulk:
        ids = [bulk.add(definition, task_log(definition, n_events, at)).task_id for _ in range(n_tasks)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return ids


# -- replay --all in a process of its own, for its peak memory ---------------------------------------
MEMORY_CHILD = """
import resource, sys, time
sys.path[:0] = {paths!r}
from {module} import make_engine
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
url = sys.stdin.readline().strip()  # sent once the data is loaded
eng = make_engine(url)
started = time.perf_counter()
tasks = events = findings = 0
for report in eng.audit.replay_all(jobs={jobs}):
    tasks += 1
    events += report.events
    findings += len(report.findings)
elapsed = time.perf_counter() - started
print(tasks, events, findings, imported, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, elapsed,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def start_memory_child(jobs: int, module: str = "replay") -> subprocess.Popen[str]:
    """A replay_all process, started before the data is generated and waiting for the database URL; the engine
    is `make_engine(url)` of the benchmark `module` (which knows its workflows).

    Linux carries a parent's peak RSS into a child across exec (`ru_maxrss` would report the
    benchmark's own peak, with its generated rows): started early, the child inherits only the
    small parent it was forked from, and its `ru_maxrss` is its own.
    """
    here = str(Path(__file__).resolve().parent)
    return subprocess.Popen(
        [sys.executable, "-c", MEMORY_CHILD.format(paths=[here], jobs=jobs, module=module)],
        cwd=here,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def replay_all_memory(child: subprocess.Popen[str], url: str) -> dict[str, Any]:
    """Peak RSS of `replay_all()` over the whole database, in its own interpreter (kilobytes on Linux)."""
    out, _ = child.communicate(url + "\n", timeout=3600)
    assert child.returncode == 0, out
    tasks, events, findings, imported, maxrss, seconds, workers = out.split()
    return {
        "tasks": int(tasks),
        "events": int(events),
        "findings": int(findings),
        "peak_rss_mb": round(int(maxrss) / 1024, 1),
        "import_rss_mb": round(int(imported) / 1024, 1),
        "worker_peak_rss_mb": round(int(workers) / 1024, 1),
        "seconds": round(float(seconds), 2),
        "events_per_s": round(int(events) / float(seconds)),
    }


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
            self.engines[backend] = tick_engine(url)
        return self.engines[backend]

    def step(self, kind: str) -> Callable[[], None]:
        if kind not in self.steps:
            self.steps[kind] = self._make(kind)
        return self.steps[kind]

    def _make(self, kind: str) -> Callable[[], None]:
        backend, what = kind.split(":")
        eng = self.engine(backend)
        if what.startswith("peer_"):
            task_ids = [eng.start(PEER_WORKFLOW.name, {}, actor=ACTOR) for _ in range(PEER_TASKS)]
            if what in ("peer_transition", "peer_fire"):
                peer = PeerEngine(eng, task_ids)
                return peer.transition if what == "peer_transition" else peer.fire
            pg_dsn = libpq(self.cfg.pg_url) if backend == "pg" and self.cfg.pg_url else None
            by_hand = PeerRaw(pg_dsn, None if pg_dsn else make_url(self.cfg.sqlite_url).database, task_ids)
            self.closers.append(by_hand.close)
            return {"peer_best": by_hand.best, "peer_read_write": by_hand.read_write}.get(what, by_hand.naive)
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


#: Fixed pure-Python work, the same in every run and at every commit: how fast the machine was during a run (a
#: VM's speed drifts from run to run, by half on these machines, and what the benchmarks measure is mostly CPU).
REFERENCE_DOC = {f"key{i}": [i, str(i) * 3, {"x": i / 7, "y": None}] for i in range(40)}


def reference_work(n: int) -> None:
    """`n` units of the fixed work (JSON and sha256): 0.17-0.26 ms a unit on the 2-vCPU machines measured."""
    for _ in range(n):
        for _ in range(3):
            hashlib.sha256(json.dumps(REFERENCE_DOC, sort_keys=True).encode()).hexdigest()


def reference_ms(units: int = 300) -> float:
    """Milliseconds one unit of the fixed work takes now: the median over `units`, so a preempted one does not
    count."""
    times = []
    for _ in range(units):
        began = time.perf_counter()
        reference_work(1)
        times.append(time.perf_counter() - began)
    return round(statistics.median(times) * 1000, 4)


def cpu_ticks() -> tuple[int, int] | None:
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
    before = cpu_ticks()
    time.sleep(seconds)
    after = cpu_ticks()
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
        before = cpu_ticks()
        for w in range(writers):
            self.inboxes[w].put("go")
        results = [self._receive("done") for _ in range(writers)]
        after = cpu_ticks()
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


def print_background(idle_busy: float | None) -> None:
    """How busy other work kept the CPUs before the run (`background_busy`), with a warning past BUSY_WARNING."""
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


def wait_quiet(limit_s: float) -> float:
    """Wait (at most `limit_s`) until other work leaves the CPUs alone; the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        busy = background_busy(0.5)
        if busy is None or busy < BUSY_WARNING:
            break
    return round(time.perf_counter() - t0, 1)
