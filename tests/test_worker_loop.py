"""The worker's event loop and the synchronous API over it, as a user meets them (issue #18's review).

Each test is a defect an attacker review found in the first asyncio worker, and failed on it: a synchronous
adapter that runs a loop of its own, a provider that hangs up or labels JSON as text, one SDK client for many
`Engine.run` calls, a store that fails while a step fails, Ctrl-C in a program that runs `Worker.run` itself.
SQLite in tmp_path, a raw socket server for the provider (`tests/support/raw_server.py`)."""

from __future__ import annotations

import asyncio
import inspect
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import ANYONE, Action, Agent, Engine, ModelResponse, Registry, Terminal, Worker, Workflow, migrations
from engine.core.errors import Code, StoreError
from engine.core.model_errors import ModelError
from engine.core.model_interface import Message, ModelRequest, ToolCall
from engine.providers.openai_adapter import OpenAIAdapter
from tests.support.raw_server import Raw, completion, http

ONE_TURN = Workflow(
    name="one_turn",
    version=1,
    description="One model turn",
    states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)
REQ = ModelRequest(model="m", messages=(Message("system", "s"), Message("user", "u")))


def call(adapter: Any, request: ModelRequest = REQ) -> Any:
    c = adapter.complete
    if inspect.iscoroutinefunction(c):
        from engine.runtime.offload import run_sync  # closes the loop's SDK clients, as Engine.run does

        return run_sync(c(request))
    return c(request)


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    migrations.upgrade(url)
    with Engine(url, Registry([ONE_TURN])) as e:
        yield e


class FinishNow:
    provider, model, profile = "scripted", "m", "anthropic"

    async def _answer(self) -> ModelResponse:
        await asyncio.sleep(0)
        return ModelResponse(tool_calls=(ToolCall("c1", "finish", "{}"),), finish_reason="tool_calls")


class SyncWrappingAsync(FinishNow):
    """A plain `def complete` (the documented-supported kind) that drives an async client with asyncio.run."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        return asyncio.run(self._answer())


def test_engine_run_with_a_sync_adapter_that_uses_asyncio_run(eng: Engine) -> None:
    task = eng.start("one_turn", {}, actor="a")
    assert eng.run(task, model=SyncWrappingAsync()).state == "done"


def test_openai_connection_dropped_before_the_answer_is_provider_error_not_timeout() -> None:
    srv = Raw(lambda c, body: c.close())
    adapter = OpenAIAdapter("m", base_url=srv.url, api_key="k", timeout=5)
    with pytest.raises(ModelError) as caught:
        call(adapter)
    assert caught.value.code == Code.PROVIDER_ERROR  # nothing timed out: the provider hung up


@pytest.mark.parametrize("ctype", ["text/plain; charset=utf-8", None])
def test_openai_completion_without_a_json_content_type_is_still_read(ctype: str | None) -> None:
    def answer(c: socket.socket, body: bytes) -> None:
        b = completion()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(b)}\r\n" + (f"Content-Type: {ctype}\r\n" if ctype else "")
        c.sendall(head.encode() + b"\r\n" + b)

    srv = Raw(answer)
    adapter = OpenAIAdapter("m", base_url=srv.url, api_key="k", timeout=5)
    assert call(adapter).tool_calls[0].name == "finish"


def test_sequential_engine_runs_reuse_one_sdk_client(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = Raw(lambda c, body: c.sendall(http(200, completion())))
    adapter = OpenAIAdapter("gpt-4o", base_url=srv.url, api_key="k", timeout=5)
    made = []
    if hasattr(adapter, "_new_client"):
        original = adapter._new_client

        def counted() -> Any:
            made.append(1)
            return original()

        adapter._clients._make = counted
    for _ in range(5):
        eng.run(eng.start("one_turn", {}, actor="a"), model=adapter)
    assert len(made) <= 1, f"{len(made)} SDK clients (each a new TLS context and new connections) for 5 runs"


class Boom(FinishNow):
    def complete(self, request: ModelRequest) -> ModelResponse:
        time.sleep(1.0)
        raise ValueError("a bug in a custom adapter")


def test_a_failed_postpone_does_not_stop_the_worker(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes away while a step fails, so postpone raises too. The worker logs it and goes on, and stops
    cleanly when told to (the parent commit did); now the StoreError escapes `_work`: 'Task exception was never
    retrieved' with a traceback in the log, or, for a task still in hand at the stop, out of `Worker.run` (the CLI
    exits 2 and the other tasks in hand are cancelled mid-step)."""
    import threading

    eng.start("one_turn", {}, actor="a")

    def postpone(*_a: object, **_k: object) -> int:
        raise StoreError("the database did not answer", code=Code.DATABASE_UNREACHABLE)

    monkeypatch.setattr(eng.store, "postpone", postpone)
    worker = Worker(eng, model=Boom(), concurrency=2, listen=False, poll_seconds=0.05)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    worker.run(stop)  # must not raise


