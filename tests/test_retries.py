"""Durable retries (issue #30): a provider that fails for a while never parks a task.

A rate limit, a 5xx, a dropped connection or a timeout is retried in the process for a few seconds, then becomes
a `backoff` event: the task stays in its state, its row is put off until `retry.due_at`, and any worker makes the
next call then. The agent state's `retry_budget` bounds it; only when it is spent does the task go to the state's
`on_provider_error`. Errors that calling again cannot fix go there at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from engine import (
    ANYONE,
    Action,
    Agent,
    Engine,
    MemoryStore,
    Registry,
    RetryBudget,
    ScriptedModel,
    StaticRoles,
    Terminal,
    Wait,
    Workflow,
)
from engine.core.canonical import now, parse_instant
from engine.core.errors import DefinitionError
from engine.core.retries import durable_delay, next_retry, waiting
from engine.providers.scripted import call
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.payloads import undeclared
from tests.support.postgres import truncate
from tests.support.provider_server import ProviderServer, Reply, no_sleep, openai_completion
from tests.support.sample_workflows import ROLES, all_workflows

TICKET = {"ticket_id": "T-1"}
#: One call per turn in the process, no sleeping: each failure is one durable backoff.
ONE_CALL = RetryPolicy(attempts=1, base_delay=0.0, sleep=no_sleep)
DECIDE = call("decide", ticket_id="T-1", decision="RESOLVE", reason="fixed")
SERVER_ERROR: dict[str, Any] = {"error": {"status": 500, "type": "server_error", "message": "upstream overloaded"}}


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _flaky_workflow(budget: RetryBudget, on_provider_error: str | None = "escalated") -> Workflow:
    return Workflow(
        name="flaky",
        version=1,
        input=NoArgs,
        states=[
            Agent(
                "deciding",
                actions=[Action("finish", "done", description="Finish.")],
                retry_budget=budget,
                on_provider_error=on_provider_error,
            ),
            Wait("escalated", actions=[Action("resume", "deciding", role=ANYONE)]),
            Terminal("done"),
        ],
        operator_role=ANYONE,
    )


@pytest.fixture
def eng() -> Iterator[Engine]:
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def _triggers(eng: Engine, task_id: str) -> list[tuple[str, str | None]]:
    return [(e.trigger, e.data.get("turn", {}).get("code")) for e in eng.history(task_id)[1:]]


# -- the pure rules ------------------------------------------------------------------------------------------------


@pytest.mark.core
def test_durable_waits_grow_with_jitter_and_never_come_sooner_than_the_provider_said() -> None:
    low = [durable_delay(n, None, draw=lambda: 0.0) for n in range(1, 12)]
    high = [durable_delay(n, None, draw=lambda: 1.0) for n in range(1, 12)]
    assert low[:4] == [1.0, 2.0, 4.0, 8.0] and high[:4] == [2.0, 4.0, 8.0, 16.0]
    assert max(high) == 300.0  # capped
    assert durable_delay(1, 42.5, draw=lambda: 1.0) == 42.5  # the provider's Retry-After wins when longer


@pytest.mark.core
def test_the_budget_counts_backoffs_and_the_time_since_the_first() -> None:
    at = now()
    budget = RetryBudget(count=2, within=timedelta(seconds=60))
    first = next_retry(budget, {}, at, 5.0)
    assert first is not None and first["n"] == 1 and parse_instant(first["due_at"]) == at + timedelta(seconds=5)
    visit = {"retries": 1, "retrying_since": first["since"]}
    second = next_retry(budget, visit, at + timedelta(seconds=5), 10.0)
    assert second is not None and (second["n"], second["since"]) == (2, first["since"])
    assert next_retry(budget, {**visit, "retries": 2}, at + timedelta(seconds=15), 1.0) is None  # count spent
    assert next_retry(budget, visit, at + timedelta(seconds=50), 11.0) is None  # due past `within`
    assert next_retry(RetryBudget(count=0), {}, at, 1.0) is None


@pytest.mark.core
def test_a_retry_budget_that_makes_no_sense_is_refused_with_the_definition() -> None:
    with pytest.raises(DefinitionError) as refused:
        _flaky_workflow(RetryBudget(count=-1, within=timedelta(seconds=-5)))
    assert "retry_budget.count" in str(refused.value) and "retry_budget.within" in str(refused.value)


@pytest.mark.core
def test_the_digest_of_a_state_without_its_own_budget_is_unchanged() -> None:
    # Older definitions keep their digests: the new fields are in the spec only when set.
    plain = Agent("deciding", actions=[Action("finish", "done")]).spec()
    assert "retry_budget" not in plain and "on_provider_error" not in plain
    tuned = _flaky_workflow(RetryBudget(count=3)).states[0].spec()
    assert tuned["retry_budget"] == {"count": 3, "within_seconds": 3600.0}


# -- in the engine --------------------------------------------------------------------------------------------------


def test_a_server_error_is_a_backoff_in_the_log_not_a_parked_task(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    before = now()
    model = ScriptedModel([SERVER_ERROR, SERVER_ERROR, SERVER_ERROR, DECIDE])
    task = AgentRunner(eng, model, retry=RetryPolicy(attempts=3, base_delay=0.0, sleep=no_sleep)).run(eng.load(task_id))
    # Three calls in the process, then a durable wait: the task stays in its state, runnable, put off.
    assert (task.state, str(task.status)) == ("deciding", "runnable")
    [backoff] = eng.history(task_id)[1:]
    assert (backoff.trigger, backoff.from_state, backoff.to_state) == ("backoff", "deciding", "deciding")
    turn, retry = backoff.data["turn"], backoff.data["retry"]
    assert (turn["code"], turn["attempts"], turn["provider_message"]) == ("PROVIDER_ERROR", 3, "upstream overloaded")
    assert [r["status"] for r in turn["retried"]] == [500, 500]
    due = parse_instant(retry["due_at"])
    assert before + timedelta(seconds=1) <= due <= now() + timedelta(seconds=2)
    row = eng.store.row(task_id)
    assert row is not None and row.next_run_at == due and row.status == "runnable"
    assert eng.get(task_id).next_try_at == retry["due_at"]
    assert undeclared(eng.history(task_id)) == []
    # Nobody made the next call early: the run stopped at the backoff. When it is due, the call is made.
    assert len(model.requests) == 3
    assert waiting(task.visit, due) == 0
    task = AgentRunner(eng, model, retry=ONE_CALL).step(task)
    assert task.state == "decided" and len(model.requests) == 4
    assert eng.get(task_id).next_try_at is None


def test_the_history_says_what_failed_and_when_the_next_call_is_due(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, ScriptedModel([SERVER_ERROR]), retry=ONE_CALL).step(eng.load(task_id))
    from engine.core.summary import details, summarise

    backoff = eng.history(task_id)[-1]
    retry = backoff.data["retry"]
    rung = backoff.data["turn"]["strategy"]
    assert summarise(backoff) == f"model turn ({rung}): PROVIDER_ERROR; next try at {retry['due_at']} (retry 1)"
    told = details(backoff)
    assert "the provider said: upstream overloaded" in told
    assert any(f"put off until {retry['due_at']}" in line and "retry 1 of 10" in line for line in told)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        ({"status": 401, "type": "authentication_error", "message": "bad key"}, "PROVIDER_AUTH"),
        ({"status": 404, "code": "model_not_found", "message": "no such model"}, "PROVIDER_ERROR"),
        ({"status": 400, "code": "content_filter", "message": "filtered"}, "CONTENT_FILTERED"),
        ({"status": 413, "message": "too long"}, "CONTEXT_OVERFLOW"),
    ],
)
def test_an_error_calling_again_cannot_fix_is_never_retried(eng: Engine, error: dict[str, Any], code: str) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    model = ScriptedModel([{"error": error}, DECIDE])
    task = AgentRunner(eng, model, retry=RetryPolicy(attempts=3, base_delay=0.0, sleep=no_sleep)).run(eng.load(task_id))
    assert task.state == "deciding~provider_error" and len(model.requests) == 1
    assert _triggers(eng, task_id) == [("provider_error", code)]


def test_a_retry_after_longer_than_a_few_seconds_is_a_durable_wait_not_a_sleep(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    model = ScriptedModel([{"error": {"status": 429, "message": "slow down", "retry_after": 30}}, DECIDE])
    before = now()
    AgentRunner(eng, model, retry=RetryPolicy(attempts=3, sleep=sleep)).run(eng.load(task_id))
    assert slept == [] and len(model.requests) == 1  # not slept through, and not called again sooner
    retry = eng.history(task_id)[-1].data["retry"]
    assert parse_instant(retry["due_at"]) >= before + timedelta(seconds=30)


def test_a_short_retry_after_is_waited_in_the_process(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    model = ScriptedModel([{"error": {"status": 429, "message": "slow down", "retry_after": 2}}, DECIDE])
    task = AgentRunner(eng, model, retry=RetryPolicy(attempts=3, base_delay=0.01, sleep=sleep)).run(eng.load(task_id))
    assert task.state == "decided" and slept == [2.0]
    assert _triggers(eng, task_id) == [("decide", None)]


def test_when_the_budget_is_spent_the_task_goes_where_its_workflow_says() -> None:
    flaky = _flaky_workflow(RetryBudget(count=2, within=timedelta(hours=1)))
    with Engine(store=MemoryStore(), registry=Registry([flaky]), authoriser=StaticRoles(ROLES)) as eng:
        task_id = eng.start("flaky", {}, actor="ann")
        model = ScriptedModel([SERVER_ERROR] * 3)
        runner = AgentRunner(eng, model, retry=ONE_CALL)
        task = eng.load(task_id)
        for _ in range(3):  # each step is the next due call
            task = runner.step(task)
        assert task.state == "escalated"
        assert _triggers(eng, task_id) == [
            ("backoff", "PROVIDER_ERROR"),
            ("backoff", "PROVIDER_ERROR"),
            ("provider_error", "PROVIDER_ERROR"),
        ]
        spent = eng.history(task_id)[-1].data["retries_spent"]
        assert spent["n"] == 2 and spent["budget"] == {"count": 2, "within_seconds": 3600.0}
        assert undeclared(eng.history(task_id)) == []
        # A person sends it back: a new visit, a whole budget again.
        eng.fire(task_id, "resume", actor="ann")
        task = AgentRunner(eng, ScriptedModel([SERVER_ERROR]), retry=ONE_CALL).step(eng.load(task_id))
        assert (task.state, eng.history(task_id)[-1].data["retry"]["n"]) == ("deciding", 1)
        assert eng.replay(task_id).ok


def test_an_answer_gives_the_visit_its_whole_budget_back() -> None:
    flaky = _flaky_workflow(RetryBudget(count=1, within=timedelta(hours=1)))
    with Engine(store=MemoryStore(), registry=Registry([flaky]), authoriser=StaticRoles(ROLES)) as eng:
        task_id = eng.start("flaky", {}, actor="ann")
        model = ScriptedModel([SERVER_ERROR, {"text": "no tool"}, SERVER_ERROR, call("finish")])
        runner = AgentRunner(eng, model, retry=ONE_CALL)
        task = eng.load(task_id)
        for _ in range(4):
            task = runner.step(task)
        assert task.state == "done"
        assert [t for t, _ in _triggers(eng, task_id)] == ["backoff", "repair", "backoff", "finish"]


def test_a_backoff_is_a_model_turn_for_the_turn_budget(eng: Engine) -> None:
    # The calls were made: the task's model_turns budget counts them, as it counts a provider_error.
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, ScriptedModel([SERVER_ERROR]), retry=ONE_CALL).step(eng.load(task_id))
    assert eng.load(task_id).usage["turns"] == 1


# -- across workers ---------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
RAILYARD = str(Path(sys.executable).with_name("railyard"))


def _worker_env(url: str, model: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": url,
        "RAILYARD_WORKFLOWS": "tests.support.sample_workflows",
        "RAILYARD_MODEL": model,
        "RAILYARD_ROLES_FILE": "",
    }


def _wait_for(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_a_worker_killed_during_the_wait_loses_nothing_and_another_makes_the_call(pg_database: str) -> None:
    """SIGKILL a worker while a task waits on a backoff: the timer is in the log, so the next worker makes the
    call when it is due, through the real SDK, and the task finishes; the provider saw each call once."""
    server = ProviderServer()
    with server:
        server.reply(Reply(status=503, body={"error": {"message": "upstream overloaded", "type": "server_error"}}))
        server.reply(
            Reply(
                status=429,
                body={"error": {"message": "slow down", "type": "rate_limit_error"}},
                headers={"retry-after": "3"},
            )
        )
        answer = json.dumps({"ticket_id": "T-1", "decision": "RESOLVE", "reason": "fixed"})
        server.reply(openai_completion(tool_calls=(("c1", "decide", answer),)))
        truncate(pg_database)
        with Engine(pg_database, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
            task_id = eng.start("triage", TICKET, actor="ann")
            env = {
                **_worker_env(pg_database, "openai:test-model"),
                "OPENAI_BASE_URL": server.openai_base_url,
                "OPENAI_API_KEY": "sk-test",
                "RAILYARD_MODEL_RETRIES": "0",  # one call per turn: each failure is one backoff
            }
            first = subprocess.Popen(
                [RAILYARD, "worker"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                _wait_for(lambda: [e.trigger for e in eng.history(task_id)][-1:] == ["backoff"])
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=10)
            finally:
                if first.poll() is None:
                    first.kill()
            backoff = eng.history(task_id)[-1]
            due = parse_instant(backoff.data["retry"]["due_at"])
            row = eng.store.row(task_id)
            assert row is not None and row.next_run_at == due and row.lease_owner is None
            assert len(server.requests) == 1  # the wait was not spent calling
            second = subprocess.Popen(
                [RAILYARD, "worker"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                _wait_for(lambda: eng.get(task_id).state == "decided", timeout=60)
            finally:
                second.send_signal(signal.SIGTERM)
                second.wait(timeout=30)
            calls = [e for e in eng.history(task_id)[1:]]
            assert [(e.trigger, e.data["turn"].get("code")) for e in calls] == [
                ("backoff", "PROVIDER_ERROR"),
                ("backoff", "RATE_LIMITED"),
                ("decide", None),
            ]
            # No call before it was due: the second one came after the first backoff's due time.
            assert calls[1].at >= due
            assert len(server.requests) == 3
            assert eng.replay(task_id).ok


def test_a_state_named_as_on_provider_error_is_a_hand_off_in_the_work_queue() -> None:
    from engine.api.schemas import WorkKind
    from engine.api.views import work_kind

    flaky = _flaky_workflow(RetryBudget(count=1))
    assert work_kind(flaky, "escalated") is WorkKind.HANDOFF
