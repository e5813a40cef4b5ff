"""OpenTelemetry spans for steps, transitions, model calls, tool calls, claims and replays.

Imported only once tracing is turned on (`hooks.enable_tracing`): this module
imports `opentelemetry` at the top, and a process that never asks for traces
never loads it.

One trace per step of a task: the step is the root span (`railyard.step`), its
transitions, model calls and tool calls its children. A task's steps run on
whichever worker holds it, so each root carries `railyard.task.id` and links to
the task's own trace id, derived from the task id (`task_link`): every worker
links a task's steps to the same id without asking anyone. Model calls follow
the OpenTelemetry GenAI conventions (span `chat {model}`, kind CLIENT,
`gen_ai.*` attributes); tool calls their `execute_tool {tool}` span.

Without a provider given, spans go to the global one; if none is set (no
`opentelemetry-instrument`, no SDK set up by the application), one is built
here from the OTEL_* variables: the resource (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES; `railyard` when no service is named), the sampler
(OTEL_TRACES_SAMPLER) and the exporters named by OTEL_TRACES_EXPORTER (default
`otlp`), each behind a batch processor.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from engine.core.errors import Code, RailyardError
from engine.core.events import Event
from engine.core.model_errors import ModelError
from engine.core.model_interface import ModelResponse
from engine.core.replay import ReplayReport
from engine.core.rows import Claim
from engine.core.task import TaskState

TRACER_NAME = "railyard"
#: OTEL_TRACES_EXPORTER names and the entry point (group `opentelemetry_traces_exporter`) each one loads.
EXPORTER_ALIASES = {"otlp": "otlp_proto_http"}


class Tracing:
    """The spans of one process, made through one tracer."""

    def __init__(self, provider: Any = None) -> None:
        chosen = provider if provider is not None else _global_or_from_env()
        self.tracer = chosen.get_tracer(TRACER_NAME)

    # -- a step and what happens in it ------------------------------------------------------------------------
    async def step(self, task: TaskState, kind: str, run: Callable[[TaskState], Awaitable[TaskState]]) -> TaskState:
        attributes = {**_task(task), "railyard.state.kind": kind}
        with self.tracer.start_as_current_span(
            "railyard.step", context=Context(), links=[task_link(task.task_id)], attributes=attributes
        ) as span:
            after = await run(task)
            span.set_attribute("railyard.to_state", after.state)
            span.set_attribute("railyard.seq", after.seq)
            return after

    def transition(self, event: Event, workflow: str, version: int, code: str | None, started: float) -> None:
        attributes: dict[str, AttributeValue] = {
            "railyard.task.id": event.task_id,
            "railyard.workflow": workflow,
            "railyard.workflow.version": version,
            "railyard.state": event.to_state,
            "railyard.from_state": event.from_state or "",
            "railyard.trigger": event.trigger,
            "railyard.seq": event.seq,
        }
        if code:
            attributes["railyard.code"] = code
        inside = trace.get_current_span().get_span_context().is_valid
        span = self.tracer.start_span(
            "railyard.transition",
            # Outside a step (a start, a person's command), the transition is its task's step: a root, linked.
            links=None if inside else [task_link(event.task_id)],
            attributes=attributes,
            start_time=_wall_ns(started),
        )
        span.end()

    def model_call(
        self,
        provider: str,
        model: str,
        profile: str,
        started: float,
        response: ModelResponse | None,
        error: ModelError | None,
        waited: float | None = None,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,  # `hooks.provider_name`: the name the metrics give it too
            # The name the conventions used before gen_ai.provider.name (up to v1.36), for backends still on it.
            "gen_ai.system": provider,
            "gen_ai.request.model": model,
            "railyard.profile": profile,
        }
        if waited is not None:  # what flow control held it back (`engine.runtime.flow.WAITED`)
            attributes["railyard.flow.wait_seconds"] = waited
        if response is not None:
            attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
            if response.response_model:  # only what the provider said
                attributes["gen_ai.response.model"] = response.response_model
            if response.response_id:
                attributes["gen_ai.response.id"] = response.response_id
            if response.usage.input_tokens is not None:  # only what the provider reported
                attributes["gen_ai.usage.input_tokens"] = response.usage.input_tokens
            if response.usage.output_tokens is not None:
                attributes["gen_ai.usage.output_tokens"] = response.usage.output_tokens
        span = self.tracer.start_span(
            f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes, start_time=_wall_ns(started)
        )
        if error is not None:
            span.set_attribute("error.type", str(error.code))
            span.set_attribute("railyard.code", str(error.code))
            span.set_status(Status(StatusCode.ERROR, str(error.code)))
        span.end()

    def tool_call(
        self,
        task: TaskState,
        tool: str,
        operation: str,
        action_id: str,
        outcome: str,
        code: str | None,
        started: float,
    ) -> None:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": action_id,
            **_task(task),
            "railyard.tool.operation": operation,
            "railyard.tool.outcome": outcome,
        }
        if code:
            attributes["railyard.code"] = code
        name = f"execute_tool {tool}" if operation == "execute" else f"reconcile {tool}"
        span = self.tracer.start_span(name, attributes=attributes, start_time=_wall_ns(started))
        if outcome != "succeeded" and code:
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()

    # -- a worker's claim, an auditor's replay ----------------------------------------------------------------
    def claimed(self, worker: str, claims: Sequence[Claim], started: float) -> None:
        span = self.tracer.start_span(
            "railyard.claim",
            context=Context(),
            links=[task_link(c.task_id) for c in claims],
            attributes={
                "railyard.worker": worker,
                "railyard.claimed": len(claims),
                "railyard.task.ids": [c.task_id for c in claims],
            },
            start_time=_wall_ns(started),
        )
        span.end()

    def replayed(self, report: ReplayReport, started: float) -> None:
        workflow, _, version = report.workflow.partition("@")
        attributes: dict[str, AttributeValue] = {
            "railyard.task.id": report.task_id,
            "railyard.workflow": workflow,
            "railyard.seq": report.events,
            "railyard.findings": len(report.findings),
        }
        if version.isdigit():
            attributes["railyard.workflow.version"] = int(version)
        if report.findings:
            attributes["railyard.code"] = report.codes[0]
        span = self.tracer.start_span(
            "railyard.replay",
            context=Context(),
            links=[task_link(report.task_id)] if report.task_id else None,
            attributes=attributes,
            start_time=_wall_ns(started),
        )
        if report.findings:
            span.set_status(Status(StatusCode.ERROR, ", ".join(report.codes)))
        span.end()


def task_link(task_id: str) -> Link:
    """A link to the task's own trace: ids derived from the task id, so every process links a task's steps alike."""
    return Link(task_context(task_id), {"railyard.task.id": task_id})


def task_context(task_id: str) -> SpanContext:
    digest = hashlib.sha256(f"railyard.task:{task_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1  # an all-zero id is invalid
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _task(task: TaskState) -> dict[str, AttributeValue]:
    return {
        "railyard.task.id": task.task_id,
        "railyard.workflow": task.workflow,
        "railyard.workflow.version": task.version,
        "railyard.state": task.state,
        "railyard.seq": task.seq,
    }


def _wall_ns(started: float) -> int:
    """The wall-clock instant (ns since the epoch) of an earlier perf_counter reading."""
    return time.time_ns() - int((time.perf_counter() - started) * 1e9)


# -- a provider from the OTEL_* variables ------------------------------------------------------------------------
#: The provider this module built from the OTEL_* variables (None: the application's, or none yet): the one whose
#: exporters it may stop at exit, and whose export errors it reports.
_built: Any = None
#: Set once an exporter said it could not export (a warning or an error): `close` stops waiting for it then.
_export_failed = threading.Event()
#: Where the exporters log: their first warning or error is the one line a process prints about them.
EXPORTER_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk.trace.export", "opentelemetry.sdk._shared_internal")


def _global_or_from_env() -> Any:
    global _built
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):  # set by opentelemetry-instrument or the application
        return current
    provider = provider_from_env()
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is provider:
        _built = provider
        _one_line_about_exporters()
        atexit.register(close, export_timeout())
    return trace.get_tracer_provider()


def provider_from_env() -> Any:
    """An SDK TracerProvider as the OTEL_* variables describe it (see the module's docstring). It is not shut down
    by the SDK's own exit hook, which waits as long as an exporter retries: `close` bounds that wait."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "railyard"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    names = [n.strip() for n in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    for name in names:
        if name != "none":
            watched = cast("SpanExporter", _Watched(load_exporter(name)))  # an exporter in all but its class
            provider.add_span_processor(BatchSpanProcessor(watched))
    return provider


class _Watched:
    """An exporter whose last export is remembered: a failure (or a retry under way, which its log line says) lets
    `close` stop waiting; a success, after the endpoint came back, makes it wait again."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            _export_failed.clear()
        else:
            _export_failed.set()
        return result

    def __getattr__(self, name: str) -> Any:  # shutdown, force_flush: the exporter's own
        return getattr(self.inner, name)


def export_timeout() -> float:
    """The seconds an export may take, as the OTEL_* variables configure it (the exporter's own default: 10)."""
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = os.environ.get(name, "").strip()
        try:
            if raw and float(raw) >= 0:
                return float(raw)
        except ValueError:
            continue
    return 10.0


def close(within: float) -> None:
    """Hand the spans still queued to the exporters and stop them, waiting at most `within` seconds: an endpoint
    that does not answer costs a process no more than that (a short CLI command passes a fraction of a second;
    whatever is not sent by then is dropped). Only the provider built here; once."""
    global _built
    provider, _built = _built, None
    if provider is None:
        return
    stopping = threading.Thread(target=provider.shutdown, name="railyard-traces-close", daemon=True)
    stopping.start()
    deadline = time.monotonic() + max(0.0, within)
    # Done, out of time, or an export already failed: an endpoint that refused is not waited for while it retries.
    while stopping.is_alive() and not _export_failed.is_set() and (left := deadline - time.monotonic()) > 0:
        stopping.join(min(left, 0.02))


class _OneLine(logging.Handler):
    """The exporters' first warning or error, as one line on stderr; the rest are counted, not printed: an endpoint
    that does not answer is said once, not once per retry and batch."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said = False

    def emit(self, record: logging.LogRecord) -> None:
        _export_failed.set()
        if self.said:
            return
        self.said = True
        text = " ".join(record.getMessage().split())[:300]
        with contextlib.suppress(OSError, ValueError):  # stderr closed: nowhere to say it
            sys.stderr.write(f"traces are not exported: {text} (said once; later export errors are not shown)\n")


def _one_line_about_exporters() -> None:
    handler = _OneLine()
    for name in EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False


def load_exporter(name: str) -> Any:
    """The span exporter OTEL_TRACES_EXPORTER names, found by its entry point as the SDK registers them."""
    wanted = EXPORTER_ALIASES.get(name, name)
    if name == "otlp" and os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").startswith("grpc"):
        wanted = "otlp_proto_grpc"
    found = list(entry_points(group="opentelemetry_traces_exporter", name=wanted))
    if not found:
        raise RailyardError(
            f"OTEL_TRACES_EXPORTER names {name!r}, and no installed package provides that span exporter "
            "(railyard[otel] brings `otlp` over http/protobuf and `console`)",
            code=Code.CONFIG_INVALID,
        )
    return found[0].load()()
