"""bench/fake_model.py, the model `bench/llm_bound.py`'s workers call, driven through the engine's own adapters.

What it answers decides whether the benchmark measures the refund workflow's real path (three accepted turns, no
repairs, a payment once), and what it counts is what the benchmark reports as model turns and calls in flight.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine import (
    ANYONE,
    Action,
    Agent,
    Engine,
    ModelAdapter,
    Registry,
    StaticRoles,
    Terminal,
    Workflow,
    migrations,
    open_model,
)
from tests.support.reference import DAMAGED, ROLES, fake_systems, steps
from workflows import REFUND_V1, fakes

FAKE = Path(__file__).resolve().parent.parent / "bench" / "fake_model.py"
ONE_TURN = Workflow(
    name="one_turn",
    version=1,
    description="One model turn: the only action ends the task.",
    states=[Agent("answering", actions=[Action("finish", "done")]), Terminal("done")],
    operator_role=ANYONE,
    model_override_role=ANYONE,
)


@contextmanager
def serving(latency: str) -> Iterator[int]:
    """The fake running as the benchmark runs it, a process of its own: its port."""
    proc = subprocess.Popen([sys.executable, str(FAKE), "--latency", latency], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving("fixed:0") as found:
        yield found


def stats(port: int, reset: bool = False) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/stats", method="POST" if reset else "GET", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    migrations.upgrade(url)
    with fake_systems(url), Engine(url, Registry([REFUND_V1, ONE_TURN]), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def model(wire: str, port: int, monkeypatch: pytest.MonkeyPatch) -> ModelAdapter:
    """The adapter a `railyard worker --model WIRE:bench-model` opens, pointed at the fake as the benchmark does."""
    if wire == "openai":
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "bench")
    else:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "bench")
    return open_model(f"{wire}:bench-model")


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_fake_takes_a_refund_through_every_model_turn_without_a_repair(
    wire: str, port: int, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # openai's profile answers in the JSON envelope (native schema), anthropic's with a forced tool_use block.
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    assert eng.run(task_id, model=model(wire, port, monkeypatch)).state == "awaiting_approval"
    prepared = eng.load(task_id).prepared
    assert prepared is not None and prepared["arguments"] == {
        "order_id": "O-1001",
        "amount": 12_999,
        "currency": "EUR",
        "reason": "Arrived damaged, as the customer reported.",
        "evidence_ids": ["EV-1"],
    }
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"])
    assert eng.run(task_id).state == "completed"
    assert steps(eng, task_id) == [
        ("ann", "start", "collecting_information"),
        ("model", "query_order", "looking_up_order"),
        ("system", "call", "looking_up_order"),
        ("system", "succeeded", "collecting_information"),
        ("model", "assess_eligibility", "eligible"),
        ("model", "propose_refund", "awaiting_approval"),
        ("dana", "approve", "executing"),
        ("system", "call", "executing"),
        ("system", "succeeded", "completed"),
    ]
    assert fakes.systems().payments.executions() == {prepared["action_id"]: 1}


def test_the_fake_rejects_a_refund_of_an_order_with_nothing_left_to_refund(
    port: int, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    books = fakes.systems()
    books.payments.refund("earlier-refund", order_id="O-1001", amount=12_999, currency="EUR", reason="earlier")
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    assert eng.run(task_id, model=model("anthropic", port, monkeypatch)).state == "rejected"
    assert steps(eng, task_id)[-1] == ("model", "reject", "rejected")
    assert books.payments.executions() == {"earlier-refund": 1}


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_fake_answers_the_one_action_offered(
    wire: str, port: int, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = eng.start("one_turn", {}, actor="ann")
    assert eng.run(task_id, model=model(wire, port, monkeypatch)).state == "done"


def test_the_fake_counts_the_calls_it_holds_and_the_turns_it_answered() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    replies: list[dict[str, Any]] = []
    with serving("fixed:0.5") as port:

        def call() -> None:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                replies.append(json.loads(response.read()))

        calls = [threading.Thread(target=call) for _ in range(3)]
        stats(port, reset=True)  # the window starts with the calls, so the mean is over their half second
        for thread in calls:
            thread.start()
        time.sleep(0.25)
        held = stats(port)
        for thread in calls:
            thread.join()
        after = stats(port)
        fresh = stats(port, reset=True)
    assert [json.loads(r["choices"][0]["message"]["content"]) for r in replies] == [
        {"action": "finish", "arguments": {}}
    ] * 3
    assert (held["inflight"], held["requests"], held["answered"]) == (3, 3, 0)
    assert (after["inflight"], after["most_inflight"], after["answered"], after["answers"]) == (0, 3, 3, {"finish": 3})
    assert 1.0 < after["mean_inflight"] <= 3
    assert (fresh["requests"], fresh["answered"], fresh["most_inflight"]) == (0, 0, 0)
    assert fresh["requests_total"] == 3  # the whole run's count survives a new window
