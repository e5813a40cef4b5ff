"""Forcing that converges, through the real SDKs against the local wire-format server.

Servers that behave like real models do: one that ignores `response_format` and
answers prose unless tools are offered, one that obeys only system-role
instructions. Each task must complete inside its repair budget by escalating,
with every escalation an event and every reminder kept. And thinking is a
request parameter: the body carries each provider's own switch.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import Engine, Registry, StaticRoles, migrations
from engine.core.profiles import load_profiles
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.provider_server import (
    ProviderServer,
    Reply,
    anthropic_message,
    openai_completion,
    text_block,
    tool_use_block,
)
from tests.support.sample_workflows import ROLES, all_workflows

NO_SLEEP = RetryPolicy(attempts=2, base_delay=0.0, sleep=lambda _s: None)
TICKET = {"ticket_id": "T-1"}
DECISION = {"ticket_id": "T-1", "decision": "RESOLVE", "reason": "fixed in the last release"}
PROSE = "Sure! This ticket looks resolved to me, the fix shipped last week."


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def eng(tmp_path: Any, server: ProviderServer) -> Iterator[Engine]:
    server.reset()
    url = f"sqlite:///{tmp_path}/forcing.db"
    migrations.upgrade(url)
    with Engine(url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def adapter(server: ProviderServer, model: str, *, wire: str = "openai") -> Any:
    if wire == "anthropic":
        return AnthropicAdapter(model, base_url=server.anthropic_base_url, api_key="test", timeout=5)
    return OpenAIAdapter(model, base_url=server.openai_base_url, api_key="test", timeout=5)


def rung_sent(body: dict[str, Any]) -> str:
    """The rung a Chat Completions body was asked on, read from the wire alone."""
    if (body.get("response_format") or {}).get("type") == "json_schema":
        return "native_schema"
    if not body.get("tools"):
        return "json_instructions"
    choice = body.get("tool_choice")
    return "named_tool" if isinstance(choice, dict) else "required" if choice == "required" else "auto_reminder"


def reminders(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"] if "<system-reminder>" in (m.get("content") or "")]


def assert_history_only_grows(bodies: list[dict[str, Any]]) -> None:
    for before, after in itertools.pairwise(bodies):
        assert after["messages"][: len(before["messages"])] == before["messages"], "a message was deleted or changed"


def tool_call(body: dict[str, Any], arguments: dict[str, Any]) -> Reply:
    name = body["tools"][0]["function"]["name"]
    call_id = f"call_{len(body['messages'])}"
    return openai_completion(tool_calls=((call_id, name, json.dumps(arguments)),), finish_reason="tool_calls")


def prose_unless_tools(arguments: dict[str, Any]) -> Callable[[Any], Reply]:
    """A gateway that drops `response_format`: the model answers prose, except that offered tools get called."""
    return lambda body: tool_call(body, arguments) if body.get("tools") else openai_completion(text=PROSE)


def obeys_only_system(*answers: dict[str, Any]) -> Callable[[Any], Reply]:
    """A model that follows an instruction only in a system message after the first; user-role reminders it ignores."""
    queue = iter(answers)

    def respond(body: dict[str, Any]) -> Reply:
        told = any(role == "system" for role, _ in reminders({"messages": body["messages"][1:]}))
        return tool_call(body, next(queue)) if told and body.get("tools") else openai_completion(text=PROSE)

    return respond


# -- escalation ---------------------------------------------------------------------------------------


ESCALATIONS = [
    # (workflow, input, arguments, the rungs on the wire, the state it ends in)
    ("triage", TICKET, DECISION, ["native_schema", "native_schema", "named_tool"], "decided"),
    (
        "refund",
        {"customer": "c1", "balance": 500},
        {"amount": 30, "reason": "damaged in transit"},
        ["native_schema", "native_schema", "required"],
        "auto_refund",
    ),
]


@pytest.mark.parametrize(("workflow", "payload", "arguments", "rungs", "end"), ESCALATIONS)
def test_a_model_that_ignores_response_format_completes_by_escalating(
    eng: Engine,
    server: ProviderServer,
    workflow: str,
    payload: dict[str, Any],
    arguments: dict[str, Any],
    rungs: list[str],
    end: str,
) -> None:
    server.respond_with(prose_unless_tools(arguments))
    task_id = eng.start(workflow, payload, actor="ann")
    task = AgentRunner(eng, adapter(server, "gpt-4.1"), retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == end
    # The request log: restated on the same rung first (the openai profile's order), then one rung down.
    assert [rung_sent(b) for b in server.bodies] == rungs
    turns = [(e.trigger, e.data["turn"].get("escalated")) for e in eng.history(task_id)[1:] if "turn" in e.data]
    assert turns == [
        ("repair", {"from": "native_schema", "to": "native_schema", "step": "reminder", "why": "OUTPUT_NOT_JSON"}),
        ("repair", {"from": "native_schema", "to": rungs[-1], "step": "rung", "why": "OUTPUT_NOT_JSON"}),
        (turns[-1][0], None),
    ]
    # Two repairs: within triage's budget of 2 and refund's of 3, spent as any repair is.
    assert [e.trigger for e in eng.history(task_id)].count("repair") == 2
    # The restatement is a system message (OpenAI takes one mid-conversation) and it stays in later requests.
    first, second, third = server.bodies
    assert second["messages"][-1]["role"] == "system" and "<system-reminder>" in second["messages"][-1]["content"]
    assert len(reminders(first)) == 1 and len(reminders(second)) == 2 and len(reminders(third)) == 3
    assert_history_only_grows(server.bodies)
    assert eng.replay(task_id).ok


def test_the_rung_that_worked_is_where_the_next_task_starts(eng: Engine, server: ProviderServer) -> None:
    server.respond_with(prose_unless_tools(DECISION))
    runner = AgentRunner(eng, adapter(server, "gpt-4.1"), retry=NO_SLEEP)
    first = eng.start("triage", TICKET, actor="ann")
    runner.run(eng.load(first))
    assert eng.history(first)[-1].data["turn"]["worked"] == "openai:gpt-4.1:plain:named_tool"
    asked = len(server.bodies)
    second = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(second)).state == "decided"
    # One request, on the rung that worked: no prose answer, no repair.
    assert [rung_sent(b) for b in server.bodies[asked:]] == ["named_tool"]
    assert [e.trigger for e in eng.history(second)] == ["start", "decide"]
    # Thinking on is another (profile, model, thinking): it starts at the top again.
    third = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, adapter(server, "gpt-4.1"), thinking=True, retry=NO_SLEEP).run(eng.load(third))
    assert rung_sent(server.bodies[asked + 1]) == "native_schema"


@pytest.mark.parametrize(("profile", "model"), [("glm", "glm-4.6"), ("minimax", "MiniMax-M2")])
def test_a_model_that_obeys_only_system_messages_completes_with_glm_and_minimax(
    eng: Engine, server: ProviderServer, profile: str, model: str
) -> None:
    # First a compliant answer that is wrong (another ticket: an ordinary repair), then the right one.
    server.respond_with(obeys_only_system({**DECISION, "ticket_id": "T-9"}, DECISION))
    task_id = eng.start("triage", TICKET, actor="ann")
    task = AgentRunner(eng, adapter(server, model), retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == "decided"
    assert eng.history(task_id)[-1].data["turn"]["profile"] == profile
    first, second = server.bodies
    # One mode (tools, auto), one reminder, a system message, and it is never deleted.
    assert [role for role, _ in reminders(first)] == ["system"]
    assert reminders(second) == reminders(first)
    assert_history_only_grows(server.bodies)
    repair = eng.history(task_id)[1].data["turn"]
    assert repair["code"] == "DOMAIN_INVALID" and "escalated" not in repair  # compliant, only wrong: no escalation


def test_the_same_model_with_user_role_reminders_escalates_and_runs_out(eng: Engine, server: ProviderServer) -> None:
    """The contrast: what the GLM profile did before it declared `reminder_role = "system"`."""
    server.respond_with(obeys_only_system(DECISION))
    profiles = load_profiles()
    profiles["glm"] = dataclasses.replace(profiles["glm"], reminder_role="user")
    task_id = eng.start("triage", TICKET, actor="ann")
    task = AgentRunner(eng, adapter(server, "glm-4.6"), retry=NO_SLEEP, profiles=profiles).run(eng.load(task_id))
    assert task.state == "deciding~handoff"
    assert [rung_sent(b) for b in server.bodies] == ["auto_reminder", "auto_reminder", "json_instructions"]
    # Restated, then the next mode's own: every reminder kept, one per mode change or restatement.
    assert [role for role, _ in reminders(server.bodies[-1])] == ["user", "user", "user"]
    assert_history_only_grows(server.bodies)


def test_on_the_anthropic_wire_the_restated_reminder_is_a_user_block_and_the_system_prompt_stays(
    eng: Engine, server: ProviderServer
) -> None:
    """A gateway that drops `tool_choice`: prose until the instruction is restated in the conversation."""

    def respond(body: dict[str, Any]) -> Reply:
        blocks = [b for m in body["messages"] if m["role"] == "user" for b in m["content"] if isinstance(b, dict)]
        if any("<system-reminder>" in b.get("text", "") for b in blocks):
            return anthropic_message(tool_use_block("tu_1", "decide", DECISION), stop_reason="tool_use")
        return anthropic_message(text_block(PROSE))

    server.respond_with(respond)
    task_id = eng.start("triage", TICKET, actor="ann")
    runner = AgentRunner(eng, adapter(server, "claude-sonnet-4-5", wire="anthropic"), retry=NO_SLEEP)
    assert runner.run(eng.load(task_id)).state == "decided"
    first, second = server.bodies
    assert first["tool_choice"]["type"] == second["tool_choice"]["type"] == "tool"
    assert first["system"] == second["system"]  # the cached prefix is untouched
    error, restated = second["messages"][-1]["content"]  # one user message: the error fed back, then the reminder
    assert "NO_ACTION" in error["text"] and "<system-reminder>" in restated["text"]
    assert eng.history(task_id)[1].data["turn"]["escalated"] == {
        "from": "named_tool",
        "to": "named_tool",
        "step": "reminder",
        "why": "NO_ACTION",
    }


def strict_refusal() -> Reply:
    return Reply(
        status=400,
        body={
            "error": {
                "message": "Invalid schema for response_format 'action': strict mode is not supported",
                "type": "invalid_request_error",
                "param": "response_format",
                "code": None,
            }
        },
    )


def test_a_strict_schema_refused_once_rules_out_strict_schemas_for_every_later_task(
    eng: Engine, server: ProviderServer
) -> None:
    server.reply(strict_refusal())
    envelope = openai_completion(text=json.dumps({"action": "decide", "arguments": DECISION}))
    server.respond_with(lambda body: tool_call(body, DECISION) if body.get("tools") else envelope)
    runner = AgentRunner(eng, adapter(server, "gpt-4.1"), retry=NO_SLEEP)
    first, second = (eng.start("triage", TICKET, actor="ann") for _ in range(2))
    assert runner.run(eng.load(first)).state == "decided"
    assert runner.run(eng.load(second)).state == "decided"
    formats = [b["response_format"]["json_schema"]["strict"] for b in server.bodies]
    assert formats == [True, False, False]  # the same rung, loose, and never strict again
    demotions = [e.data["turn"] for t in (first, second) for e in eng.history(t) if e.trigger == "demote"]
    assert [(d["code"], d["demoted"]) for d in demotions] == [
        ("SCHEMA_UNSUPPORTED", "openai:gpt-4.1:plain:strict_schema")
    ]


def test_strict_tools_lose_strict_once_strict_schemas_were_refused(eng: Engine, server: ProviderServer) -> None:
    """A gateway that refuses strict and `json_schema` alike: two refusals, then tools, none of them strict."""
    server.reply(strict_refusal(), strict_refusal())
    server.respond_with(lambda body: tool_call(body, DECISION))
    task_id = eng.start("triage", TICKET, actor="ann")
    assert AgentRunner(eng, adapter(server, "gpt-4.1"), retry=NO_SLEEP).run(eng.load(task_id)).state == "decided"
    assert [rung_sent(b) for b in server.bodies] == ["native_schema", "native_schema", "named_tool"]
    assert not any(tool["function"].get("strict") for tool in server.bodies[-1]["tools"])
    assert [e.data["turn"]["demoted"] for e in eng.history(task_id) if e.trigger == "demote"] == [
        "openai:gpt-4.1:plain:strict_schema",
        "openai:gpt-4.1:plain:native_schema",
    ]


# -- thinking -----------------------------------------------------------------------------------------

#: Every key a thinking switch may put in a body: with no switch, none of them is sent.
SWITCH_KEYS = ("thinking", "enable_thinking", "reasoning_effort", "extra_body")
GEMINI_ON = {"extra_body": {"google": {"thinking_config": {"thinking_budget": -1}}}}
GEMINI_OFF = {"extra_body": {"google": {"thinking_config": {"thinking_budget": 0}}}}

SWITCHES = [
    # (profile, wire, model, thinking, the fields the body must carry; {}: no switch field at all)
    ("openai", "openai", "gpt-4.1", True, {"reasoning_effort": "medium"}),
    ("openai", "openai", "gpt-4.1", False, {}),
    ("anthropic", "anthropic", "claude-sonnet-4-5", True, {"thinking": {"type": "enabled", "budget_tokens": 2048}}),
    ("anthropic", "anthropic", "claude-sonnet-4-5", False, {}),
    ("anthropic", "anthropic", "claude-opus-4-6", True, {"thinking": {"type": "adaptive"}}),
    ("gemini", "openai", "gemini-2.5-flash", True, GEMINI_ON),
    ("gemini", "openai", "gemini-2.5-flash", False, GEMINI_OFF),
    ("deepseek", "openai", "deepseek-chat", True, {"thinking": {"type": "enabled"}}),
    ("deepseek", "openai", "deepseek-chat", False, {"thinking": {"type": "disabled"}}),
    ("qwen", "openai", "qwen3-max", True, {"enable_thinking": True}),
    ("qwen", "openai", "qwen3-max", False, {"enable_thinking": False}),
    ("glm", "openai", "glm-4.6", True, {"thinking": {"type": "enabled"}}),
    ("glm", "openai", "glm-4.6", False, {"thinking": {"type": "disabled"}}),
    ("minimax", "openai", "abab6.5s-chat", True, {}),
    ("mistral", "openai", "mistral-large-latest", True, {}),
    ("ollama", "openai", "ollama/qwen3:8b", True, {"reasoning_effort": "medium"}),
    ("ollama", "openai", "llama3.1", False, {}),
]


@pytest.mark.parametrize(("profile", "wire", "model", "thinking", "fields"), SWITCHES)
def test_the_request_body_carries_the_providers_thinking_switch(
    eng: Engine, server: ProviderServer, profile: str, wire: str, model: str, thinking: bool, fields: dict[str, Any]
) -> None:
    server.reply(anthropic_message(text_block("?")) if wire == "anthropic" else openai_completion(text="?"))
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, adapter(server, model, wire=wire), thinking=thinking, retry=NO_SLEEP).step(eng.load(task_id))
    body = server.last_body
    assert {k: body[k] for k in SWITCH_KEYS if k in body} == fields
    turn = eng.history(task_id)[-1].data["turn"]
    assert (turn["profile"], turn["thinking"]) == (profile, thinking)
    # The event records what was sent.
    assert turn.get("thinking_switch", {}) == fields


ALWAYS_THINKING = [
    # (wire, model, what the body must carry with the flag off)
    ("openai", "deepseek-reasoner", {"thinking": {"type": "enabled"}}),
    ("openai", "o3-mini", {"reasoning_effort": "medium"}),
    ("openai", "qwen3-235b-a22b-thinking-2507", {"enable_thinking": True}),
    ("openai", "gemini-2.5-pro", GEMINI_ON),
    ("anthropic", "claude-opus-4-7", {"thinking": {"type": "adaptive"}}),
]


@pytest.mark.parametrize(("wire", "model", "fields"), ALWAYS_THINKING)
def test_a_model_that_always_thinks_is_thinking_on_without_the_flag(
    eng: Engine, server: ProviderServer, wire: str, model: str, fields: dict[str, Any]
) -> None:
    server.reply(anthropic_message(text_block("?")) if wire == "anthropic" else openai_completion(text="?"))
    task_id = eng.start("triage", TICKET, actor="ann")
    runner = AgentRunner(eng, adapter(server, model, wire=wire), thinking=False, retry=NO_SLEEP)
    runner.step(eng.load(task_id))
    body = server.last_body
    assert {k: body[k] for k in SWITCH_KEYS if k in body} == fields
    turn = eng.history(task_id)[-1].data["turn"]
    assert turn["thinking"] is True
    # Forced only where the profile allows forcing with thinking on: never a named tool for DeepSeek or Claude.
    if runner.profile.name in ("deepseek", "anthropic", "qwen"):
        assert body.get("tool_choice") in ("auto", {"type": "auto"})
