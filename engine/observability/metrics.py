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
definitions, codes from the closed `Code` enum, outcomes from the tool
protocol. Task ids are never labels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
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
from engine.core.errors import RailyardError
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelResponse
from engine.core.replay import ReplayReport
from engine.store import Store

log = logging.getLogger("railyard.observability")

#: The label value for "no code" (Prometheus treats an empty label value as an absent label).
NONE = "none"

MODEL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLAIM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


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
        self.families: tuple[Collector, ...] = (
            self.transitions,
            self.conflicts,
            self.lease_losses,
            self.model_calls,
            self.model_tokens,
            self.tool_calls,
            self.claim_latency,
            self.replays,
        )

    # -- recording ---------------------------------------------------------------------------------------------
    def transition(self, workflow: str, trigger: str, code: str | None) -> None:
        self.transitions.labels(workflow, trigger, code or NONE).inc()

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
        return iter(self._families())  # the names, without a query at registration

    def collect(self) -> Iterator[Metric]:
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
