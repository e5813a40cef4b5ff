"""Flow control end to end: the breaker opens and closes across processes, quotas hold across processes on
PostgreSQL (the fake provider counts what it receives), reservations are settled with the usage the provider
reports, and a task waiting for quota is put off without an event, holding no lease, in priority order."""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, Registry, StaticRoles
from engine.cli import app
from engine.core.canonical import now
from engine.core.flow import Amounts, BreakerSettings, FlowSettings, Limits, quota_key
from engine.core.model_errors import ModelError
from engine.core.model_interface import Message, ModelRequest, ModelResponse, ToolCall, Usage
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from engine.runtime.flow import Flow, FlowWait
from engine.runtime.leases import Lease, holding
from engine.runtime.offload import INLINE, run_sync
from engine.runtime.worker import Worker
from engine.store import SqlStore
from engine.store.protocol import FlowStore
from tests.support.postgres import truncate
from tests.support.provider_server import (
    ProviderServer,
    Reply,
    anthropic_message,
    openai_completion,
    openai_error,
    text_block,
)
from tests.support.sample_workflows import ROLES, all_workflows

MODEL = "gpt-flow-test"
REQUEST = ModelRequest(MODEL, (Message("user", "hello"),), max_output_tokens=100)


def finish(_body: Any) -> Reply:
    """A model that ends the counter workflow's task at once, reporting (1234, 56) tokens of usage."""
    return openai_completion(tool_calls=(("c1", "finish", "{}"),), usage=(1234, 56))


def overloaded(_body: Any) -> Reply:
    return openai_error(503, "upstream overloaded", type="server_error")


class Finishing:
    """An in-process adapter of an SDK provider's name (the scripted one is never paced), answering `finish`."""

    provider = "openai"
    model = MODEL

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        return ModelResponse(tool_calls=(ToolCall("c1", "finish", "{}"),), usage=Usage(10, 5))


# -- the breaker across two processes ----------------------------------------------------------------------------
def _caller(url: str, base_url: str, commands: Any, results: Any) -> None:
    """A process making one model call per command, as a worker's task does (under a lease), through flow
    control on the shared database; it reports what became of each."""
    settings = FlowSettings(breaker=BreakerSettings(failures=3, cool_down_seconds=1.5))
    store = SqlStore(url)
    flow = Flow(store, settings)
    adapter = OpenAIAdapter(MODEL, base_url=base_url, api_key="test", timeout=5)

    async def one() -> str:
        with holding(Lease("t-1", "w", 1)):
            try:
                await flow.call(adapter, REQUEST, lambda: adapter.complete(REQUEST), INLINE)
            except ModelError as error:
                return str(error.code)
            except FlowWait as waiting:
                return f"wait:{waiting.reason}"
        return "answered"

    for _ in iter(commands.get, None):
        results.put(run_sync(one()))
    store.close()


def test_the_breaker_opens_and_closes_for_every_worker_across_two_processes(pg_database: str) -> None:
    truncate(pg_database)
    ctx = multiprocessing.get_context("spawn")
    with ProviderServer() as server:
        server.respond_with(overloaded)
        pipes = [(ctx.Queue(), ctx.Queue()) for _ in range(2)]
        procs = [
            ctx.Process(target=_caller, args=(pg_database, server.openai_base_url, commands, results))
            for commands, results in pipes
        ]
        for p in procs:
            p.start()

        def call(worker: int) -> str:
            commands, results = pipes[worker]
            commands.put("call")
            outcome: str = results.get(timeout=60)
            return outcome

        try:
            assert [call(0) for _ in range(3)] == ["PROVIDER_ERROR"] * 3  # three in a row: the breaker opens
            assert call(1) == "wait:breaker"  # the other process holds its call too
            assert call(0) == "wait:breaker"
            assert len(server.requests) == 3  # nothing reached the provider while it was open
            time.sleep(1.6)  # the cool-down ends; the provider is back
            server.respond_with(finish)
            assert call(1) == "answered"  # the one probe, let through, closes it
            assert call(0) == "answered"
            assert len(server.requests) == 5
            store = SqlStore(pg_database)
            row = store.breaker(f"openai:{MODEL}")
            store.close()
            assert row is not None and (row.state, row.failures) == ("closed", 0)
        finally:
            for commands, _ in pipes:
                commands.put(None)
            for p in procs:
                p.join(timeout=30)


