"""Traces, metrics and health probes, as an operator meets them.

A refund runs through a real worker and the OpenAI adapter (its official SDK
against the local wire-format server, which reports token usage), once with
the OpenTelemetry SDK's in-memory exporter and once under `railyard serve`'s
application behind a real HTTP server whose `/metrics` is scraped. The probes
are asked over HTTP, without a token, of a database that is migrated, behind
or unreachable; `railyard worker --metrics-port` is served by the real command.
And a process that turns none of it on never imports either library.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from engine import Code, ConcurrencyConflict, Engine, Registry, ScriptedModel, Worker, migrations
from engine.api import TokenTable, create_app
from engine.core.model_interface import ModelRequest, ModelResponse
from engine.observability import hooks
from engine.observability.traces import task_context
from engine.providers.openai_adapter import OpenAIAdapter
from engine.providers.scripted import call
from engine.runtime.agent import RetryPolicy
from tests.support import reference
from tests.support.api import free_port, live_server
from tests.support.postgres import create_pg_database, drop_pg_database, pg_reachable
from tests.support.provider_server import ProviderServer, no_sleep, openai_completion, openai_error
from tests.support.reference import DAMAGED, expire_leases
from workflows.scripts import TICKET_DOUBLE_CHARGE, TICKET_DOUBLE_CHARGE_INPUT

REPO = Path(__file__).resolve().parent.parent
books, eng = reference.books, reference.eng  # the reference workflows' fixtures
#: The OpenAI-compatible local server answers with usage (11 input, 7 output tokens) on every completion.
USAGE = (11, 7)
NO_SLEEP = RetryPolicy(attempts=2, base_delay=0.0, sleep=no_sleep)


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture(autouse=True)
def nothing_on() -> Iterator[None]:
    """Each test turns on what it observes, and leaves the process as it found it: nothing on."""
    hooks.disable()
    yield
    hooks.disable()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks.enable_tracing(provider)
    yield exporter
    provider.shutdown()


def tool_reply(name: str, **arguments: Any) -> Any:
    return openai_completion(
        tool_calls=((f"call-{name}", name, json.dumps(arguments)),), finish_reason="tool_calls", usage=USAGE
    )


def refund_replies(server: ProviderServer) -> None:
    """The model looks O-1001 up, finds it eligible, proposes 150.00 (over the refundable balance: the guard
    refuses, a repair follows), then 129.99; the first request is rate limited and retried."""
    proposal = {"order_id": "O-1001", "currency": "EUR", "reason": "Screen cracked.", "evidence_ids": ["EV-1"]}
    server.reply(
        openai_error(429, "Rate limit reached"),
        tool_reply("query_order", order_id="O-1001"),
        tool_reply("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
        tool_reply("propose_refund", amount=15_000, **proposal),
        tool_reply("propose_refund", amount=12_999, **proposal),
    )


def paid_refund(eng: Engine, server: ProviderServer) -> tuple[str, Worker]:
    """A refund taken by a worker to its approval, approved by dana, paid by the worker: completed."""
    server.reset()
    refund_replies(server)
    adapter = OpenAIAdapter("gpt-4.1", base_url=server.openai_base_url, api_key="test", timeout=5)
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    worker = Worker(eng, name="w-obs", model=adapter, concurrency=1, listen=False)
    assert worker.run_once() == 1
    assert eng.get(task_id).state == "awaiting_approval"
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"], comment="photo checked")
    assert worker.run_once() == 1
    assert eng.get(task_id).state == "completed"
    return task_id, worker


# -- traces ------------------------------------------------------------------------------------------------------
def by_name(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def test_a_refund_emits_one_trace_per_step_linked_by_its_task_id(
    eng: Engine, server: ProviderServer, spans: InMemorySpanExporter
) -> None:
    task_id, _ = paid_refund(eng, server)
    assert eng.replay(task_id).ok
    found = spans.get_finished_spans()
    history = eng.history(task_id)

    steps = by_name(found, "railyard.step")
    # Agent turns: query, assess, two proposals (one repaired); tool steps: the look-up, the payment.
    assert len(steps) == 6
    assert all(s.parent is None for s in steps), "a step is the root of its own trace"
    assert len({s.context.trace_id for s in steps}) == len(steps)
    link = task_context(task_id)
    for step in steps:
        assert step.attributes is not None and step.attributes["railyard.task.id"] == task_id
        assert [(li.context.trace_id, li.context.span_id) for li in step.links] == [(link.trace_id, link.span_id)]
        assert step.attributes["railyard.workflow"] == "refund" and step.attributes["railyard.workflow.version"] == 1
    assert sorted(str(s.attributes["railyard.state.kind"]) for s in steps if s.attributes) == [
        "agent",
        "agent",
        "agent",
        "agent",
        "tool",
        "tool",
    ]
    step_ids = {s.context.span_id: s for s in steps}

    # Every event of the log is one transition span, with its trigger, seq, state and code.
    transitions = by_name(found, "railyard.transition")
    attributes = sorted((dict(t.attributes or {}) for t in transitions), key=lambda a: int(str(a["railyard.seq"])))
    assert [(a["railyard.seq"], a["railyard.trigger"], a["railyard.state"]) for a in attributes] == [
        (e.seq, e.trigger, e.to_state) for e in history
    ]
    repaired = next(e for e in history if e.to_state.endswith("~force"))
    forced = next(a for a in attributes if a["railyard.seq"] == repaired.seq)
    assert forced["railyard.code"] == repaired.data["turn"]["code"]
    assert {a["railyard.workflow"] for a in attributes} == {"refund"}
    for t in transitions:
        attrs = t.attributes or {}
        if attrs["railyard.trigger"] in ("start", "approve"):  # a person's command: its own root, linked
            assert t.parent is None and [li.context.trace_id for li in t.links] == [link.trace_id]
        else:  # inside the step that made it
            assert t.parent is not None and t.parent.span_id in step_ids
            assert t.context.trace_id == step_ids[t.parent.span_id].context.trace_id

    # Model calls: GenAI conventions, the retried 429 its own failed call, token usage as reported.
    chats = by_name(found, "chat gpt-4.1")
    assert len(chats) == 5
    failed = [c for c in chats if c.attributes and "error.type" in c.attributes]
    assert [c.attributes["error.type"] for c in failed if c.attributes] == [str(Code.RATE_LIMITED)]
    for chat in chats:
        attrs = chat.attributes or {}
        assert chat.parent is not None and chat.parent.span_id in step_ids
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai" and attrs["gen_ai.request.model"] == "gpt-4.1"
        if chat not in failed:
            assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == USAGE
            # What the provider said of its answer (the local server names its model test-model).
            assert (attrs["gen_ai.response.model"], attrs["gen_ai.response.id"]) == ("test-model", "chatcmpl-test")
            assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("tool_calls",)  # type: ignore[arg-type]
        else:
            assert "gen_ai.response.model" not in attrs and "gen_ai.response.id" not in attrs
    assert chats[0].kind.name == "CLIENT"

    # Tool calls: the look-up and the payment, each inside its tool step.
    tools = [s for s in found if s.name.startswith("execute_tool ")]
    assert sorted(s.name for s in tools) == ["execute_tool payments_refund", "execute_tool query_order"]
    for tool in tools:
        attrs = tool.attributes or {}
        assert tool.parent is not None and step_ids[tool.parent.span_id].attributes["railyard.state.kind"] == "tool"  # type: ignore[index]
        assert attrs["gen_ai.operation.name"] == "execute_tool" and attrs["railyard.tool.outcome"] == "succeeded"
        assert attrs["gen_ai.tool.name"] == tool.name.split(" ", 1)[1]

    # Claims: one per run of the worker, each linking the task it claimed.
    claims = by_name(found, "railyard.claim")
    assert len(claims) == 2 and all(c.parent is None for c in claims)
    assert all((c.attributes or {})["railyard.worker"] == "w-obs" for c in claims)
    assert all([li.context.trace_id for li in c.links] == [link.trace_id] for c in claims)

    # Replay: one span for the task, no findings; a replay of all tasks, one span each.
    (replay,) = by_name(found, "railyard.replay")
    assert (replay.attributes or {})["railyard.findings"] == 0
    assert (replay.attributes or {})["railyard.seq"] == len(history)
    spans.clear()
    assert [r.task_id for r in eng.audit.replay_all(workflow="refund")] == [task_id]
    (again,) = by_name(spans.get_finished_spans(), "railyard.replay")
    assert (again.attributes or {})["railyard.task.id"] == task_id and again.parent is None


# -- metrics -----------------------------------------------------------------------------------------------------
def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """/metrics, without a token: each sample name -> its (labels, value)."""
    answer = httpx.get(f"{base}/metrics", timeout=10)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for found, v in samples.get(name, []) if all(found.get(k) == x for k, x in labels.items()))


class TakenOver:
    """A model whose turn outlasts the lease: meanwhile another worker claims the task (a new epoch)."""

    provider = "scripted"

    def __init__(self, eng: Engine, inner: ScriptedModel) -> None:
        self.eng, self.inner = eng, inner
        self.model, self.profile = inner.model, inner.profile

    async def complete(self, request: ModelRequest) -> ModelResponse:
        expire_leases(self.eng)
        assert self.eng.store.claim("thief", limit=1, lease_seconds=30, workflows=["ticket_triage"])
        return await self.inner.complete(request)


def test_metrics_after_a_worker_run_have_every_family(eng: Engine, server: ProviderServer) -> None:
    app = create_app(eng, TokenTable.from_tokens({}), session_secret="s")
    with live_server(app) as base:
        task_id, worker = paid_refund(eng, server)
        # A lease taken over mid-turn, and a command decided on a state the task has left.
        triage = eng.start("ticket_triage", TICKET_DOUBLE_CHARGE_INPUT, actor="sam")
        thief = Worker(eng, name="w-slow", model=TakenOver(eng, ScriptedModel(TICKET_DOUBLE_CHARGE)), listen=False)
        assert thief.run_once() == 1 and thief.counts.lease_losses == 1
        waiting = eng.start("refund", DAMAGED, actor="ann", version=1)  # runnable, due, claimed by nobody
        cancelled = eng.start("refund", DAMAGED, actor="ann", version=1)
        stale = eng.load(cancelled)
        eng.cancel(cancelled, actor="olga", reason="duplicate")
        with pytest.raises(ConcurrencyConflict):
            eng.transition(stale, "cancel", {"reason": "duplicate"}, actor="olga")
        samples = scrape(base)

    assert eng.get(waiting).status == "runnable"
    history = eng.history(task_id)
    assert value(samples, "railyard_transitions_total", workflow="refund") >= len(history)
    assert value(samples, "railyard_transitions_total", workflow="refund", trigger="approve", code="none") == 1
    repaired = next(e for e in history if e.to_state.endswith("~force"))
    code = str(repaired.data["turn"]["code"])
    assert value(samples, "railyard_transitions_total", workflow="refund", code=code) == 1
    assert value(samples, "railyard_model_call_seconds_count", model="gpt-4.1", code="none") == 4
    assert value(samples, "railyard_model_call_seconds_count", model="gpt-4.1", code=str(Code.RATE_LIMITED)) == 1
    assert value(samples, "railyard_model_tokens_total", model="gpt-4.1", type="input") == 4 * USAGE[0]
    assert value(samples, "railyard_model_tokens_total", model="gpt-4.1", type="output") == 4 * USAGE[1]
    assert value(samples, "railyard_tool_call_seconds_count", tool="payments_refund", outcome="succeeded") == 1
    assert value(samples, "railyard_tool_call_seconds_count", tool="query_order", operation="execute") == 1
    assert value(samples, "railyard_claim_latency_seconds_count") == 3
    assert value(samples, "railyard_lease_losses_total") == 1
    assert value(samples, "railyard_conflicts_total", workflow="ticket_triage") == 1  # the taken-over append
    assert value(samples, "railyard_conflicts_total", workflow="refund") == 1  # the cancel decided on a stale state
    # Where the tasks stand, read from the database at the scrape.
    assert value(samples, "railyard_tasks", workflow="refund", status="terminal") == 2
    assert value(samples, "railyard_tasks", workflow="refund", status="runnable") == 1
    assert value(samples, "railyard_tasks", workflow="ticket_triage", status="runnable") == 1
    assert value(samples, "railyard_tasks_leased", workflow="ticket_triage", status="runnable") == 1  # the thief's
    assert value(samples, "railyard_queue_depth", workflow="refund") == 1
    assert value(samples, "railyard_queue_depth", workflow="ticket_triage") == 0
    assert value(samples, "railyard_oldest_due_seconds", workflow="refund") >= 0
    assert value(samples, "railyard_database_up") == 1
    assert triage and worker.counts.claimed == 2


# -- probes ------------------------------------------------------------------------------------------------------
@pytest.fixture
def own_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of each kind that this test alone migrates up and down (never the session's shared one)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'probe.db'}"
        return
    if pg_reachable() is not None:
        pytest.skip("PostgreSQL is not reachable")
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


def probe(base: str, path: str) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"{base}{path}", timeout=10)
    return answer.status_code, answer.json()


@pytest.mark.parametrize("own_database", ["sqlite", "postgresql"], indirect=True)
def test_readyz_is_503_until_the_schema_is_at_head_and_healthz_needs_nothing(own_database: str) -> None:
    revision_of = migrations.current
    with (
        Engine(own_database, Registry([])) as engine,
        live_server(create_app(engine, TokenTable.from_tokens({}))) as base,
    ):
        assert probe(base, "/healthz") == (200, {"status": "ok"})
        status, body = probe(base, "/readyz")
        assert (status, body["code"]) == (503, str(Code.SCHEMA_MISSING))  # never migrated
        migrations.upgrade(own_database)
        at_head = revision_of(own_database)
        status, body = probe(base, "/readyz")
        assert (status, body["status"], body["revision"], body["head"]) == (200, "ready", [at_head], [at_head])
        migrations.downgrade(own_database, "-1")  # one release behind the code that serves it
        status, body = probe(base, "/readyz")
        assert (status, body["code"], body["head"]) == (503, str(Code.SCHEMA_NOT_AT_HEAD), [at_head])
        assert body["revision"] == [revision_of(own_database)] != [at_head]
        assert "railyard db upgrade" in body["message"]
        # No token for the probes and the metrics; the API still wants one.
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"{base}/api/tasks", timeout=10).status_code == 401


def test_readyz_is_503_when_the_database_does_not_answer() -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://railyard:secret@127.0.0.1:{port}/railyard?connect_timeout=2"
    with Engine(url, Registry([])) as engine, live_server(create_app(engine, TokenTable.from_tokens({}))) as base:
        status, body = probe(base, "/readyz")
        assert (status, body["status"], body["code"]) == (503, "not ready", str(Code.DATABASE_UNREACHABLE))
        assert "secret" not in json.dumps(body)
        assert probe(base, "/healthz")[0] == 200
        samples = scrape(base)
    assert value(samples, "railyard_database_up") == 0


# -- the worker's metrics port, for real -------------------------------------------------------------------------
def cli_env(tmp_path: Path) -> dict[str, str]:
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    migrations.upgrade(url)
    script = tmp_path / "finish.json"
    script.write_text(json.dumps({"turns": [call("finish")] * 3}), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "OTEL_"))}
    env.update(
        RAILYARD_DATABASE_URL=url,
        RAILYARD_WORKFLOWS="tests.support.sample_workflows",
        RAILYARD_MODEL=f"scripted:{script}",
        PYTHONPATH=str(REPO),
    )
    return env


def railyard(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "railyard"
    return subprocess.run([str(exe), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_worker_metrics_port_serves_what_the_worker_did(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    started = railyard("start", "counter", "--as", "ann", "--json", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    port = free_port()
    exe = Path(sys.executable).parent / "railyard"
    worker = subprocess.Popen(
        [str(exe), "worker", "--processes", "1", "--metrics-port", str(port), "--workflows", "counter"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        while time.monotonic() < deadline:
            try:
                samples = scrape(f"http://127.0.0.1:{port}")
            except httpx.TransportError:
                samples = {}
            # The gauge is read from the database at the scrape; the counter moves just after the append's commit,
            # so one scrape may fall between the two.
            finished = value(samples, "railyard_transitions_total", workflow="counter", trigger="finish", code="none")
            if value(samples, "railyard_tasks", workflow="counter", status="terminal") == 1 and finished == 1:
                break
            time.sleep(0.2)
        assert value(samples, "railyard_tasks", workflow="counter", status="terminal") == 1, samples.keys()
        assert value(samples, "railyard_transitions_total", workflow="counter", trigger="finish", code="none") == 1
        assert value(samples, "railyard_model_call_seconds_count", provider="scripted", code="none") == 1
        assert value(samples, "railyard_claim_latency_seconds_count") == 1
        assert value(samples, "railyard_queue_depth", workflow="counter") == 0
        assert value(samples, "process_resident_memory_bytes") > 0
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert f"metrics on http://127.0.0.1:{port}/metrics" in err


def test_worker_metrics_port_refused_leaves_the_task_alone(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    started = railyard("start", "counter", "--as", "ann", "--json", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    task_id = json.loads(started.stdout)["task_id"]
    bad = railyard("worker", "--once", "--metrics-port", "0", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    with socket_taken() as port:
        taken = railyard("worker", "--once", "--metrics-port", str(port), env=env, cwd=tmp_path)
    assert taken.returncode == 2, taken.stderr
    assert str(Code.CONFIG_INVALID) in taken.stderr + taken.stdout and "Traceback" not in taken.stderr
    shown = railyard("show", task_id, "--json", env=env, cwd=tmp_path)
    assert json.loads(shown.stdout)["seq"] == 1  # never claimed, never advanced


@contextmanager
def socket_taken() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


# -- nothing paid when nothing is on -----------------------------------------------------------------------------
def test_a_worker_with_nothing_turned_on_imports_neither_library(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    assert railyard("start", "counter", "--as", "ann", env=env, cwd=tmp_path).returncode == 0
    program = textwrap.dedent(
        """
        import sys
        from engine.cli import main
        from engine.observability import hooks
        sys.argv = ["railyard", "worker", "--once"]
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
        loaded = sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry", "prometheus_client"})
        print("LOADED", loaded, "ACTIVE", hooks.active)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED [] ACTIVE False" in done.stdout
    shown = json.loads(railyard("status", "--json", env=env, cwd=tmp_path).stdout)
    assert [(w["workflow"], w["terminal"]) for w in shown["workflows"]] == [("counter", 1)]  # it did run the task


