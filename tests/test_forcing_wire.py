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
    no_sleep,
    openai_completion,
    text_block,
    tool_use_block,
)
from tests.support.sample_workflows import ROLES, all_workflows

NO_SLEEP = RetryPolicy(attempts=2, base_delay=0.0, sleep=no_sleep)
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
    assert eng.history(second)[1].data["turn"]["learned"] == ["openai:gpt-4.1:plain:named_tool"]
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
    ("anthropic", "claude-opus-4-8", {"thinking": {"type": "adaptive"}}),  # adaptive-only, like 4.7
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


# -- refusals that must not loop or spread ------------------------------------------------------------


def openai_refusal(param: str | None, message: str = "nope") -> Reply:
    return Reply(
        status=400,
        body={"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}},
    )


def anthropic_refusal(message: str) -> Reply:
    """Anthropic's 400: a type and a message, never a `param`."""
    return Reply(status=400, body={"type": "error", "error": {"type": "invalid_request_error", "message": message}})


def refuses_every_optional_shape(body: dict[str, Any]) -> Reply:
    """A gateway that refuses any `response_format` and any forced `tool_choice`, naming the field; else prose."""
    if body.get("response_format"):
        return openai_refusal("response_format")
    if body.get("tool_choice") not in (None, "auto"):
        return openai_refusal("tool_choice")
    return openai_completion(text=PROSE)


def test_a_refused_bottom_rung_goes_without_json_mode_and_a_model_that_never_complies_is_handed_off(
    eng: Engine, server: ProviderServer
) -> None:
    server.respond_with(refuses_every_optional_shape)
    task_id = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    task = AgentRunner(eng, adapter(server, "gpt-4.1"), retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == "assessing~handoff"
    demoted = [e.data["turn"]["demoted"] for e in eng.history(task_id) if e.trigger == "demote"]
    assert demoted == [
        "openai:gpt-4.1:plain:strict_schema",
        "openai:gpt-4.1:plain:native_schema",
        "openai:gpt-4.1:plain:required",
        "openai:gpt-4.1:plain:json_mode",
    ]
    # No request shape is sent again after its refusal: once JSON mode was refused the bottom rung goes without it.
    bottom = [b for b in server.bodies if rung_sent(b) == "json_instructions"]
    assert "response_format" in bottom[0] and all("response_format" not in b for b in bottom[1:])
    assert eng.history(task_id)[-1].data["last_code"] == "OUTPUT_NOT_JSON"
    # Four refusals and the repairs the state allows (3), then the hand-off: nowhere near the turn budget.
    assert len(server.bodies) == 4 + 3 + 1
    assert eng.replay(task_id).ok


def test_a_refusal_that_names_a_shape_the_request_no_longer_carries_is_a_provider_error(
    eng: Engine, server: ProviderServer
) -> None:
    """A gateway that answers every request with a 400 naming `tool_choice`, even one that sends none."""
    server.respond_with(lambda body: openai_refusal("tool_choice"))
    task_id = eng.start("triage", TICKET, actor="ann")
    task = AgentRunner(eng, adapter(server, "glm-4.6"), retry=NO_SLEEP).run(eng.load(task_id))
    assert task.state == "deciding~provider_error"
    triggers = [e.trigger for e in eng.history(task_id)]
    assert triggers == ["start", "demote", "demote", "provider_error"]
    assert "tool_choice" not in server.bodies[-1] and "response_format" not in server.bodies[-1]


def test_an_anthropic_wire_profile_with_a_native_schema_ends_in_a_hand_off_not_a_loop(
    eng: Engine, server: ProviderServer
) -> None:
    """Anthropic has no JSON mode: the adapter refuses it before any call, once; then the schema is in the text."""
    server.respond_with(lambda body: anthropic_message(text_block(PROSE)))
    profiles = load_profiles()
    profiles["anthropic"] = dataclasses.replace(profiles["anthropic"], native_schema="strict")
    task_id = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    model = adapter(server, "claude-sonnet-4-5", wire="anthropic")
    task = AgentRunner(eng, model, thinking=True, retry=NO_SLEEP, profiles=profiles).run(eng.load(task_id))
    assert task.state == "assessing~handoff"
    demotes = [e.data["turn"] for e in eng.history(task_id) if e.trigger == "demote"]
    assert [(d["code"], d["demoted"]) for d in demotes] == [
        ("SCHEMA_UNSUPPORTED", "anthropic:claude-sonnet-4-5:thinking:json_mode")
    ]
    last = server.bodies[-1]
    assert "output_config" not in last and "tools" not in last
    assert "<output_schema>" in json.dumps(last["messages"])
    assert eng.history(task_id)[-1].data["turn"]["strategy"] == "json_instructions"


def test_an_unrelated_400_on_a_forced_rung_does_not_take_forcing_from_other_tasks(
    eng: Engine, server: ProviderServer
) -> None:
    too_long = anthropic_refusal("prompt is too long: 215000 tokens > 200000 maximum")
    server.reply(too_long, too_long)
    decided = anthropic_message(tool_use_block("tu_1", "decide", DECISION), stop_reason="tool_use")
    server.respond_with(lambda body: decided)
    runner = AgentRunner(eng, adapter(server, "claude-sonnet-4-5", wire="anthropic"), retry=NO_SLEEP)
    first = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(first)).state == "deciding~provider_error"
    turns = [(e.trigger, e.data["turn"].get("demoted"), e.data["turn"].get("shared")) for e in eng.history(first)[1:]]
    # The 400 named no field: the task tried once without the forced choice, which failed the same way.
    assert turns == [
        ("demote", "anthropic:claude-sonnet-4-5:plain:named_tool", False),
        ("provider_error", None, None),
    ]
    second = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(second)).state == "decided"
    assert server.bodies[2]["tool_choice"] == {"type": "tool", "name": "decide"}  # still forced


