"""What the runtime and the audit drivers call at each observable point, behind one flag.

A hot path reads `hooks.active` (one module attribute) and calls in only when
it is true, so a process with neither traces nor metrics turned on pays that
one check per transition, model call, tool call, claim or replay, and imports
neither `opentelemetry` nor `prometheus_client` (tests/test_observability.py
proves both; bench/append.py measures the rest). Each hook hands plain values
to `traces.Tracing` and `metrics.Metrics`, whichever is on: neither sees the
engine, so neither can change what a task does.

Spans are made after the fact where the work is one call (a transition's
append, a model call, a tool call, a claim): the hook gets the `perf_counter`
reading taken before it, so the span has the right start and end without a
context manager around the call. A step is the one span held open while it
runs, so that everything inside it becomes its children.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from engine.core.events import Event
from engine.core.flow import Amounts
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelResponse, Usage
from engine.core.payloads import event_code
from engine.core.replay import ReplayReport
from engine.core.rows import Claim
from engine.core.task import TaskState

if TYPE_CHECKING:
    from engine.observability.metrics import Metrics
    from engine.observability.traces import Tracing

log = logging.getLogger("railyard.observability")

#: Whether tracing or metrics (or both) are on: the one thing a hot path reads.
active: bool = False
#: The tracer wrapper while tracing is on, else None.
tracing: Tracing | None = None
#: The metric families while metrics are on, else None.
recording: Metrics | None = None

_configured = False
_lock = threading.Lock()


# -- turning it on -----------------------------------------------------------------------------------------------
def traces_requested(env: Mapping[str, str]) -> bool:
    """Whether the standard OpenTelemetry variables ask this process for traces.

    OTEL_SDK_DISABLED=true says no; OTEL_TRACES_EXPORTER names the exporters (`none` alone says no); without it an
    OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) says yes.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None and exporters.strip():
        return any(name.strip() not in ("", "none") for name in exporters.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure() -> None:
    """Turn tracing on once per process if the OTEL_* variables ask for it (every `Engine` calls this).

    Without the `railyard[otel]` extra installed the request is logged once and ignored: a process that cannot
    export spans still runs its tasks.
    """
    global _configured
    if _configured:
        return
    with _lock:
        if _configured:
            return
        _configured = True
        if not traces_requested(os.environ):
            return
        try:
            enable_tracing()
        except ImportError as missing:
            log.warning(
                "OTEL_* variables ask for traces, but OpenTelemetry is not installed (%s): no spans are emitted; "
                "install railyard[otel]",
                missing.name,
            )


def enable_tracing(provider: Any = None) -> None:
    """Emit spans through `provider` (an OpenTelemetry `TracerProvider`); without one, through the global provider,
    or one built from the OTEL_* variables if no global provider is set. Raises ImportError without the extra."""
    global tracing
    from engine.observability.traces import Tracing

    tracing = Tracing(provider)
    _refresh()


def enable_metrics() -> Metrics:
    """Record Prometheus metrics in this process from now on; returns the families (the same ones on each call)."""
    global recording
    with _lock:
        if recording is None:
            from engine.observability.metrics import Metrics

            recording = Metrics()
        _refresh()
        return recording


def close_tracing(within: float | None = None) -> None:
    """Send the spans still queued and stop the exporters built from the OTEL_* variables, waiting at most `within`
    seconds (default: the configured export timeout); nothing when tracing is off or the application set up its
    own provider."""
    if tracing is None:
        return
    from engine.observability import traces

    traces.close(traces.export_timeout() if within is None else within)


def disable() -> None:
    """Stop emitting spans and recording metrics (tests; a process that turns them off again)."""
    global tracing, recording
    tracing = None
    recording = None
    _refresh()


def _refresh() -> None:
    global active
    active = tracing is not None or recording is not None


# -- the hooks ---------------------------------------------------------------------------------------------------
async def step(task: TaskState, kind: str, run: Callable[[TaskState], Awaitable[TaskState]]) -> TaskState:
    """`run(task)`, one step of a task (an agent turn, a tool step): its own trace, everything inside it children."""
    if tracing is None:
        return await run(task)
    return await tracing.step(task, kind, run)


def transition(
    event: Event,
    workflow: str,
    version: int,
    started: float,
    entered: Callable[[], datetime | None] | None = None,
) -> None:
    """An event was appended (`started`: the perf_counter reading before it was decided and sealed; `entered`: when
    the task entered the state it was in, read from its log, asked only if the metrics need it)."""
    code = event_code(event.data)
    if recording is not None:
        recording.transition(workflow, event.trigger, code)
        recording.quality(event, workflow, entered, version)
    if tracing is not None:
        tracing.transition(event, workflow, version, code, started)


def conflict(task: TaskState) -> None:
    """An append found the task moved on (or its lease taken over): nothing was written."""
    if recording is not None:
        recording.conflict(task.workflow)


def model_call(
    provider: str,
    model: str,
    profile: str,
    started: float,
    *,
    response: ModelResponse | None = None,
    error: ModelError | None = None,
    waited: float | None = None,
) -> None:
    """One request to a model returned `response` or failed with `error`, after `waited` seconds of flow control
    (the breaker, the queue for quota; None: it went through none)."""
    elapsed = time.perf_counter() - started
    named = provider_name(provider, profile)
    if recording is not None:
        recording.model_call(named, model, elapsed, response, error)
    if tracing is not None:
        tracing.model_call(named, model, profile, started, response, error, waited)


#: The provider's name in the GenAI conventions' spelling, for the capability profiles whose provider they name
#: otherwise.
GEN_AI_PROVIDERS = {
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "qwen": "alibaba",
    "glm": "zhipu",
    "ollama": "ollama",
}


def provider_name(provider: str, profile: str) -> str:
    """The one name traces (`gen_ai.provider.name`) and metrics (the `provider` label) give who answered a model
    call: the scripted model is `scripted`, whichever profile it plays; an SDK adapter's is the provider its
    capability profile names (an OpenAI-compatible endpoint is often someone else's), in the conventions' spelling."""
    if provider == "scripted" or not profile:
        return provider
    return GEN_AI_PROVIDERS.get(profile, profile)


def tool_call(
    task: TaskState, tool: str, operation: str, action_id: str, outcome: str, code: str | None, seconds: float
) -> None:
    """A tool ran (`operation` "execute"), or its remote was asked what happened ("reconcile"), for `seconds` up
    to now."""
    if recording is not None:
        recording.tool_call(tool, operation, outcome, code, seconds)
    if tracing is not None:
        tracing.tool_call(task, tool, operation, action_id, outcome, code, time.perf_counter() - seconds)


def claimed(worker: str, claims: Sequence[Claim], started: float, at: datetime) -> None:
    """A worker's claim returned `claims` at `at` (each due at its `due_at`)."""
    if recording is not None:
        recording.claimed([(at - c.due_at).total_seconds() for c in claims])
    if tracing is not None and claims:  # an idle poll is not a trace
        tracing.claimed(worker, claims, started)


def lease_lost(task_id: str) -> None:
    """A worker found its lease on `task_id` taken over by another."""
    if recording is not None:
        recording.lease_lost()


def replayed(report: ReplayReport, started: float) -> None:
    """Replay checked one task's log (`started`: the perf_counter reading before its first event was read)."""
    if recording is not None:
        recording.replayed(report)
    if tracing is not None:
        tracing.replayed(report, started)


def replays(reports: Iterator[ReplayReport]) -> Iterator[ReplayReport]:
    """`replayed` for each report of a stream, timed from the previous one."""
    started = time.perf_counter()
    for report in reports:
        replayed(report, started)
        yield report
        started = time.perf_counter()


def flow_admitted(model: str, seconds: float, reserved: Amounts | None) -> None:
    """A model call of `model` (`provider:model`) was let through by flow control after `seconds` of checks, with
    `reserved` taken from its quota (None: it has none)."""
    if recording is not None:
        recording.flow_admitted(model, seconds, reserved)


def flow_settled(model: str, reserved: Amounts, usage: Usage) -> None:
    """A call's reservation was settled with the usage the provider reported."""
    if recording is not None:
        recording.flow_settled(model, reserved, usage)


def flow_waited(key: str, reason: str, seconds: float) -> None:
    """A model call was put off `seconds` for `reason` (`breaker`, `quota`)."""
    if recording is not None:
        recording.flow_waited(key.split("#", 1)[0], reason, seconds)


def breaker_changed(model: str, state: str) -> None:
    """This process saw the breaker of `model` open, or closed it with its probe."""
    if recording is not None:
        recording.breaker_changed(model, state)
