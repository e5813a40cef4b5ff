"""Agent turns through the real provider adapters against the local wire-format server.

For every shipped profile, thinking on and off, the request on the wire never
carries a tool_choice the provider rejects in that mode; refusals and stream
errors become the transitions the design names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine import Engine, Registry, StaticRoles, migrations
from engine.core.profiles import BUILTIN_PROFILES, load_profiles
from engine.core.summary import details
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.provider_server import (
    ProviderServer,
    anthropic_error,
    anthropic_event,
    anthropic_message,
    anthropic_stream,
    no_sleep,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    text_block,
    tool_use_block,
)
from tests.support.sample_workflows import ROLES, all_workflows

#: A model name each profile is chosen by.
MODEL_OF = {
    "openai": "gpt-4.1",
    "anthropic": "claude-test-model",
    "gemini": "gemini-2.5-pro",
    "deepseek": "deepseek-reasoner",
    "qwen": "qwen3-max",
    "glm": "glm-4.6",
    "minimax": "MiniMax-M2",
    "mistral": "mistral-large-latest",
    "ollama": "llama3.1",
}
NO_SLEEP = RetryPolicy(attempts=2, base_delay=0.0, sleep=no_sleep)


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def eng(tmp_path: Any, server: ProviderServer) -> Iterator[Engine]:
    server.reset()
    url = f"sqlite:///{tmp_path}/wire.db"
    migrations.upgrade(url)
    with Engine(url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def adapter(server: ProviderServer, profile: str, *, stream: bool = False) -> Any:
    model = MODEL_OF[profile]
    if load_profiles()[profile].wire == "anthropic":
        return AnthropicAdapter(model, base_url=server.anthropic_base_url, api_key="test", stream=stream, timeout=5)
    return OpenAIAdapter(model, base_url=server.openai_base_url, api_key="test", stream=stream, timeout=5)


def sent_mode(body: dict[str, Any], wire: str) -> str | None:
    """The tool_choice mode a body carries (None: the field is absent)."""
    choice = body.get("tool_choice")
    if choice is None:
        return None
    if wire == "anthropic":
        return {"auto": "auto", "none": "none", "any": "required", "tool": "named"}[choice["type"]]
    return choice if isinstance(choice, str) else "named"


def test_profiles_cover_every_model_name() -> None:
    from engine.core.profiles import profile_for

    assert {profile_for(load_profiles()[p].wire, m).name for p, m in MODEL_OF.items()} == set(MODEL_OF)


@pytest.mark.parametrize("profile", [p.name for p in BUILTIN_PROFILES])
@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("workflow", ["triage", "refund"])
def test_no_forced_tool_choice_reaches_a_mode_that_rejects_it(
    eng: Engine, server: ProviderServer, profile: str, thinking: bool, workflow: str
) -> None:
    wire = load_profiles()[profile].wire
    server.reply(anthropic_message(text_block("?")) if wire == "anthropic" else openai_completion(text="?"))
    payload = {"ticket_id": "T-1"} if workflow == "triage" else {"customer": "c1", "balance": 5}
    task_id = eng.start(workflow, payload, actor="ann")
    runner = AgentRunner(eng, adapter(server, profile), thinking=thinking, retry=NO_SLEEP)
    runner.step(eng.load(task_id))
    body = server.last_body
    mode = sent_mode(body, wire)
    allowed = load_profiles()[profile].tool_choices(thinking)
    if mode is None:
        assert not body.get("tools") or "auto" not in allowed
    else:
        assert mode in allowed
    if profile == "glm":
        assert mode == "auto"
    if profile == "minimax":
        assert "tool_choice" not in body
    if wire == "anthropic" and thinking:
        assert body["thinking"]["type"] == "enabled"
    # The model is only ever offered the state's own actions.
    offered = {t.get("name") or t["function"]["name"] for t in body.get("tools", [])}
    assert offered <= {"decide", "propose", "give_up", "note"}


def test_tool_choice_unsupported_from_the_server_moves_down_without_a_repair(
    eng: Engine, server: ProviderServer
) -> None:
    server.reply(
        anthropic_error(400, "Thinking may not be enabled when tool_choice forces tool use."),
        anthropic_message(
            tool_use_block("tu_1", "decide", {"ticket_id": "T-1", "decision": "RESOLVE", "reason": "fixed"}),
            stop_reason="tool_use",
        ),
    )
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    task = AgentRunner(eng, adapter(server, "anthropic"), retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == "decided"
    first, second = server.bodies
    assert first["tool_choice"] == {"type": "tool", "name": "decide"}
    assert second["tool_choice"] != first["tool_choice"]
    triggers = [(e.trigger, e.data.get("turn", {}).get("code")) for e in eng.history(task_id)[1:]]
    assert triggers == [("demote", "TOOL_CHOICE_UNSUPPORTED"), ("decide", None)]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_an_error_inside_a_200_stream_is_a_retried_provider_error_not_an_answer_nor_a_repair(
    eng: Engine, server: ProviderServer, wire: str
) -> None:
    if wire == "openai":
        # The wording once made this RATE_LIMITED (retried); its fields say a server error.
        failure = json.dumps({"error": {"message": "upstream overloaded", "type": "server_error", "code": 502}})
        server.reply(*[openai_stream(openai_chunk({"content": "Escalating the"}), failure)] * 2)
        profile = "deepseek"
    else:
        error = anthropic_event("error", error={"type": "api_error", "message": "upstream overloaded"})
        start = anthropic_event(
            "message_start",
            message={
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            },
        )
        server.reply(*[anthropic_stream(start, error)] * 2)
        profile = "anthropic"
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    task = AgentRunner(eng, adapter(server, profile, stream=True), retry=NO_SLEEP).step(eng.load(task_id))
    event = eng.history(task_id)[-1]
    # The server failed (its fields say so): called again in the process, then a durable backoff (issue #30).
    assert (event.trigger, event.data["turn"]["code"], task.state) == ("backoff", "PROVIDER_ERROR", "deciding")
    assert event.data["turn"]["provider_message"] == "upstream overloaded"
    assert task.visit.get("repairs", 0) == 0
    assert len(server.requests) == 2


def test_a_429_is_retried_by_the_engine_not_the_sdk(eng: Engine, server: ProviderServer) -> None:
    server.reply(
        openai_error(429, "Rate limit reached"),
        openai_completion(
            tool_calls=(("c1", "decide", json.dumps({"ticket_id": "T-1", "decision": "RESOLVE", "reason": "ok"})),),
            finish_reason="tool_calls",
        ),
    )
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    task = AgentRunner(eng, adapter(server, "openai"), retry=NO_SLEEP).step(eng.load(task_id))
    assert task.state == "decided" and len(server.requests) == 2
    assert eng.history(task_id)[-1].data["turn"]["attempts"] == 2


DECIDED = json.dumps({"ticket_id": "T-1", "decision": "RESOLVE", "reason": "ok"})


@pytest.mark.parametrize(
    ("wire", "headers", "least"),
    [
        ("openai", {"Retry-After": "2"}, 2.0),
        ("openai", {"retry-after-ms": "1500", "retry-after": "1"}, 1.5),  # the finer one wins
        ("anthropic", {"retry-after": "3"}, 3.0),
    ],
)
def test_a_429_is_retried_no_sooner_than_the_provider_says(
    eng: Engine, server: ProviderServer, wire: str, headers: dict[str, str], least: float
) -> None:
    """A 429's Retry-After (or retry-after-ms) is a floor under the backoff: the next call waits at least that
    long (the backoff's own jitter is at most 1 s on a first retry here)."""
    waited: list[float] = []

    async def record(seconds: float) -> None:
        waited.append(seconds)

    if wire == "openai":
        refusal = dataclasses.replace(openai_error(429, "Rate limit reached", type="rate_limit_error"), headers=headers)
        answer = openai_completion(tool_calls=(("c1", "decide", DECIDED),), finish_reason="tool_calls")
    else:
        refusal = dataclasses.replace(anthropic_error(429, "Rate limited", type="rate_limit_error"), headers=headers)
        answer = anthropic_message(tool_use_block("t1", "decide", json.loads(DECIDED)), stop_reason="tool_use")
    server.reply(refusal, answer)
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    runner = AgentRunner(eng, adapter(server, wire), retry=RetryPolicy(attempts=2, sleep=record))
    task = runner.step(eng.load(task_id))
    assert task.state == "decided" and len(server.requests) == 2
    assert len(waited) == 1 and least <= waited[0] <= max(least, 1.0) + 0.001, waited
    # What the retry was after is on the event, in the provider's words, and the timeline says it.
    turn = eng.history(task_id)[-1].data["turn"]
    said = "Rate limit reached" if wire == "openai" else "Rate limited"
    assert turn["retried"] == [{"code": "RATE_LIMITED", "status": 429, "message": said, "waited": round(waited[0], 3)}]
    shown = details(eng.history(task_id)[-1])
    assert f"retried after RATE_LIMITED (429: {said}), waiting {round(waited[0], 3)} s" in shown, shown


def test_a_retry_after_longer_than_the_policy_waits_ends_the_retries_rather_than_calling_sooner(
    eng: Engine, server: ProviderServer
) -> None:
    refusal = dataclasses.replace(
        openai_error(429, "Rate limit reached", type="rate_limit_error"), headers={"Retry-After": "600"}
    )
    server.reply(refusal, openai_completion(tool_calls=(("c1", "decide", DECIDED),), finish_reason="tool_calls"))
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    task = AgentRunner(eng, adapter(server, "openai"), retry=NO_SLEEP).step(eng.load(task_id))
    assert len(server.requests) == 1  # not called again within the 600 s asked
    turn = eng.history(task_id)[-1].data["turn"]
    assert (turn["code"], turn["attempts"]) == ("RATE_LIMITED", 1), turn
    assert turn["provider_message"] == "Rate limit reached" and "retried" not in turn
    assert "the provider said: Rate limit reached" in details(eng.history(task_id)[-1])
    assert task.state != "decided"


def test_a_failed_turn_keeps_the_providers_words_with_secrets_masked_and_capped(
    eng: Engine, server: ProviderServer
) -> None:
    key = "sk-proj-" + "a1B2c3D4" * 6
    words = f"upstream overloaded (key {key} over quota) " + "x" * 600
    server.reply(openai_error(400, words, type="invalid_request_error"))
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    AgentRunner(eng, adapter(server, "openai"), retry=NO_SLEEP).step(eng.load(task_id))
    said = eng.history(task_id)[-1].data["turn"]["provider_message"]
    assert said.startswith("upstream overloaded (key [redacted] over quota)") and key not in said
    assert len(said) <= 300 + len("…[cut]")


def test_retry_after_is_read_in_seconds_milliseconds_or_as_a_date() -> None:
    from datetime import UTC, datetime

    from engine.core.model_errors import retry_after

    at = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    assert retry_after({"Retry-After": "7"}, at) == 7.0
    assert retry_after({"retry-after-ms": "250"}, at) == 0.25
    assert retry_after({"Retry-After": "Thu, 03 Dec 2026 12:00:30 GMT"}, at) == 30.0
    for unusable in ({}, {"Retry-After": "soon"}, {"Retry-After": "-3"}, {"Retry-After": "nan"}):
        assert retry_after(unusable, at) is None, unusable


def test_signed_thinking_is_passed_back_in_the_repair_turn(eng: Engine, server: ProviderServer) -> None:
    from tests.support.provider_server import thinking_block

    bad = tool_use_block("tu_1", "decide", {"ticket_id": "T-9", "decision": "RESOLVE", "reason": "x"})
    good = tool_use_block("tu_2", "decide", {"ticket_id": "T-1", "decision": "RESOLVE", "reason": "x"})
    server.reply(
        anthropic_message(thinking_block("T-9 looks right.", "sig-1"), bad, stop_reason="tool_use"),
        anthropic_message(thinking_block("No, T-1.", "sig-2"), good, stop_reason="tool_use"),
    )
    task_id = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    task = AgentRunner(eng, adapter(server, "anthropic"), thinking=True, retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == "decided"
    replayed = server.bodies[1]["messages"]
    assistant = next(m for m in replayed if m["role"] == "assistant")
    assert assistant["content"][0] == {"type": "thinking", "thinking": "T-9 looks right.", "signature": "sig-1"}
    assert assistant["content"][1]["type"] == "tool_use"
