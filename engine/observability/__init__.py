"""Observability: OpenTelemetry traces and Prometheus metrics, paid for only when they are turned on.

The runtime and the audit drivers call `engine.observability.hooks` at the few
points that matter (a transition, a model call, a tool call, a claim, a
replay) behind one module flag, `hooks.active`. While it is false (the
default) nothing else runs: neither `opentelemetry` nor `prometheus_client` is
imported, no span or sample is made. `traces` and `metrics` import their
libraries at the top and are only imported once tracing or metrics are turned
on (`hooks.enable_tracing`, `hooks.enable_metrics`, or the standard `OTEL_*`
variables seen by `hooks.configure`). `health` answers the readiness probe.

This layer sits between the store and the runtime: it may read the store (queue
gauges, the schema revision), and the runtime and the audit drivers call it.
"""
