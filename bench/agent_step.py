"""Agent-step benchmark: what one model turn costs the engine beyond the append, on a short and a long history.

One agent step is `AgentRunner(engine, model).step(task)` on a task the caller holds (the
`TaskState` the previous step returned): check the budgets, choose the rung and build the request,
call the model, read and validate its answer, decide, seal the event and append it. The workflow is
bench/harness.py's self-loop (`Agent("working", actions=[tick -> working, finish -> done])`) with the
model-turn budget raised so one task can take 1,100 turns. The model is a deterministic stand-in
(`RepeatModel` below) that answers every request like `ScriptedModel` answers the turn
`{"tool_calls": [{"name": "tick", "arguments": {"n": 1}}]}`, without consuming a list (about 4 us
a call); before measuring, the benchmark checks that one step with it writes exactly the event one
step with a real `ScriptedModel` writes. It speaks for the `anthropic` profile, so the request is on
the `required` rung (the allowed actions as tools, tool_choice required).

The baseline, measured in the same run on the same database, is the raw append of
bench/harness.py (append.py's baseline): on PostgreSQL its best form, one data-modifying CTE in autocommit; on SQLite
`BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT` with sqlite3. Overhead = step time - raw append time,
per step, at 10 and at 1,000 prior events. A task takes at most 10 timed steps at 10 prior events
(10 to 19) and at most 100 at 1,000 (1,000 to 1,099), then the next prebuilt task takes over, so
the history stays at the length being measured. The histories are built by the same kind of step
(the engine's own code, its appends batched ten at a time with their snapshot; the raw ones by the
raw code). Each `tick` enters the agent state afresh, which starts a new visit: the conversation
sent to the model does not grow with the history, and the benchmark checks that (same request,
same visit and facts at 10 and 1,000 prior events).

For context, also: `Engine.transition` (the plain append path, no model turn); the step on the
`native_schema` rung (the `openai` profile, ScriptedModel's default, answering the JSON envelope);
the step with the store's append stubbed out (the engine's own CPU, no database); and a fixed piece
of pure-Python work, the same at every commit, which shows how fast the machine was in this run.

Per-step times are medians over interleaved rounds. A round runs a fixed number of timed steps of
every series, in slices (every series once per slice, each after a short warm-up on a task of its
own), so drift in the machine's speed touches a step and its baseline alike. Before each round the
run waits (a while at most) for other work to leave the CPUs alone, and a round during which other
work kept them busy is discarded and run again (a few times at most; the output counts them). The
last line of output is one JSON object: figures, baselines, ratios and targets.

    python bench/agent_step.py            # full run, about two minutes
    python bench/agent_step.py --quick    # under a minute
    python bench/agent_step.py --profile  # also: where a step's time goes (cProfile, SQLite)
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    ACTOR,
    BUSY_WARNING,
    Config,
    PgRaw,
    SqliteRaw,
    TickArgs,
    background_busy,
    bench_database,
    bench_parser,
    check_raw_matches_engine,
    cpu_ticks,
    libpq,
    machine,
    pg_server_url,
    print_background,
    print_targets,
    reference_work,
    wait_quiet,
)
from sqlalchemy.engine import make_url

from engine import (
    ANYONE,
    Action,
    Agent,
    Budgets,
    Engine,
    Event,
    MemoryStore,
    Registry,
    ScriptedModel,
    SqlStore,
    StaticRoles,
    TaskState,
    Terminal,
    Workflow,
    migrations,
    verify_chain,
)
from engine.core.canonical import canonical_json
from engine.core.forcing import build_request, choose_rung, model_actions
from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall
from engine.core.webhooks import Outgoing
from engine.runtime.agent import AgentRunner

HISTORIES = (10, 1000)
#: Timed steps a task takes at each history length before the next prebuilt task takes over.
BAND = {10: 10, 1000: 100}
OVERHEAD_MS = 0.5
GROWTH_REL, GROWTH_ABS_MS = 0.20, 0.05
#: One process stepping keeps about one CPU busy (PostgreSQL's backend works while the client waits):
#: a timed run with the CPUs busier than that, by more than BUSY_WARNING, shared the machine with other work.
DISTURBED = min(1.0, 1 / (os.cpu_count() or 1) + BUSY_WARNING)

#: bench/harness.py's self-loop, with the model-turn budget (50 by default) raised so that one task can
#: take the 1,100 turns the longest history needs.
AGENT_WORKFLOW = Workflow(
    name="bench_agent_step",
    version=1,
    description="A self-loop so one task can take thousands of model turns.",
    states=[
        Agent("working", actions=[Action("tick", "working", TickArgs), Action("finish", "done")]),
        Terminal("done"),
    ],
    budgets=Budgets(model_turns=10**9),
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


def make_engine(url: str) -> Engine:
    return Engine(url, registry=Registry([AGENT_WORKFLOW]), authoriser=StaticRoles({}))


TOOL_TURN: dict[str, Any] = {"tool_calls": [{"name": "tick", "arguments": {"n": 1}}]}
JSON_TURN: dict[str, Any] = {"json": {"action": "tick", "arguments": {"n": 1}}}


# -- the model: always the same answer, at the cost of building one response ----------------------------
class RepeatModel:
    """A `ModelAdapter` answering every request like `ScriptedModel` answers `turn`, forever.

    ScriptedModel pops its turns from the front of a list and keeps every request, which grows
    with the run; this keeps only the last request (to check what was sent).
    """

    provider = "scripted"
    model = "scripted"

    def __init__(self, turn: dict[str, Any], profile: str) -> None:
        self.turn = turn
        self.profile = profile
        self.calls = 0
        self.last_request: ModelRequest | None = None

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        self.last_request = request
        if "tool_calls" in self.turn:
            calls = tuple(
                ToolCall(f"call_{self.calls}_{i}", c["name"], json.dumps(c["arguments"]))
                for i, c in enumerate(self.turn["tool_calls"])
            )
            return ModelResponse(tool_calls=calls, finish_reason="tool_calls")
        return ModelResponse(text=json.dumps(self.turn["json"]))


#: How each kind of step asks: the tools rung (headline) and the native-schema rung (context).
RUNGS = {"step": (TOOL_TURN, "anthropic"), "step_native": (JSON_TURN, "openai")}


class NullStore(MemoryStore):
    """A store whose append does nothing: the step's own CPU, without a database."""

    def append(self, *_args: Any, **_kwargs: Any) -> None:
        return None