# -- quotas across three processes -------------------------------------------------------------------------------
def _worker(url: str, base_url: str, name: str, stop: Any) -> None:
    with Engine(url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        adapter = OpenAIAdapter(MODEL, base_url=base_url, api_key="test", timeout=10)
        Worker(eng, name=name, model=adapter, concurrency=4, poll_seconds=0.05, workflows=["counter"]).run(stop)


RPM, BURST = 240.0, 0.5  # 4 requests a second, 2 at once
#: Seconds a worker may take between the bucket admitting a call and the provider receiving it, on a busy machine.
SENDING = 0.25


def test_a_quota_holds_across_three_worker_processes_and_every_task_finishes(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    truncate(pg_database)
    quotas = {f"openai:{MODEL}": {"requests_per_minute": RPM, "burst_seconds": BURST}}
    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps(quotas))  # the processes started below read it
    ctx = multiprocessing.get_context("spawn")
    arrivals: list[float] = []

    def counted(body: Any) -> Reply:
        arrivals.append(time.monotonic())
        return finish(body)

    with (
        ProviderServer() as server,
        Engine(pg_database, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng,
    ):
        server.respond_with(counted)
        ids = [eng.start("counter", {}, actor="ann") for _ in range(20)]
        stop = ctx.Event()
        procs = [
            ctx.Process(target=_worker, args=(pg_database, server.openai_base_url, f"w{i}", stop)) for i in range(3)
        ]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not all(eng.load(t).terminal for t in ids):
                time.sleep(0.2)
        finally:
            stop.set()
            for p in procs:
                p.join(timeout=30)
        assert all(eng.load(t).terminal for t in ids), "every task finishes"
        assert all(eng.load(t).seq == 2 for t in ids), "a task put off for quota has no event for it"
    assert len(arrivals) == 20
    # What a bucket of BURST seconds refilled at RPM lets through in any stretch of time, widened by the calls
    # admitted up to SENDING seconds before the stretch that arrived inside it: the bucket admits a call, and a
    # process on a busy machine sends it a moment later (CI saw 6 arrivals in 0.73 s against 5.9 without this).
    rate = RPM / 60
    for i in range(len(arrivals)):
        for j in range(i + 1, len(arrivals)):
            seen = j - i + 1
            assert seen <= rate * BURST + rate * (arrivals[j] - arrivals[i] + SENDING) + 1, (i, j, arrivals)
    # ... and the quota was used, not left idle: 20 calls at 4 a second take about 5 s (4-9 s here with both CPUs
    # busy with other work). A quota left idle for its window (60 s), or a task put off by a retry's backoff each
    # time, would take far longer. The bound leaves room for a CI machine running the whole suite beside the three
    # workers on 2 CPUs, where 16.5 s and 19.9 s were seen on 2026-12-06 (it was 15 s).
    assert arrivals[-1] - arrivals[0] < 30


# -- reservations settled with the reported usage ----------------------------------------------------------------
def test_a_calls_reservation_is_settled_with_the_usage_the_provider_reported(tmp_path: Path, db_url: str) -> None:
    limits = Limits(input_tokens_per_minute=6, output_tokens_per_minute=6, burst_seconds=600_000)  # 60,000 deep
    store = SqlStore(db_url)
    try:
        assert isinstance(store, FlowStore)
        flow = Flow(store, FlowSettings(quotas={f"openai:{MODEL}": limits}))
        with ProviderServer() as server:
            server.respond_with(finish)
            adapter = OpenAIAdapter(MODEL, base_url=server.openai_base_url, api_key="test", timeout=5)
            response = run_sync(flow.call(adapter, REQUEST, lambda: adapter.complete(REQUEST), INLINE))
        assert response.usage.input_tokens == 1234
        _, buckets, _ = store.flow_rows()
        (bucket,) = buckets
        # Reserved: an estimate of the prompt and the request's 100 output tokens; settled: 1,234 and 56.
        assert bucket.input_tokens == pytest.approx(60_000 - 1234, abs=2)
        assert bucket.output_tokens == pytest.approx(60_000 - 56, abs=2)
        assert bucket.in_flight == 0
    finally:
        store.close()


def test_the_breakers_probe_is_made_at_once_not_sent_to_the_back_of_the_line_for_quota(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an outage every caller waits for the probe's answer. A probe that queued for quota behind tasks
    whose turns were due gave the probe up, and the next looker's probe queued too: bench/quota.py's outage run
    (600 tasks) ended with the breaker half open and nothing answered. A probe the bucket can pay is made."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    limits = Limits(requests_per_minute=60, burst_seconds=2)  # room for 2 calls: fewer than the 5 due in line
    settings = FlowSettings(
        breaker=BreakerSettings(failures=1, cool_down_seconds=0.2), quotas={f"openai:{MODEL}": limits}
    )
    store = SqlStore(db_url)
    try:
        assert isinstance(store, FlowStore)
        flow = Flow(store, settings)
        adapter = Finishing()
        store.breaker_failed(f"openai:{MODEL}", settings.breaker)  # the outage opened it
        line = quota_key("openai", MODEL, limits, None)
        assert store.quota_take(line, limits, Amounts(), 60.0)[0]  # one of the 2 calls' room is spent
        for n in range(5):  # tasks ahead in the line for quota, due back now
            store.wait_join(line, f"ahead-{n}", 0.5, {}, lookahead=5.0, grace=5.0)
        flow._queued[line] = True  # this process has seen the line (a worker's earlier look)
        time.sleep(0.3)  # the cool-down is over: the next caller is the probe

        async def look() -> str:
            with holding(Lease("prober", "w", 1)):
                try:
                    await flow.call(adapter, REQUEST, lambda: adapter.complete(REQUEST), INLINE)
                except FlowWait as waiting:
                    return f"wait:{waiting.reason}"
            return "answered"

        assert run_sync(look()) == "answered" and adapter.calls == 1
        (breaker,) = store.flow_rows()[0]
        assert breaker.state == "closed"
    finally:
        store.close()


def test_a_429s_retry_after_pauses_the_quota_for_every_caller(tmp_path: Path, db_url: str) -> None:
    limits = Limits(requests_per_minute=6000)
    store = SqlStore(db_url)
    try:
        flow = Flow(store, FlowSettings(quotas={f"openai:{MODEL}": limits}))
        with ProviderServer() as server:
            server.reply(
                Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}}, headers={"retry-after": "30"})
            )
            adapter = OpenAIAdapter(MODEL, base_url=server.openai_base_url, api_key="test", timeout=5)

            async def one() -> None:
                with holding(Lease("t-1", "w", 1)):
                    await flow.call(adapter, REQUEST, lambda: adapter.complete(REQUEST), INLINE)

            with pytest.raises(ModelError):
                run_sync(one())
            with pytest.raises(FlowWait) as held:
                run_sync(one())
            assert held.value.reason == "quota"
            assert held.value.until > now() + timedelta(seconds=25)
            assert len(server.requests) == 1
    finally:
        store.close()