def test_the_standard_otel_variables_turn_spans_on_without_code_changes(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    started = railyard("start", "counter", "--as", "ann", "--json", env=env, cwd=tmp_path)
    task_id = json.loads(started.stdout)["task_id"]
    env.update(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="railyard-test")
    ran = railyard("run", task_id, env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert '"name": "railyard.step"' in ran.stdout and '"name": "chat scripted"' in ran.stdout
    assert '"service.name": "railyard-test"' in ran.stdout
    assert f'"railyard.task.id": "{task_id}"' in ran.stdout


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, True),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_which_otel_variables_ask_for_traces(env: dict[str, str], wanted: bool) -> None:
    assert hooks.traces_requested(env) is wanted


def test_an_otel_exporter_nobody_provides_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    env["OTEL_TRACES_EXPORTER"] = "zipkin_json"  # no installed package provides it
    done = railyard("status", env=env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{Code.CONFIG_INVALID}:" in done.stderr and "zipkin_json" in done.stderr


# -- a telemetry endpoint that does not answer -------------------------------------------------------------------
@contextmanager
def dead_endpoint(kind: str) -> Iterator[str]:
    """An OTLP endpoint that refuses connections (nothing listens), or accepts them and never answers."""
    if kind == "refused":
        yield f"http://127.0.0.1:{free_port()}"
        return
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections complete in the backlog; nothing ever reads or answers them
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"


def export_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "export" in line.lower() or "Transient" in line]


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_endpoint_that_does_not_answer_never_holds_a_short_command_and_says_so_once(
    kind: str, tmp_path: Path
) -> None:
    """With a 20 s export timeout, `start` used to take 8 to 20 s and print a line per retry."""
    env = cli_env(tmp_path)
    with dead_endpoint(kind) as endpoint:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="20")
        began = time.monotonic()
        done = railyard("start", "counter", "--as", "ann", env=env, cwd=tmp_path)
        took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert took < 8, f"{took:.1f} s"
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 1 and export_lines(done.stderr) == lines, done.stderr
    assert all(line.startswith("traces are not exported: ") for line in lines), done.stderr