class BatchingStore(SqlStore):
    """For building histories only: collects a task's appends and writes them when one carries a snapshot
    (every `snapshot_every` events) or on `flush`, as one append of those events with that snapshot. The
    rows are those one append per step writes, in a tenth of the round trips."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.pending: tuple[str, int, list[Event], str, dict[str, Any]] | None = None

    def append(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        *,
        status: str,
        snapshot: tuple[int, str, str] | None = None,
        next_run_at: datetime | None = None,
        lease_epoch: int | None = None,
        outbox: Sequence[Outgoing] = (),
    ) -> None:
        # The other task-row fields an append sets (next_run_at, lease_epoch): the last ones win; webhook messages
        # are kept and written with the batch.
        if self.pending is not None and self.pending[0] != task_id:
            self.flush()
        kept = list(self.pending[4]["outbox"]) if self.pending is not None else []
        row = {"next_run_at": next_run_at, "lease_epoch": lease_epoch, "outbox": [*kept, *outbox]}
        if self.pending is None:
            self.pending = (task_id, expected_seq, [], status, row)
        self.pending[2].extend(new_events)
        self.pending = (*self.pending[:3], status, row)
        if snapshot is not None:
            self.flush(snapshot)

    def flush(self, snapshot: tuple[int, str, str] | None = None) -> None:
        if self.pending is not None:
            task_id, expected_seq, events, status, row = self.pending
            self.pending = None
            super().append(task_id, expected_seq, events, status=status, snapshot=snapshot, **row)

    def close(self) -> None:
        self.flush()
        super().close()


# -- tasks held between steps -----------------------------------------------------------------------
class EngineTask:
    """A task advanced by the engine, held between calls: `AgentRunner.step` or `Engine.transition`."""

    def __init__(self, advance: Callable[[TaskState], TaskState], task: TaskState) -> None:
        self.advance = advance
        self.task = task

    def run(self, n: int) -> None:
        advance, task = self.advance, self.task
        for _ in range(n):
            task = advance(task)
        self.task = task


class RawTask:
    """A task advanced by the raw append of bench/harness.py, on one connection shared by every task."""

    def __init__(self, raw: PgRaw | SqliteRaw, task_id: str, seq: int, last_hash: str) -> None:
        self.raw, self.task_id, self.seq, self.last_hash = raw, task_id, seq, last_hash
        self.op = raw.best if isinstance(raw, PgRaw) else raw.naive

    def run(self, n: int) -> None:
        raw, op = self.raw, self.op
        raw.task_id, raw.seq, raw.last_hash = self.task_id, self.seq, self.last_hash
        for _ in range(n):
            op()
        self.seq, self.last_hash = raw.seq, raw.last_hash


class ReferenceWork:
    """The fixed work of `harness.reference_work`: how fast the machine was during the run."""

    def run(self, n: int) -> None:
        reference_work(n)


Held = EngineTask | RawTask | ReferenceWork


@dataclass(frozen=True)
class Plan:
    rounds: int
    steps: int  # timed steps per figure per round
    slices: int  # a round's timed steps run in this many interleaved slices
    warm: int  # warm-up steps before each slice (on a task of its own)
    wait_s: float  # before each round, wait at most this long for other work to leave the CPUs alone
    redo: int  # rounds that may be discarded (other work busy meanwhile) and run again


FULL = Plan(rounds=7, steps=500, slices=5, warm=20, wait_s=60.0, redo=3)
QUICK = Plan(rounds=3, steps=300, slices=3, warm=10, wait_s=5.0, redo=1)


class Series:
    """One figure: a kind of step on one backend at one history length, with its prebuilt tasks."""

    def __init__(
        self, name: str, backend: str, kind: str, history: int, make: Callable[[], Held], pool_size: int
    ) -> None:
        self.name, self.backend, self.kind, self.history = name, backend, kind, history
        self.warm_task = make()
        self.pool = [make() for _ in range(pool_size)]
        self.band = BAND.get(history, 10**9)
        self.used = 0  # steps taken from the pool

    def take(self, steps: int) -> list[tuple[Held, int]]:
        """The next `steps` steps as (task, count) chunks, each task within its band of the history."""
        chunks = []
        while steps:
            index, offset = divmod(self.used, self.band)
            count = min(steps, self.band - offset)
            chunks.append((self.pool[index], count))
            self.used += count
            steps -= count
        return chunks


class Bench:
    """Engines, runners, raw connections and prebuilt tasks for every series."""

    def __init__(self, plan: Plan, pg_url: str | None, sqlite_url: str) -> None:
        self.plan = plan
        self.urls = {"sqlite": sqlite_url} | ({"pg": pg_url} if pg_url else {})
        self.engines = {b: make_engine(u) for b, u in self.urls.items()}
        # What builds the histories: the same engine code, its appends batched (see BatchingStore).
        self.builders = {
            b: Engine(
                store=BatchingStore(self.urls[b]),
                registry=e.registry,
                authoriser=e.authoriser,
            )
            for b, e in self.engines.items()
        }
        self.models: dict[tuple[str, str, int, str], RepeatModel] = {}
        self.runners: dict[tuple[str, str, int, str], AgentRunner] = {}
        self.raws: dict[str, PgRaw | SqliteRaw] = {}
        self.series: list[Series] = []
        self.waited: list[float] = []  # seconds spent waiting for a quiet machine before each round
        self.discarded: list[float] = []  # how busy the CPUs were in each round discarded

    def close(self) -> None:
        for raw in self.raws.values():
            raw.close()
        for eng in self.engines.values():
            eng.close()

    def runner(
        self, backend: str, kind: str, history: int, eng: Engine | None = None, role: str = "measure"
    ) -> AgentRunner:
        """One runner (and model) per series and role ("measure", or "build" on the builder engine), so each
        model's last request is that series' own."""
        key = (backend, kind, history, role)
        if key not in self.runners:
            turn, profile = RUNGS[kind]
            self.models[key] = model = RepeatModel(turn, profile)
            self.runners[key] = AgentRunner(eng or self.engines[backend], model)
        return self.runners[key]

    def raw(self, backend: str) -> PgRaw | SqliteRaw:
        if backend not in self.raws:
            seed = self.engines[backend].start(AGENT_WORKFLOW.name, {}, actor=ACTOR)
            url = self.urls[backend]
            self.raws[backend] = (
                PgRaw(libpq(url), seed) if backend == "pg" else SqliteRaw(make_url(url).database or "", seed)
            )
        return self.raws[backend]

    def maker(self, backend: str, kind: str, history: int) -> Callable[[], Held]:
        """Builds one task with `history` events (start plus history - 1 of the same kind of step)."""
        eng, builder = self.engines[backend], self.builders[backend]
        batching = builder.store
        assert isinstance(batching, BatchingStore)

        def make() -> Held:
            task_id = eng.start(AGENT_WORKFLOW.name, {}, actor=ACTOR)
            if kind == "raw":
                first = eng.load(task_id)
                raw = RawTask(self.raw(backend), task_id, first.seq, first.last_hash)
                if isinstance(raw.raw, PgRaw):
                    with raw.raw.conn.transaction():  # the same rows; one commit instead of one per event
                        raw.run(history - 1)
                else:
                    raw.run(history - 1)
                return raw
            if kind == "transition":
                held = EngineTask(lambda t: builder.transition(t, "tick", {"n": 1}, actor=ACTOR), eng.load(task_id))
                held.run(history - 1)
                held.advance = lambda t: eng.transition(t, "tick", {"n": 1}, actor=ACTOR)
            else:
                held = EngineTask(self.runner(backend, kind, history, builder, "build").step, eng.load(task_id))
                held.run(history - 1)
                held.advance = self.runner(backend, kind, history).step
            batching.flush()
            return held

        return make

    def build(self) -> None:
        plan = self.plan
        for backend in self.engines:
            for history in HISTORIES:
                kinds = ("raw", "step") + (("transition", "step_native") if history == HISTORIES[0] else ())
                for kind in kinds:
                    t0 = time.perf_counter()
                    size = -(-((plan.rounds + plan.redo) * plan.steps) // BAND[history])
                    series = Series(
                        f"{backend}:{kind}@{history}", backend, kind, history, self.maker(backend, kind, history), size
                    )
                    self.series.append(series)
                    for held in (series.warm_task, series.pool[-1]):
                        check_built(self.engines[backend], held, history)
                    print(
                        f"  built {size + 1} tasks of {history} events for {series.name} "
                        f"({time.perf_counter() - t0:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
        # The step with the append stubbed out: no database, so no history to speak of.
        null = Engine(
            store=NullStore(),
            registry=self.engines["sqlite"].registry,
            authoriser=self.engines["sqlite"].authoriser,
        )
        start = next(s for s in self.series if s.name == "sqlite:step@10").warm_task
        assert isinstance(start, EngineTask)
        runner = self.runner("none", "step", 0, null)
        self.series.append(Series("none:step", "none", "step", 0, lambda: EngineTask(runner.step, start.task), 1))
        self.series.append(Series("none:reference", "none", "reference", 0, ReferenceWork, 1))
        if "pg" in self.engines:
            with psycopg.connect(libpq(self.urls["pg"]), autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")  # so autovacuum does not wake up mid-measurement


# -- checks ----------------------------------------------------------------------------------------
def check_scripted_equivalence(eng: Engine) -> None:
    """One step with RepeatModel writes exactly the event one step with a real ScriptedModel writes."""
    for turn, profile in RUNGS.values():
        data = []
        for model in (ScriptedModel([turn], profile=profile), RepeatModel(turn, profile)):
            task_id = eng.start(AGENT_WORKFLOW.name, {}, actor=ACTOR)
            after = AgentRunner(eng, model).step(eng.load(task_id))
            event = eng.store.events(task_id, after.seq - 1, after.seq)[0]
            data.append((event.actor, event.trigger, event.to_state, event.data))
        if data[0] != data[1]:
            raise SystemExit(f"RepeatModel does not answer like ScriptedModel ({profile}):\n{data[0]}\n{data[1]}")


def check_built(eng: Engine, held: Held, history: int) -> None:
    """A built task is in the database as the builder left it: `history` events, the row and the newest
    snapshot agreeing with the state held (`Engine.load` checks the fold against the row)."""
    assert not isinstance(held, ReferenceWork)
    task_id = held.task.task_id if isinstance(held, EngineTask) else held.task_id
    loaded = eng.load(task_id)
    if loaded.seq != history or loaded.state != "working" or (isinstance(held, EngineTask) and loaded != held.task):
        raise SystemExit(f"task {task_id}: the database disagrees with the state held after building it")


def request_size(request: ModelRequest | None) -> dict[str, int] | None:
    if request is None:
        return None
    return {"messages": len(request.messages), "chars": len(repr(request))}


def conversation(bench: Bench, backend: str) -> dict[str, Any]:
    """What a step would send and hold at each history length (from the prebuilt warm-up tasks)."""
    eng = bench.engines[backend]
    out: dict[str, Any] = {}
    for history in HISTORIES:
        held = next(s for s in bench.series if s.name == f"{backend}:step@{history}").warm_task
        assert isinstance(held, EngineTask)
        task = held.task
        definition = eng.definition_of(task)
        state = definition.state(task.state)
        assert isinstance(state, Agent)
        entry: dict[str, Any] = {
            "seq": task.seq,
            "visit": task.visit,
            "facts": task.facts,
            "state_doc_bytes": len(canonical_json(task.to_doc())),
        }
        for kind in RUNGS:
            runner = bench.runner(backend, kind, history)
            rung = choose_rung(
                runner.profile, runner.adapter.model, False, len(model_actions(state)), task.visit.get("demoted", [])
            )
            request, _ = build_request(definition, task, runner.profile, runner.adapter.model, False, rung)
            entry[f"{kind}_request"] = {"rung": str(rung), **(request_size(request) or {})}
        out[str(history)] = entry
    short, long = out[str(HISTORIES[0])], out[str(HISTORIES[-1])]
    # The folded state differs only by the digits of seq (its size grows by two bytes from 10 to 1,000).
    out["same"] = all(short[k] == long[k] for k in short if k not in ("seq", "state_doc_bytes"))
    return out


def check_tasks(bench: Bench) -> None:
    """After the run: the last task each series used folds to the state the steps returned, its chain
    verifies, and every transition after `start` is a `tick`."""
    for series in bench.series:
        if series.backend == "none" or series.used == 0:
            continue
        eng = bench.engines[series.backend]
        last = series.pool[(series.used - 1) // series.band]
        assert not isinstance(last, ReferenceWork)
        task_id = last.task.task_id if isinstance(last, EngineTask) else last.task_id
        loaded = eng.load(task_id)
        if isinstance(last, EngineTask) and (loaded.seq, loaded.last_hash) != (last.task.seq, last.task.last_hash):
            raise SystemExit(f"{series.name}: the task's log disagrees with the state the steps returned")
        events = eng.store.events(task_id)
        findings = verify_chain(events)
        if findings:
            raise SystemExit(f"{series.name}: broken hash chain: {findings[:3]}")
        others = {e.trigger for e in events[1:]} - {"tick"}
        if others:  # a repair, a budget's limit...: not the step this benchmark means to measure
            raise SystemExit(f"{series.name}: the log has {sorted(others)} transitions, not only ticks")


# -- measuring --------------------------------------------------------------------------------------
def measure(series: Series, steps: int, warm: int) -> tuple[float, float, int, int]:
    """One timed run: wall seconds, this process's CPU seconds, and the machine's busy and total CPU ticks."""
    series.warm_task.run(warm)
    chunks = series.take(steps)
    before = cpu_ticks() or (0, 0)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for held, count in chunks:
        held.run(count)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    after = cpu_ticks() or (0, 0)
    return wall, cpu, after[0] - before[0], after[1] - before[1]


def summary(samples: list[tuple[float, float, float | None]]) -> dict[str, Any]:
    ms = [m for m, _, _ in samples]
    busy = [b for _, _, b in samples if b is not None]
    return {
        "median": round(statistics.median(ms), 4),
        "min": round(min(ms), 4),
        "max": round(max(ms), 4),
        "rounds": [round(m, 4) for m in ms],
        "client_cpu_us": round(statistics.median(c for _, c, _ in samples), 1),
        "machine_cpu_busy": round(statistics.median(busy), 3) if busy else None,
        "disturbed_rounds": sum(b > DISTURBED for b in busy),
    }


def run_rounds(bench: Bench) -> dict[str, dict[str, Any]]:
    """Interleaved rounds, each made of slices: every series runs once per slice (the order reversed every
    other slice), so drift in the machine's speed touches the step and its baseline alike. A round's figure
    is its slices' total time over their total steps.

    Before each round the run waits (a while at most) for other work to leave the CPUs alone. A round
    during which other work kept the CPUs busy (some series' timed runs over DISTURBED) is discarded and
    run again, at most `plan.redo` times in all; every discard is counted in the output."""
    plan = bench.plan
    per_slice = plan.steps // plan.slices
    steps = per_slice * plan.slices
    samples: dict[str, list[tuple[float, float, float | None]]] = {s.name: [] for s in bench.series}
    redo = plan.redo
    while len(samples[bench.series[0].name]) < plan.rounds:
        bench.waited.append(wait_quiet(plan.wait_s))
        totals = {s.name: [0.0, 0.0, 0, 0] for s in bench.series}
        for index in range(plan.slices):
            for series in bench.series if index % 2 == 0 else reversed(bench.series):
                for i, value in enumerate(measure(series, per_slice, plan.warm)):
                    totals[series.name][i] += value
        busy = {name: t[2] / t[3] if t[3] > 0 else None for name, t in totals.items()}
        worst = max((b for b in busy.values() if b is not None), default=0.0)
        if worst > DISTURBED and redo > 0:
            redo -= 1
            bench.discarded.append(round(worst, 3))
            print(
                f"  round discarded: other work kept the CPUs {worst:.0%} busy; running it again",
                file=sys.stderr,
                flush=True,
            )
            continue
        for name, (wall, cpu, _, _) in totals.items():
            samples[name].append((wall / steps * 1000, cpu / steps * 1e6, busy[name]))
        print(f"  round {len(samples[name])}/{plan.rounds} done", file=sys.stderr, flush=True)
    return {name: summary(v) for name, v in samples.items()}


def difference(top: dict[str, Any], bottom: dict[str, Any]) -> dict[str, Any]:
    """top - bottom: of the medians (what is judged), round by round (its spread), and of client CPU."""
    rounds = [round(a - b, 4) for a, b in zip(top["rounds"], bottom["rounds"], strict=True)]
    return {
        "ms": round(top["median"] - bottom["median"], 4),
        "rounds": rounds,
        "min": min(rounds),
        "max": max(rounds),
        "client_cpu_us": round(top["client_cpu_us"] - bottom["client_cpu_us"], 1),
    }


def growth_met(short: float, long: float) -> bool:
    return abs(long - short) <= max(GROWTH_REL * abs(short), GROWTH_ABS_MS)


def judge(fig: dict[str, dict[str, Any]], backends: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Overheads (step - raw append, per history), context differences, and the targets."""
    over: dict[str, Any] = {}
    targets: list[dict[str, Any]] = []
    for backend in ("pg", "sqlite"):
        label = "PostgreSQL" if backend == "pg" else "SQLite"
        measured = backend in backends
        for history in HISTORIES:
            value = None
            if measured:
                d = over[f"{backend}_overhead_{history}"] = difference(
                    fig[f"{backend}:step@{history}"], fig[f"{backend}:raw@{history}"]
                )
                value = d["ms"]
            t: dict[str, Any] = {
                "name": f"{backend}_overhead_{history}_ms",
                "value": value,
                "op": "<",
                "threshold": OVERHEAD_MS,
                "met": None if value is None else value < OVERHEAD_MS,
                "note": f"AgentRunner.step - raw append, ms per step, {history:,} prior events, {label}",
            }
            if measured:
                t["rounds_met"] = f"{sum(v < OVERHEAD_MS for v in d['rounds'])}/{len(d['rounds'])}"
            targets.append(t)
        short = over[f"{backend}_overhead_{HISTORIES[0]}"]["ms"] if measured else None
        long = over[f"{backend}_overhead_{HISTORIES[-1]}"]["ms"] if measured else None
        ratio = None if short is None or long is None or short <= 0 else round(long / short, 3)
        if short is not None and long is not None:
            over[f"{backend}_history_growth"] = {"ratio": ratio, "delta_ms": round(long - short, 4)}
        targets.append(
            {
                "name": f"{backend}_history_growth",
                "value": ratio,
                "op": "within",
                "threshold": f"{GROWTH_REL:.0%} or {GROWTH_ABS_MS} ms",
                "met": None if short is None or long is None else growth_met(short, long),
                "note": f"overhead at {HISTORIES[-1]:,} / at {HISTORIES[0]:,} prior events, {label}",
            }
        )
        if measured:
            h = HISTORIES[0]
            over[f"{backend}_transition_vs_raw_{h}"] = difference(
                fig[f"{backend}:transition@{h}"], fig[f"{backend}:raw@{h}"]
            )
            over[f"{backend}_step_vs_transition_{h}"] = difference(
                fig[f"{backend}:step@{h}"], fig[f"{backend}:transition@{h}"]
            )
            over[f"{backend}_native_overhead_{h}"] = difference(
                fig[f"{backend}:step_native@{h}"], fig[f"{backend}:raw@{h}"]
            )
    return over, targets


# -- where the time goes ------------------------------------------------------------------------------
def profile_steps(bench: Bench, steps: int = 3000) -> str:
    """cProfile of steps on SQLite (tools rung), top functions by own time and by cumulative time."""
    make = bench.maker("sqlite", "step", 10)
    held = make()
    assert isinstance(held, EngineTask)
    held.run(200)
    profiler = cProfile.Profile()
    profiler.enable()
    held.run(steps)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)
    return out.getvalue()