# -- a worker's task waiting for quota ---------------------------------------------------------------------------
def test_a_task_short_of_quota_is_put_off_without_an_event_holding_no_lease_and_shows_its_place(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = {f"openai:{MODEL}": {"requests_per_minute": 1, "burst_seconds": 60}}  # one call, then one a minute
    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps(quotas))
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    adapter = Finishing()
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        first = eng.start("counter", {}, actor="ann")
        bulk = [eng.start("counter", {}, actor="ann") for _ in range(2)]
        urgent = eng.start("counter", {}, actor="ann", priority=10)
        worker = Worker(eng, name="w", model=adapter, concurrency=1, listen=False)
        assert worker.run_once() == 1 and eng.load(first).terminal  # the bucket's one call
        for _ in range(3):
            assert worker.run_once() == 1
        assert adapter.calls == 1  # nothing else reached the provider
        for task_id in [*bulk, urgent]:
            row = eng.store.row(task_id)
            assert row is not None and eng.load(task_id).seq == 1  # no event written for a wait
            assert row.lease_owner is None and row.next_run_at is not None and row.next_run_at > now()
            assert row.failures == 0  # waiting is not failing
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    status = json.loads(shown.output)
    waiting = [(w["task_id"], w["position"], w["priority"]) for w in status["waiting"]]
    assert waiting == [(urgent, 0, 10), (bulk[0], 1, 0), (bulk[1], 2, 0)]
    (quota,) = status["quotas"]
    assert (quota["quota"], quota["waiting"], quota["in_flight"]) == (f"openai:{MODEL}", 3, 0)
    table = CliRunner().invoke(app, ["status"])
    assert "waiting for quota" in table.output
    # Each task shows its own place: `show`, the API's task and the task page.
    shown = CliRunner().invoke(app, ["show", bulk[1], "--json"])
    assert shown.exit_code == 0, shown.output
    place = json.loads(shown.output)["waiting_for_quota"]
    assert (place["quota"], place["position"], place["waiting"], place["priority"]) == (f"openai:{MODEL}", 2, 3, 0)
    assert "waiting_for_quota" not in json.loads(CliRunner().invoke(app, ["show", first, "--json"]).output)
    assert "2 ahead of it, 3 waiting" in " ".join(CliRunner().invoke(app, ["show", bulk[1]]).output.split())
    from fastapi.testclient import TestClient

    from tests.support.api import bearer, csrf_of, make_api_engine, make_app

    with make_api_engine(db_url, tmp_path) as api_engine, TestClient(make_app(api_engine)) as client:
        body = client.get(f"/api/tasks/{urgent}", headers=bearer("bob")).json()
        assert body["waiting_for_quota"]["position"] == 0 and body["waiting_for_quota"]["priority"] == 10
        form = client.get("/login").text
        client.post("/login", data={"token": "tok-bob", "csrf": csrf_of(form)})
        page = client.get(f"/tasks/{urgent}").text
        assert 'id="task-quota-wait"' in page and "next, 3 waiting (priority 10)" in page