THINKING_REFUSALS = [
    # (wire, model, the profile's name, the provider's own 400 for a forced choice in thinking mode)
    ("anthropic", "claude-opus-4-6", "anthropic", "Thinking may not be enabled when tool_choice forces tool use."),
    ("openai", "deepseek-chat", "deepseek", "deepseek-reasoner does not support this tool_choice"),
]


@pytest.mark.parametrize(("wire", "model", "profile", "message"), THINKING_REFUSALS)
def test_a_named_tool_refused_in_thinking_mode_is_followed_by_a_turn_that_forces_nothing(
    eng: Engine, server: ProviderServer, wire: str, model: str, profile: str, message: str
) -> None:
    """A profile that thought forcing worked with thinking on: the provider's 400 names no field; the next turn,
    still thinking, sends neither a named tool nor `required`, is answered, and the process learns the refusal."""

    def forced(body: dict[str, Any]) -> bool:
        choice = body.get("tool_choice")
        return choice == "required" or (isinstance(choice, dict) and choice.get("type") in ("tool", "any", "function"))

    def respond(body: dict[str, Any]) -> Reply:
        if wire == "anthropic":
            if forced(body):
                return anthropic_refusal(message)
            return anthropic_message(tool_use_block("tu_1", "decide", DECISION), stop_reason="tool_use")
        return openai_refusal(None, message) if forced(body) else tool_call(body, DECISION)

    server.respond_with(respond)
    profiles = load_profiles()
    everything = frozenset({"auto", "none", "required", "named"})
    profiles[profile] = dataclasses.replace(profiles[profile], tool_choice_thinking_on=everything)
    runner = AgentRunner(eng, adapter(server, model, wire=wire), thinking=True, retry=NO_SLEEP, profiles=profiles)
    first = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(first)).state == "decided"
    refused, answered = server.bodies
    assert forced(refused) and not forced(answered)
    assert answered.get("tool_choice") in ("auto", {"type": "auto"})
    assert refused.get("thinking") == answered.get("thinking") and answered.get("thinking") is not None
    demote = eng.history(first)[1].data["turn"]
    assert (demote["code"], demote["demoted"], demote["shared"]) == (
        "TOOL_CHOICE_UNSUPPORTED",
        f"{profile}:{model}:thinking:named_tool",
        False,
    )
    # Answered without the forced choice: the refusal was the forced choice's, so the next task starts unforced.
    second = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(second)).state == "decided"
    assert len(server.bodies) == 3 and not forced(server.bodies[2])
    assert [e.trigger for e in eng.history(second)] == ["start", "decide"]
    # Its log says why it started unforced: what the first task found.
    assert eng.history(second)[1].data["turn"]["learned"] == [f"{profile}:{model}:thinking:named_tool"]
    assert "learned" not in eng.history(first)[2].data["turn"]  # the first task's own log explains its own turns


