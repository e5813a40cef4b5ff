"""Prometheus metrics: what this process did (counters, histograms) and where the tasks stand (read at scrape).

Imported only once metrics are turned on (`hooks.enable_metrics`: `railyard
serve`, `railyard worker --metrics-port`): this module imports
`prometheus_client` at the top.

Two kinds of family. What this process did (transitions, model and tool calls,
claims, lease losses, conflicts, replays) is counted as it happens, in this
process only: sum it over processes. Where the tasks stand (tasks by status,
queue depth, the oldest due task) is read from the database at each scrape by
`StoreCollector`, so every process that serves metrics reports the same
numbers: take the max (or one process's), never the sum.

Label values are bounded: workflow, trigger and state names come from the
definitions (guard names too), codes from the closed `Code` enum, outcomes from the tool
protocol. Task ids are never labels.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core.canonical import now
from engine.core.definition import BACKOFF
from engine.core.errors import RailyardError
from engine.core.events import Event
from engine.core.flow import Amounts, in_flight_now
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelResponse, Usage
from engine.core.payloads import Turn
from engine.core.profiles import load_profiles, profile_prices
from engine.core.quality import (
    TOKEN_KINDS,
    Prices,
    base_state,
    failed_fields,
    leaves_state,
    proposal_code,
    turn_cost,
    turn_outcome,
)
from engine.core.replay import ReplayReport
from engine.store import Store
from engine.store.protocol import FlowStore

log = logging.getLogger("railyard.observability")

#: The label value for "no code" (Prometheus treats an empty label value as an absent label).
NONE = "none"

MODEL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLAIM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: A state's time runs from a model's seconds to a person's days: 1 s, 5 s, 15 s, 1 min, 5 min, 15 min, 1 h, 4 h,
#: 1 day, 3 days, 1 week.
STATE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0, 259_200.0, 604_800.0)
#: How many tasks' current visits `StateClock` remembers (a task it forgot is read from its log when it moves).
VISITS_KEPT = 100_000


class Metrics:
    """The families this process records into (one set per process, `hooks.enable_metrics`)."""

    def __init__(self) -> None:
        self.transitions = Counter(
            "railyard_transitions",
            "Events appended, by workflow, trigger and the code the event carries (none: no code).",
            ("workflow", "trigger", "code"),
            registry=None,
        )
        self.conflicts = Counter(
            "railyard_conflicts",
            "Appends refused because the task moved on meanwhile (CONCURRENCY_CONFLICT, LEASE_LOST): nothing "
            "was written.",
            ("workflow",),
            registry=None,
        )
        self.lease_losses = Counter(
            "railyard_lease_losses",
            "Tasks a worker stopped on because another worker took its lease over.",
            registry=None,
        )
        self.model_calls = Histogram(
            "railyard_model_call_seconds",
            "Model requests, by provider, model and code (none: an answer came back), in seconds.",
            ("provider", "model", "code"),
            buckets=MODEL_BUCKETS,
            registry=None,
        )
        self.model_tokens = Counter(
            "railyard_model_tokens",
            "Tokens the provider reported using, by provider, model and type (input, output, cached, reasoning); "
            "nothing where the provider reports no usage.",
            ("provider", "model", "type"),
            registry=None,
        )
        self.tool_calls = Histogram(
            "railyard_tool_call_seconds",
            "Tool runs (operation execute) and reconciliations (operation reconcile), by tool, outcome and code, "
            "in seconds.",
            ("tool", "operation", "outcome", "code"),
            buckets=TOOL_BUCKETS,
            registry=None,
        )
        self.claim_latency = Histogram(
            "railyard_claim_latency_seconds",
            "From when a task became due to when a worker claimed it, in seconds.",
            buckets=CLAIM_BUCKETS,
            registry=None,
        )
        self.replays = Counter(
            "railyard_replays",
            "Task logs replayed, by the first code found (none: the log proves the task's state).",
            ("code",),
            registry=None,
        )
        self.state_seconds = Histogram(
            "railyard_state_seconds",
            "Visits to a state that ended in this process (the task moved on), by workflow and state, in seconds from "
            "the event that entered it: a person's wait as much as a model's turns (S~force counts as S).",
            ("workflow", "state"),
            buckets=STATE_BUCKETS,
            registry=None,
        )
        self.schema_failures = Counter(
            "railyard_schema_failures",
            "Model answers that failed the action's schema, by workflow, agent state, model (provider:model) and "
            "field path (items[].x for every item of a list; (extra) for a field the schema does not have; (root) "
            "for the answer as a whole): one per field per answer.",
            ("workflow", "state", "model", "field"),
            registry=None,
        )
        # The quality figures that are counters (`engine.core.quality.TurnFigures`), by the key `railyard quality`
        # groups turns under: workflow, version, state, provider, model and the forcing ladder's rung.
        turn_key = ("workflow", "version", "state", "provider", "model", "rung")
        self.turns = Counter(
            "railyard_turns",
            "Model turns (a backoff is a retry, not a turn), by workflow, version, agent state, provider, model, rung "
            "and the code the answer came to (none: accepted); first tries are the turns of state S, not S~force.",
            (*turn_key, "code"),
            registry=None,
        )
        self.turn_tokens = Counter(
            "railyard_turn_tokens",
            "Tokens the provider reported for model turns, by workflow, version, agent state, provider, model, rung "
            "and type (input, output, cached, reasoning).",
            (*turn_key, "type"),
            registry=None,
        )
        self.turn_cost = Counter(
            "railyard_turn_cost",
            "What model turns cost at the prices of the model's profile (profiles file, `prices`), in the currency "
            "those prices are in, by workflow, version, agent state, provider, model and rung; nothing for a model "
            "without a price.",
            turn_key,
            registry=None,
        )
        self.repairs = Counter(
            "railyard_turn_repairs",
            "Answers refused with a repair left (the model was asked again), by the turns' key.",
            turn_key,
            registry=None,
        )
        self.escalations = Counter(
            "railyard_turn_escalations",
            "Answers after which the forcing ladder moved (a reminder, or the next rung down), by the turns' key.",
            turn_key,
            registry=None,
        )
        self.hand_offs = Counter(
            "railyard_turn_hand_offs",
            "Answers after which the repairs ran out and the task left for a person or the state's on_exhausted "
            "target, by the turns' key.",
            turn_key,
            registry=None,
        )
        self.domain_rejections = Counter(
            "railyard_domain_rejections",
            "Answers a domain guard refused (DOMAIN_INVALID), by the turns' key and the guard's name (one per guard "
            "that refused the answer).",
            (*turn_key, "guard"),
            registry=None,
        )
        self._prices: Prices | None = None
        self.visits = StateClock()
        self.flow_waits = Histogram(
            "railyard_flow_wait_seconds",
            "Model calls put off by flow control, by provider:model and reason (breaker, quota): how long each was "
            "put off for, in seconds.",
            ("model", "reason"),
            buckets=CLAIM_BUCKETS,
            registry=None,
        )
        self.flow_checks = Histogram(
            "railyard_flow_admit_seconds",
            "Model calls let through by flow control, by provider:model: the time its checks took, in seconds.",
            ("model",),
            buckets=TOOL_BUCKETS,
            registry=None,
        )
        self.quota_tokens = Counter(
            "railyard_quota_tokens",
            "Tokens of calls under a quota, by provider:model, type (input, output) and kind (reserved before the "
            "call, used as the provider reported).",
            ("model", "type", "kind"),
            registry=None,
        )
        self.breaker_changes = Counter(
            "railyard_breaker_changes",
            "Breakers this process saw open (its failure opened it) or closed (its probe was answered).",
            ("model", "state"),
            registry=None,
        )
        self.families: tuple[Collector, ...] = (
            self.flow_waits,
            self.flow_checks,
            self.quota_tokens,
            self.breaker_changes,
            self.transitions,
            self.conflicts,
            self.lease_losses,
            self.model_calls,
            self.model_tokens,
            self.tool_calls,
            self.claim_latency,
            self.replays,
            self.state_seconds,
            self.schema_failures,
            self.turns,
            self.turn_tokens,
            self.turn_cost,
            self.repairs,
            self.escalations,
            self.hand_offs,
            self.domain_rejections,
        )

    # -- recording ---------------------------------------------------------------------------------------------
    def transition(self, workflow: str, trigger: str, code: str | None) -> None:
        self.transitions.labels(workflow, trigger, code or NONE).inc()

    def quality(
        self, event: Event, workflow: str, entered: Callable[[], datetime | None] | None, version: int = 0
    ) -> None:
        """The schema failures, tokens and cost of a model turn, and the time of the visit an event ends (`entered`:
        when the task entered the state it leaves, read from its log, asked only when this process did not see it
        happen)."""
        turn = event.data.get("turn")
        if turn is not None and (fields := failed_fields(event.data, bounded=True)):
            state = base_state(event.from_state or "")
            for name in sorted(fields):
                self.schema_failures.labels(workflow, state, turn.get("model", ""), name).inc()
        if turn is not None and event.from_state is not None and event.trigger != BACKOFF:
            self._turn(event, turn, workflow, version)
        seconds = self.visits.seen(event, entered)
        if seconds is not None and event.from_state is not None:
            self.state_seconds.labels(workflow, base_state(event.from_state)).observe(max(seconds, 0.0))

    def _turn(self, event: Event, turn: Turn, workflow: str, version: int) -> None:
        """One turn into `railyard_turns`, `railyard_turn_tokens` and `railyard_turn_cost`, as the quality fold
        counts it (`engine.core.quality`)."""
        provider, _, model = str(turn.get("model", "")).partition(":")
        key = (workflow, str(version), base_state(event.from_state or ""), provider, model, str(turn.get("strategy")))
        code = proposal_code(event.data, turn)
        self.turns.labels(*key, code or NONE).inc()
        if (outcome := turn_outcome(event, turn, code)) is not None:
            for counted, family in (
                (outcome.repair, self.repairs),
                (outcome.escalated, self.escalations),
                (outcome.hand_off, self.hand_offs),
            ):
                if counted:
                    family.labels(*key).inc()
            for guard in sorted(outcome.guards):
                self.domain_rejections.labels(*key, guard).inc()
        spent: Mapping[str, Any] = turn.get("usage") or {}
        for kind in TOKEN_KINDS:
            if tokens := int(spent.get(kind, 0)):
                self.turn_tokens.labels(*key, kind.removesuffix("_tokens")).inc(tokens)
        price = self.prices(str(turn.get("profile", "")), model) if spent else None
        if price is not None:
            self.turn_cost.labels(*key).inc(turn_cost(spent, price))

    @property
    def prices(self) -> Prices:
        """The profiles' prices, read once (the profiles file as this process started with it); none when the file
        does not read (the worker refused to start on it already, and the quality figures say so)."""
        if self._prices is None:
            try:
                self._prices = profile_prices(load_profiles())
            except RailyardError as error:
                log.warning("metrics: no prices for the turns' cost: %s", error)
                self._prices = lambda _profile, _model: None
        return self._prices

    def conflict(self, workflow: str) -> None:
        self.conflicts.labels(workflow).inc()

    def lease_lost(self) -> None:
        self.lease_losses.inc()

    def model_call(
        self, provider: str, model: str, seconds: float, response: ModelResponse | None, error: ModelError | None
    ) -> None:
        code = str(error.code) if error is not None else NONE
        self.model_calls.labels(provider, model, code).observe(seconds)
        if response is not None:  # only what the provider reported: a token count it did not give is not a 0
            usage = response.usage
            for kind, tokens in (
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
                ("cached", usage.cached_tokens),
                ("reasoning", usage.reasoning_tokens),
            ):
                if tokens:
                    self.model_tokens.labels(provider, model, kind).inc(tokens)

    def flow_admitted(self, model: str, seconds: float, reserved: Amounts | None) -> None:
        self.flow_checks.labels(model).observe(seconds)
        if reserved is not None:
            self.quota_tokens.labels(model, "input", "reserved").inc(reserved.input_tokens)
            self.quota_tokens.labels(model, "output", "reserved").inc(reserved.output_tokens)

    def flow_settled(self, model: str, reserved: Amounts, usage: Usage) -> None:
        for kind, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            if tokens is not None:
                self.quota_tokens.labels(model, kind, "used").inc(tokens)

    def flow_waited(self, model: str, reason: str, seconds: float) -> None:
        self.flow_waits.labels(model, reason).observe(seconds)

    def breaker_changed(self, model: str, state: str) -> None:
        self.breaker_changes.labels(model, state).inc()

    def tool_call(self, tool: str, operation: str, outcome: str, code: str | None, seconds: float) -> None:
        self.tool_calls.labels(tool, operation, outcome, code or NONE).observe(seconds)

    def claimed(self, waits: Sequence[float]) -> None:
        for seconds in waits:
            self.claim_latency.observe(max(seconds, 0.0))

    def replayed(self, report: ReplayReport) -> None:
        self.replays.labels(report.codes[0] if report.findings else NONE).inc()

    # -- exposition --------------------------------------------------------------------------------------------
    def registry_for(self, store: Store | None) -> CollectorRegistry:
        """A registry of this process's families, its CPU and memory, and (with `store`) the tasks' gauges."""
        registry = CollectorRegistry()
        for family in self.families:
            registry.register(family)
        ProcessCollector(registry=registry)
        if store is not None:
            registry.register(StoreCollector(store))
        return registry


class StateClock:
    """When each task entered the state it is in, as this process saw its events one after another.

    A task's entry is kept while every event of it since is seen here (seq after seq): a worker that moves a task
    through its states times each visit from memory. When a visit ends that began out of sight (another process
    appended meanwhile, or this one forgot the task), its start is read from the log (`entered`). The oldest
    entries are forgotten past `VISITS_KEPT`.
    """

    def __init__(self, size: int = VISITS_KEPT) -> None:
        self.size = size
        #: task id -> (the seq of the last event seen, when the task entered the state it was in then).
        self._entered: OrderedDict[str, tuple[int, datetime]] = OrderedDict()
        self._lock = threading.Lock()  # a worker appends from several threads (one task on one at a time)

    def seen(self, event: Event, entered: Callable[[], datetime | None] | None) -> float | None:
        """The seconds of the visit `event` ends (None: it ends none, or its start is not known)."""
        with self._lock:
            kept = self._entered.pop(event.task_id, None)
        seconds = None
        if leaves_state(event):
            since = kept[1] if kept is not None and kept[0] == event.seq - 1 else entered() if entered else None
            seconds = (event.at - since).total_seconds() if since is not None else None
            start = event.at
        elif event.from_state is None:
            start = event.at
        elif kept is not None and kept[0] == event.seq - 1:
            start = kept[1]
        else:
            return None  # a step within a visit that began out of sight: its end reads the log
        with self._lock:
            self._entered[event.task_id] = (event.seq, start)
            if len(self._entered) > self.size:
                self._entered.popitem(last=False)
        return seconds


#: The media type of `exposition` (Prometheus text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format Prometheus scrapes."""
    return generate_latest(registry)