#: What both subprocess programs below start with: the project on the path, the one-turn workflow.
PRELUDE = textwrap.dedent("""
    import asyncio, sys, time
    sys.path[:0] = [sys.argv[2]]
    from engine import ANYONE, Action, Agent, Engine, ModelResponse, Registry, Terminal, Worker, Workflow
    from engine.core.model_interface import ToolCall
    ONE_TURN = Workflow(name="one_turn", version=1, description="One model turn",
        states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")], operator_role=ANYONE)
""")

EMBEDDED = PRELUDE + textwrap.dedent("""
    class Slow:
        provider, model, profile = "scripted", "m", "anthropic"
        async def complete(self, request):
            await asyncio.sleep(2)
            return ModelResponse(tool_calls=(ToolCall("c1", "finish", "{}"),), finish_reason="tool_calls")
    eng = Engine(sys.argv[1], Registry([ONE_TURN]))
    print("ready", flush=True)
    Worker(eng, name="w1", model=Slow(), concurrency=4, poll_seconds=0.05, listen=False, lease_seconds=60).run()
""")


def _url(eng: Engine) -> str:
    return str(getattr(eng.store, "url"))  # noqa: B009 - SqlStore's, not the protocol's


def _leased(eng: Engine) -> int:
    import sqlite3

    path = _url(eng).removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM tasks WHERE lease_owner IS NOT NULL").fetchone()[0])


def test_ctrl_c_in_an_embedded_worker_finishes_the_calls_in_flight_and_releases(eng: Engine, tmp_path: Path) -> None:
    """Worker.run() in a user's program, Ctrl-C while model calls are in flight. The parent commit let each step
    finish, recorded it and released the task; now the loop is cancelled: calls thrown away, leases left held."""
    for _ in range(4):
        eng.start("one_turn", {}, actor="a")
    root = str(Path(__file__).parent.parent)
    p = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED, _url(eng), root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _leased(eng) < 4:
        time.sleep(0.1)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert "cannot schedule new futures after shutdown" not in err
    assert "unhandled exception during asyncio.run() shutdown" not in err
    assert _leased(eng) == 0, f"{_leased(eng)} tasks left leased to a worker that is gone"


ENGINE_RUN = PRELUDE + textwrap.dedent("""
    class Slow:
        provider, model, profile = "scripted", "m", "anthropic"
        cleaned = False
        async def complete(self, request):
            try:
                print("calling", flush=True)
                await asyncio.sleep(30)
            finally:
                Slow.cleaned = True
            return ModelResponse(tool_calls=(ToolCall("c1", "finish", "{}"),), finish_reason="tool_calls")
    class Quick(Slow):
        async def complete(self, request):
            return ModelResponse(tool_calls=(ToolCall("c1", "finish", "{}"),), finish_reason="tool_calls")
    eng = Engine(sys.argv[1], Registry([ONE_TURN]))
    task = eng.start("one_turn", {}, actor="a")
    try:
        eng.run(task, model=Slow())
    except KeyboardInterrupt:
        print("interrupted", Slow.cleaned, eng.load(task).state, flush=True)
    print("again", eng.run(task, model=Quick()).state, flush=True)
""")


def test_ctrl_c_during_engine_run_raises_after_the_step_unwinds_and_the_thread_runs_again(tmp_path: Path) -> None:
    """A plain program calling `Engine.run`, Ctrl-C while the model is called: KeyboardInterrupt reaches the
    program as from any synchronous call, after the step's own cleanups ran (the model call's `finally`); nothing
    was recorded for the interrupted turn, and the next `Engine.run` on the same thread (its loop) works."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    migrations.upgrade(url)
    root = str(Path(__file__).parent.parent)
    p = subprocess.Popen(
        [sys.executable, "-c", ENGINE_RUN, url, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "calling"
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.split("\n")[:2] == ["interrupted True answering", "again done"], out + err