def test_a_bad_quota_setting_stops_a_worker_before_it_claims_anything(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps({f"openai:{MODEL}": {"request_per_minute": 10}}))
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        eng.start("counter", {}, actor="ann")
        with pytest.raises(Exception) as refused:
            Worker(eng, model=Finishing()).check_configuration()
    assert "CONFIG_INVALID" in str(refused.value.code)  # type: ignore[attr-defined]
    assert "did you mean 'requests_per_minute'?" in str(refused.value)


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_what_the_providers_headers_say_is_left_holds_the_shared_bucket_down(db_url: str, wire: str) -> None:
    limits = Limits(requests_per_minute=600, burst_seconds=6)  # 60 deep, 10 a second
    store = SqlStore(db_url)
    try:
        flow = Flow(store, FlowSettings(quotas={f"{wire}:{MODEL}": limits}))
        with ProviderServer() as server:
            adapter: OpenAIAdapter | AnthropicAdapter
            if wire == "openai":
                answer = replace(finish(None), headers={"x-ratelimit-remaining-requests": "0"})
                adapter = OpenAIAdapter(MODEL, base_url=server.openai_base_url, api_key="test", timeout=5)
            else:
                answer = replace(
                    anthropic_message(text_block("hi")), headers={"anthropic-ratelimit-requests-remaining": "0"}
                )
                adapter = AnthropicAdapter(MODEL, base_url=server.anthropic_base_url, api_key="test", timeout=5)
            server.reply(answer)
            run_sync(flow.call(adapter, REQUEST, lambda: adapter.complete(REQUEST), INLINE))
        taken, row = store.quota_take(f"{wire}:{MODEL}", limits, Amounts(), 30)
        assert not taken, "the provider said none is left: the 59 the bucket still held are not spent"
        assert row.requests < 1
    finally:
        store.close()