# -- report -----------------------------------------------------------------------------------------
LABELS = {
    "raw": "raw append (baseline)",
    "step": "AgentRunner.step, tools rung (required)",
    "transition": "context: Engine.transition (no model turn)",
    "step_native": "context: AgentRunner.step, native_schema rung",
}


def _line(label: str, fig: dict[str, Any]) -> str:
    spread = f"[{fig['min']:.3f}-{fig['max']:.3f}]"
    busy = "" if fig["machine_cpu_busy"] is None else f"{fig['machine_cpu_busy'] * 100:>5.0f} %"
    return f"    {label:<52} {fig['median']:>7.3f} {spread:<15} {fig['client_cpu_us']:>6.0f} us {busy}"


def report(
    fig: dict[str, dict[str, Any]],
    over: dict[str, Any],
    targets: list[dict[str, Any]],
    conv: dict[str, Any],
    pg: dict[str, Any],
    backends: list[str],
) -> None:
    header = f"    {'ms per step':<52} {'median':>7} {'[min-max]':<15} {'client CPU':>9} {'CPUs busy':>9}"
    print()
    for backend in backends:
        if backend == "pg":
            print(
                f"PostgreSQL {pg['server_version']} (fsync={pg['fsync']}, "
                f"synchronous_commit={pg['synchronous_commit']}); raw append = one CTE statement, autocommit"
            )
        else:
            print("SQLite (WAL, synchronous=NORMAL); raw append = BEGIN IMMEDIATE; UPDATE; INSERT; COMMIT")
        print(header)
        for history in HISTORIES:
            print(f"  {history:,} prior events ({history} to {history + BAND[history] - 1} during the run)")
            for kind in LABELS:
                name = f"{backend}:{kind}@{history}"
                if name in fig:
                    print(_line(LABELS[kind], fig[name]))
    print("No database (the store's append stubbed out), ms per step:")
    print(_line("AgentRunner.step, tools rung", fig["none:step"]))
    print(_line("reference: fixed pure-Python work (the machine's speed)", fig["none:reference"]))
    print("Overhead = step - raw append, ms per step (of the medians; round by round in brackets):")
    for backend in backends:
        for key, what in [(f"{backend}_overhead_{h}", f"{h:,} prior events") for h in HISTORIES] + [
            (f"{backend}_transition_vs_raw_10", "context: Engine.transition - raw, 10"),
            (f"{backend}_step_vs_transition_10", "context: step - Engine.transition, 10"),
            (f"{backend}_native_overhead_10", "context: native_schema step - raw, 10"),
        ]:
            d = over[key]
            print(
                f"    {backend:<7} {what:<42} {d['ms']:>7.3f}  [{d['min']:.3f} to {d['max']:.3f}]  "
                f"client CPU {d['client_cpu_us']:+.0f} us"
            )
    for backend in backends:
        g = over[f"{backend}_history_growth"]
        print(f"    {backend:<7} history growth (1,000 / 10): {g['ratio']}x, {g['delta_ms']:+.3f} ms")
    for backend, c in conv.items():
        print(
            f"Conversation, {backend}: same request and state size at 10 and 1,000 prior events: {c['same']} "
            + "; ".join(
                f"{h}: {c[h]['step_request']['messages']} messages, {c[h]['step_request']['chars']} "
                f"chars, visit {len(c[h]['visit']['messages'])} messages, state {c[h]['state_doc_bytes']} B"
                for h in map(str, HISTORIES)
            )
        )
    disturbed = sum(f["disturbed_rounds"] for f in fig.values())
    if disturbed:
        print(
            f"WARNING: in {disturbed} of {sum(len(f['rounds']) for f in fig.values())} timed runs the CPUs were "
            f"more than {DISTURBED:.0%} busy, more than one stepping process explains: other work was running "
            "and the figures are disturbed by it. Rerun on a quiet machine."
        )
    print_targets(targets)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of steps on SQLite")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    started = time.perf_counter()
    idle_busy = background_busy(1.0 if plan is FULL else 0.5)
    print(
        f"Railyard agent-step benchmark ({mode}: {plan.rounds} interleaved rounds x {plan.steps} timed steps "
        f"per figure, in {plan.slices} slices after {plan.warm} warm-up steps each; figures are medians over "
        "rounds)",
        flush=True,
    )
    host = machine(None)
    print(
        f"Machine: {host['nproc']} CPUs ({host['cpu']}), Python {host['python']}, SQLite {host['sqlite']}, "
        f"railyard {host['commit']}"
    )
    print_background(idle_busy)
    profile_text = None
    with (
        bench_database(pg_server_url(args.postgres_url)) as (pg_url, pg),
        tempfile.TemporaryDirectory(prefix="railyard_bench_") as tmp,
    ):
        sqlite_url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        migrations.upgrade(sqlite_url)
        if pg_url is not None:
            migrations.upgrade(pg_url)
        cfg = Config(pg_url=pg_url, sqlite_url=sqlite_url)
        backends = (["pg"] if pg_url else []) + ["sqlite"]
        for backend in backends:
            check_raw_matches_engine(cfg, backend)
        bench = Bench(plan, pg_url, sqlite_url)
        try:
            for backend in backends:
                check_scripted_equivalence(bench.engines[backend])
            t0 = time.perf_counter()
            bench.build()
            build_s = time.perf_counter() - t0
            conv = {backend: conversation(bench, backend) for backend in backends}
            fig = run_rounds(bench)
            seen = {
                s.name: request_size(bench.models[(s.backend, s.kind, s.history, "measure")].last_request)
                for s in bench.series
                if s.kind in RUNGS
            }
            check_tasks(bench)
            if args.profile:
                profile_text = profile_steps(bench)
        finally:
            bench.close()

    over, targets = judge(fig, backends)
    report(fig, over, targets, conv, pg, backends)
    for backend in backends:
        sizes = {h: seen[f"{backend}:step@{h}"] for h in HISTORIES}
        print(f"Last request sent in the timed steps, {backend}: " + ", ".join(f"{h}: {s}" for h, s in sizes.items()))
    if profile_text is not None:
        print("\nWhere a step's time goes (cProfile, SQLite, tools rung):")
        print(profile_text)
    elapsed = time.perf_counter() - started
    if bench.discarded:
        print(
            f"{len(bench.discarded)} round(s) discarded and run again: other work kept the CPUs busy "
            f"({', '.join(f'{b:.0%}' for b in bench.discarded)})"
        )
    print(
        f"({elapsed:.0f} s, of which building the histories {build_s:.0f} s and waiting for other work to "
        f"leave the CPUs alone before the rounds {sum(bench.waited):.0f} s)"
    )

    def ms(name: str) -> float | None:
        return fig[name]["median"] if name in fig else None

    def ovh(key: str) -> float | None:
        return over[key]["ms"] if key in over else None

    result = {
        "bench": "agent_step",
        "mode": mode,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": round(elapsed, 1),
        "plan": {
            "rounds": plan.rounds,
            "steps": plan.steps,
            "slices": plan.slices,
            "warm": plan.warm,
            "wait_s": plan.wait_s,
            "redo": plan.redo,
            "bands": BAND,
        },
        "machine": {**host, "postgresql": pg.get("server_version")},  # the commit measured: as the run began
        "background_cpu_busy": None if idle_busy is None else round(idle_busy, 3),
        "waited_for_quiet_s": bench.waited,
        "rounds_discarded_cpu_busy": bench.discarded,
        "postgresql": pg,
        "unit": "milliseconds per step",
        "figures": {
            **{f"{b}_step_{h}_ms": ms(f"{b}:step@{h}") for b in ("pg", "sqlite") for h in HISTORIES},
            **{f"{b}_overhead_{h}_ms": ovh(f"{b}_overhead_{h}") for b in ("pg", "sqlite") for h in HISTORIES},
            "no_db_step_ms": ms("none:step"),
            "reference_work_ms": ms("none:reference"),
        },
        "baselines": {f"{b}_raw_append_{h}_ms": ms(f"{b}:raw@{h}") for b in ("pg", "sqlite") for h in HISTORIES},
        "ratios": {f"{b}_history_growth": over[f"{b}_history_growth"]["ratio"] for b in backends},
        "targets": targets,
        "all_met": all(t["met"] is True for t in targets),
        "disturbed_runs": sum(f["disturbed_rounds"] for f in fig.values()),
        "context": {k: v for k, v in over.items() if "transition" in k or "native" in k},
        "conversation": conv,
        "requests_seen": seen,
        "detail": {"figures": fig, "overheads": over},
    }
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