def serve(registry: CollectorRegistry, host: str, port: int) -> Callable[[], None]:
    """Serve `registry` over HTTP on `host`:`port` from a daemon thread (`railyard worker --metrics-port`); returns
    what stops it. Raises OSError if the port cannot be bound."""
    server, thread = start_http_server(port, addr=host, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


class StoreCollector(Collector):
    """Where the tasks stand, read from the database at each scrape (the figures `railyard status` prints)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> Iterator[Metric]:
        families = self._families() + (_flow_families() if isinstance(self.store, FlowStore) else ())
        return iter(families)  # the names, without a query at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._tasks()
        if isinstance(self.store, FlowStore):
            yield from self._flow(self.store)

    def _flow(self, store: FlowStore) -> Iterator[Metric]:
        """The breakers, buckets and queues every worker shares (`engine.core.flow`), as the database has them."""
        state, in_flight, waiting, level = _flow_families()
        try:
            breakers, buckets, waits = store.flow_rows()
        except RailyardError as error:
            log.warning("metrics: could not read the flow rows: %s", error.code)
            return
        for b in breakers:
            for name in ("closed", "open", "half_open"):
                state.add_metric([b.key, name], 1.0 if b.state == name else 0.0)
        queued: dict[str, int] = {}
        for w in waits:
            queued[w.key] = queued.get(w.key, 0) + 1
        for q in buckets:
            in_flight.add_metric([q.key], float(in_flight_now(q, q.at)))
            waiting.add_metric([q.key], float(queued.get(q.key, 0)))
            for measure, value in (
                ("requests", q.requests),
                ("input_tokens", q.input_tokens),
                ("output_tokens", q.output_tokens),
            ):
                level.add_metric([q.key, measure], value)
        yield from (state, in_flight, waiting, level)

    def _tasks(self) -> Iterator[Metric]:
        tasks, leased, depth, oldest, up = self._families()
        at = now()
        try:
            counts = self.store.status_counts(at)
        except RailyardError as error:  # the database is away: the gauges say so, the scrape still answers
            log.warning("metrics: could not read the task counts: %s", error.code)
            up.add_metric([], 0)
            return iter((tasks, leased, depth, oldest, up))
        up.add_metric([], 1)
        runnable: dict[str, dict[str, Any]] = {}
        for c in counts:
            tasks.add_metric([c["workflow"], c["status"]], c["tasks"])
            if c["status"] == "runnable":
                runnable[c["workflow"]] = c
            leased.add_metric([c["workflow"], c["status"]], c["leased"])
        for workflow, c in sorted(runnable.items()):
            depth.add_metric([workflow], max(c["tasks"] - c["leased"], 0))
            due = c["oldest_due"]
            oldest.add_metric([workflow], max((at - due).total_seconds(), 0.0) if due is not None else 0.0)
        return iter((tasks, leased, depth, oldest, up))

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "railyard_tasks",
                "Tasks by workflow and status (runnable, blocked, terminal).",
                labels=["workflow", "status"],
            ),
            GaugeMetricFamily(
                "railyard_tasks_leased",
                "Tasks a worker holds a live lease on, by workflow and status.",
                labels=["workflow", "status"],
            ),
            GaugeMetricFamily(
                "railyard_queue_depth",
                "Runnable tasks no worker holds: waiting for a claim (or for their backoff to end).",
                labels=["workflow"],
            ),
            GaugeMetricFamily(
                "railyard_oldest_due_seconds",
                "How long the longest-due runnable task has been due, in seconds (0: none is due).",
                labels=["workflow"],
            ),
            GaugeMetricFamily(
                "railyard_database_up", "1 if the last scrape could read the task counts from the database, else 0."
            ),
        )


def _flow_families() -> tuple[GaugeMetricFamily, ...]:
    return (
        GaugeMetricFamily(
            "railyard_breaker_state",
            "Each provider:model's circuit breaker: 1 for the state it is in (closed, open, half_open), else 0.",
            labels=["model", "state"],
        ),
        GaugeMetricFamily(
            "railyard_quota_in_flight", "Calls in flight under each quota, over every worker.", labels=["quota"]
        ),
        GaugeMetricFamily(
            "railyard_quota_waiting", "Tasks waiting for each quota (put off, holding no lease).", labels=["quota"]
        ),
        GaugeMetricFamily(
            "railyard_quota_level",
            "What each quota bucket held when last written, by measure (requests, input_tokens, output_tokens); "
            "below 0 while it pays back a call that used more than it reserved.",
            labels=["quota", "measure"],
        ),
    )