CLASHES = [
    # (wire, model, thinking, a user's extra body, what the body must carry)
    (
        "openai",
        "deepseek-chat",
        True,
        {"thinking": {"type": "disabled"}, "service_tier": "flex"},
        {"thinking": {"type": "enabled"}, "service_tier": "flex"},
    ),
    (
        "openai",
        "gemini-2.5-flash",
        False,
        {"extra_body": {"google": {"cached_content": "c1", "thinking_config": {"thinking_budget": 512}}}},
        {"extra_body": {"google": {"cached_content": "c1", "thinking_config": {"thinking_budget": 0}}}},
    ),
    (
        "anthropic",
        "claude-sonnet-4-5",
        True,
        {"thinking": {"type": "disabled"}, "metadata": {"user_id": "u1"}},
        {"thinking": {"type": "enabled", "budget_tokens": 2048}, "metadata": {"user_id": "u1"}},
    ),
]


@pytest.mark.parametrize(("wire", "model", "thinking", "extra", "sent"), CLASHES)
def test_the_thinking_switch_wins_over_an_extra_body_and_the_event_records_what_was_sent(
    eng: Engine,
    server: ProviderServer,
    wire: str,
    model: str,
    thinking: bool,
    extra: dict[str, Any],
    sent: dict[str, Any],
) -> None:
    model_: Any
    if wire == "anthropic":
        server.reply(anthropic_message(text_block("?")))
        model_ = AnthropicAdapter(model, base_url=server.anthropic_base_url, api_key="t", timeout=5, extra_body=extra)
    else:
        server.reply(openai_completion(text="?"))
        model_ = OpenAIAdapter(model, base_url=server.openai_base_url, api_key="t", timeout=5, extra_body=extra)
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, model_, thinking=thinking, retry=NO_SLEEP).step(eng.load(task_id))
    body = server.last_body
    assert {k: body[k] for k in sent} == sent
    turn = eng.history(task_id)[-1].data["turn"]
    switch_keys = set(turn["thinking_switch"])
    assert switch_keys and {k: body[k] for k in switch_keys if k != "extra_body"} == {
        k: v for k, v in turn["thinking_switch"].items() if k != "extra_body"
    }
    if "extra_body" in turn["thinking_switch"]:  # Gemini: the switch's leaf, beside the user's own google fields
        google = turn["thinking_switch"]["extra_body"]["google"]
        assert body["extra_body"]["google"]["thinking_config"] == google["thinking_config"]


def test_a_profile_that_cannot_disable_thinking_is_sent_thinking_on_without_the_flag(
    eng: Engine, server: ProviderServer, tmp_path: Any
) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text("[profiles.glm]\ncan_disable_thinking = false\n", encoding="utf-8")
    server.reply(openai_completion(text="?"))
    task_id = eng.start("triage", TICKET, actor="ann")
    runner = AgentRunner(eng, adapter(server, "glm-4.6"), retry=NO_SLEEP, profiles=load_profiles(str(path)))
    runner.step(eng.load(task_id))
    assert server.last_body["thinking"] == {"type": "enabled"}
    turn = eng.history(task_id)[-1].data["turn"]
    assert (turn["thinking"], turn["thinking_switch"]) == (True, {"thinking": {"type": "enabled"}})


def test_deprecated_profile_settings_still_load(tmp_path: Any) -> None:
    """`schema_with_tools` and `reasoning_passback` have no effect, but a file that sets them keeps loading."""
    path = tmp_path / "profiles.toml"
    path.write_text("[profiles.glm]\nschema_with_tools = true\nreasoning_passback = true\n", encoding="utf-8")
    assert load_profiles(str(path))["glm"].schema_with_tools is True


def test_a_refusal_confirmed_across_separate_steps_of_one_engine_reaches_its_other_tasks(
    eng: Engine, server: ProviderServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Engine.step` makes a runner per turn (as the API's step does): the confirmation is the engine's."""
    path = tmp_path / "profiles.toml"
    path.write_text('[profiles.anthropic]\ntool_choice_thinking_on = ["auto", "none", "required", "named"]\n')
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(path))

    def respond(body: dict[str, Any]) -> Reply:
        if body.get("tool_choice", {}).get("type") == "tool":
            return anthropic_refusal("Thinking may not be enabled when tool_choice forces tool use.")
        return anthropic_message(tool_use_block("tu_1", "decide", DECISION), stop_reason="tool_use")

    server.respond_with(respond)
    model = adapter(server, "claude-opus-4-6", wire="anthropic")
    first = eng.start("triage", TICKET, actor="ann")
    eng.step(first, model=model, thinking=True)
    assert eng.step(first, model=model, thinking=True).state == "decided"
    second = eng.start("triage", TICKET, actor="ann")
    assert eng.step(second, model=model, thinking=True).state == "decided"
    assert [b["tool_choice"]["type"] for b in server.bodies] == ["tool", "auto", "auto"]