def test_an_endpoint_that_does_not_answer_holds_a_worker_at_most_its_export_timeout_with_one_line(
    tmp_path: Path,
) -> None:
    env = cli_env(tmp_path)
    assert railyard("start", "counter", "--as", "ann", env=env, cwd=tmp_path).returncode == 0
    for kind in ("refused", "silent"):
        with dead_endpoint(kind) as endpoint:
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="3")
            began = time.monotonic()
            done = railyard("worker", "--once", "--workflows", "counter", env=env, cwd=tmp_path)
            took = time.monotonic() - began
        assert done.returncode == 0, done.stderr
        assert took < 3 + 8, f"{kind}: {took:.1f} s"  # start-up and the run, then at most the export timeout
        assert len(export_lines(done.stderr)) <= 1 and "Traceback" not in done.stderr, done.stderr


def test_traces_and_metrics_name_a_scripted_model_alike_and_count_the_usage_its_turns_carry(
    spans: InMemorySpanExporter,
) -> None:
    """A scripted model playing the anthropic profile is `scripted` in both (traces said `anthropic`, metrics
    `scripted`); the usage a turn carries is counted; a scripted answer has no response model or id."""
    from engine.store import MemoryStore
    from tests.support.sample_workflows import all_workflows

    metrics = hooks.enable_metrics()
    turns = [{**call("give_up"), "usage": {"input_tokens": 5, "output_tokens": 3}}]
    with Engine(store=MemoryStore(), registry=Registry(all_workflows())) as engine:
        task_id = engine.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
        engine.run(task_id, model=ScriptedModel({"profile": "anthropic", "turns": turns}))
        assert engine.get(task_id).state == "rejected"
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    attrs = chat.attributes or {}
    assert attrs["gen_ai.provider.name"] == attrs["gen_ai.system"] == "scripted"
    assert attrs["railyard.profile"] == "anthropic"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (5, 3)
    assert "gen_ai.response.model" not in attrs and "gen_ai.response.id" not in attrs
    from prometheus_client import generate_latest

    exposed = generate_latest(metrics.registry_for(None)).decode()
    samples = [sample for family in text_string_to_metric_families(exposed) for sample in family.samples]
    tokens = {x.labels["type"]: x.value for x in samples if x.name == "railyard_model_tokens_total"}
    assert tokens == {"input": 5.0, "output": 3.0}
    assert {x.labels["provider"] for x in samples if x.name.startswith("railyard_model_")} == {"scripted"}


def test_an_exporter_that_failed_and_answers_again_is_waited_for_at_exit_again() -> None:
    """`close` stops waiting for an exporter whose last export failed, and waits again once one succeeded."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from engine.observability import traces

    answers = [SpanExportResult.FAILURE, SpanExportResult.SUCCESS]

    class Inner:
        def export(self, spans: Any) -> SpanExportResult:
            return answers.pop(0)

    watched = traces._Watched(Inner())
    try:
        assert watched.export([]) is SpanExportResult.FAILURE and traces._export_failed.is_set()
        assert watched.export([]) is SpanExportResult.SUCCESS and not traces._export_failed.is_set()
    finally:
        traces._export_failed.clear()