def test_a_model_calls_span_carries_how_long_flow_control_held_it(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from engine.observability import hooks

    quotas = {f"openai:{MODEL}": {"requests_per_minute": 12, "burst_seconds": 5}}  # one at once, one every 5 s
    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps(quotas))
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks.enable_tracing(provider)
    try:
        with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
            for _ in range(2):  # the second call waits for the bucket to refill (`Engine.run` sleeps: no lease)
                task_id = eng.start("counter", {}, actor="ann")
                assert eng.run(task_id, model=Finishing()).terminal
    finally:
        hooks.disable()
        provider.shutdown()
    chats = [s for s in exporter.get_finished_spans() if s.name == f"chat {MODEL}"]
    waits = [float((s.attributes or {})["railyard.flow.wait_seconds"]) for s in chats]  # type: ignore[arg-type]
    assert len(waits) == 2 and waits[0] < 2.0 <= waits[1] <= 6.0, waits


def test_a_workflows_declared_priority_orders_the_queue_and_an_operators_setting_overrides_it(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.errors import DefinitionError
    from engine.runtime import queries

    counter = Registry(all_workflows()).get("counter")
    urgent = replace(counter, name="urgent_counter", priority=5)
    with pytest.raises(DefinitionError, match="priority 5000 must be a whole number from -1000 to 1000"):
        replace(counter, priority=5000)
    quotas = {f"openai:{MODEL}": {"requests_per_minute": 1, "burst_seconds": 60}}  # one call, then one a minute
    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps(quotas))
    with Engine(db_url, Registry([*all_workflows(), urgent]), authoriser=StaticRoles(ROLES)) as eng:
        first = eng.start("counter", {}, actor="ann")
        bulk = eng.start("counter", {}, actor="ann")
        hurry = eng.start("urgent_counter", {}, actor="ann")  # started last, served first
        worker = Worker(eng, name="w", model=Finishing(), concurrency=1, listen=False)
        for _ in range(3):
            assert worker.run_once() == 1
        assert eng.load(first).terminal
        places = {t: queries.waiting_for_quota(eng, eng.get(t)).waiting_for_quota for t in (bulk, hurry)}
        assert [(p or {}).get("position") for p in places.values()] == [1, 0]
        assert [(p or {}).get("priority") for p in places.values()] == [0, 5]
    monkeypatch.setenv("RAILYARD_PRIORITIES", json.dumps({"urgent_counter": -1}))
    with Engine(db_url, Registry([*all_workflows(), urgent]), authoriser=StaticRoles(ROLES)) as eng:
        flow = eng.flow_control()
        assert flow is not None and flow.settings.priority_of("urgent_counter") == -1


def test_a_quota_given_to_railyard_worker_wins_over_the_environments(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    monkeypatch.setenv("RAILYARD_QUOTAS", json.dumps({f"openai:{MODEL}": {"requests_per_minute": 6000}}))
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    runner = CliRunner()
    tasks = [runner.invoke(app, ["start", "counter", "--input", "{}", "--as", "ann"]).stdout.strip() for _ in range(3)]
    given = json.dumps({f"openai:{MODEL}": {"requests_per_minute": 1, "burst_seconds": 60}})  # one call a minute
    worker = ["worker", "--once", "--model", f"openai:{MODEL}", "--workflows", "counter"]
    with ProviderServer() as server:
        server.respond_with(finish)
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        done = runner.invoke(app, [*worker, "--quotas", given])
        assert done.exit_code == 0, done.output
        assert len(server.requests) == 1  # the environment's 6,000 a minute would have let all three through
    states = [json.loads(runner.invoke(app, ["show", t, "--json"]).stdout) for t in tasks]
    assert sorted(s["state"] for s in states) == ["counting", "counting", "done"]
    assert sum("waiting_for_quota" in s for s in states) == 2
    misspelt = runner.invoke(app, [*worker, "--quotas", json.dumps({f"openai:{MODEL}": {"request_per_minute": 1}})])
    assert misspelt.exit_code == 2 and misspelt.stderr.startswith("CONFIG_INVALID"), misspelt.output
    assert "did you mean 'requests_per_minute'?" in misspelt.stderr
    not_json = runner.invoke(app, [*worker, "--quotas", "{requests: 1}"])
    assert not_json.exit_code == 2 and "--quotas" in not_json.stderr
