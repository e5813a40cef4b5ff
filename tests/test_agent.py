"""Agent states: the model proposes only allowed actions; forcing, repairs, demotions and provider errors
are transitions in the log, each model turn exactly one event."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine import ANYONE, Code, Engine, MemoryStore, ModelRequest, RailyardError, Registry, ScriptedModel, StaticRoles
from engine.core.forcing import RANK, Rung, escalation_path, ladder
from engine.core.profiles import BUILTIN_PROFILES, load_profiles
from engine.providers.scripted import call
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.payloads import undeclared
from tests.support.provider_server import no_sleep
from tests.support.sample_workflows import ROLES, all_workflows

ORDER = {"customer": "c1", "balance": 500}
TICKET = {"ticket_id": "T-1"}
NO_SLEEP = RetryPolicy(attempts=3, base_delay=0.0, sleep=no_sleep)


@pytest.fixture
def eng() -> Iterator[Engine]:
    with Engine(store=MemoryStore(), registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as engine:
        yield engine


def run(eng: Engine, task_id: str, model: ScriptedModel, *, thinking: bool = False, turns: int = 50) -> Any:
    runner = AgentRunner(eng, model, thinking=thinking, retry=NO_SLEEP)
    return runner.run(eng.load(task_id), max_turns=turns)


def trail(eng: Engine, task_id: str) -> list[tuple[str, str, str | None, str | None]]:
    return [
        (e.trigger, e.to_state, e.data.get("turn", {}).get("strategy"), e.data.get("turn", {}).get("code"))
        for e in eng.history(task_id)[1:]
    ]


def test_free_text_three_times_then_a_valid_call(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    model = ScriptedModel(
        [{"text": "I would refund."}] * 3 + [call("propose", amount=300, reason="damaged")], profile="anthropic"
    )
    task = run(eng, task_id, model)
    assert task.state == "awaiting_approval"
    # Each prose answer ignored the rung: restate (anthropic's order), then move down, a step per repair.
    assert trail(eng, task_id) == [
        ("repair", "assessing~force", "required", "NO_ACTION"),
        ("repair", "assessing~force", "required", "NO_ACTION"),
        ("repair", "assessing~force", "auto_reminder", "NO_ACTION"),
        ("propose", "awaiting_approval", "json_instructions", None),
    ]
    steps = [e.data["turn"].get("escalated", {}).get("step") for e in eng.history(task_id)[1:]]
    assert steps == ["reminder", "rung", "rung", None]
    last = eng.history(task_id)[-1]
    assert last.data["args"] == {"amount": 300, "reason": "damaged"}
    assert last.actor == "model:scripted:scripted"


def test_a_model_that_never_complies_is_handed_off_after_exactly_the_budget(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    model = ScriptedModel([{"text": "no"}] * 10, profile="anthropic")
    task = run(eng, task_id, model)
    assert task.state == "assessing~handoff" and task.status == "blocked"
    assert [t[0] for t in trail(eng, task_id)] == ["repair", "repair", "repair", "hand_off"]
    assert eng.history(task_id)[-1].data["turn"]["code"] == "REPAIRS_EXHAUSTED"
    # Escalating ended on json_instructions, where prose is not JSON.
    assert eng.history(task_id)[-1].data["last_code"] == "OUTPUT_NOT_JSON"
    assert [t[2] for t in trail(eng, task_id)] == ["required", "required", "auto_reminder", "json_instructions"]
    assert undeclared(eng.history(task_id)) == []
    assert len(model.requests) == 4
    # An operator sends it back to the agent, with a fresh repair budget.
    eng.fire(task_id, "retry", actor="olga")
    assert eng.load(task_id).visit["repairs"] == 0


def test_repair_feedback_carries_the_call_and_compact_errors_never_the_raw_input(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    secret = "4111-1111-1111-1111"
    model = ScriptedModel([call("propose", amount=secret, reason="x"), call("give_up")], profile="anthropic")
    run(eng, task_id, model)
    second = model.requests[1]
    tool_result = second.messages[-1]
    assert tool_result.role == "tool" and tool_result.tool_call_id == second.messages[-2].tool_calls[0].id
    feedback = json.loads(tool_result.content)
    assert feedback["error"] == "OUTPUT_SCHEMA_INVALID"
    assert feedback["errors"][0]["loc"] == ["amount"]
    assert feedback["allowed_actions"] == ["propose", "give_up", "note"]
    assert secret not in tool_result.content


def test_each_layer_has_its_code(eng: Engine) -> None:
    cases = [
        (
            {"tool_calls": [{"name": "note", "arguments": {"note": "a"}}, {"name": "give_up", "arguments": {}}]},
            "MULTIPLE_ACTIONS",
        ),
        (call("fly_to_the_moon"), "ACTION_UNKNOWN"),
        (call("approve"), "ACTION_NOT_ALLOWED"),
        (call("cancel", reason="x"), "ACTION_NOT_ALLOWED"),
        ({"tool_calls": [{"name": "note", "arguments": "{not json"}]}, "OUTPUT_NOT_JSON"),
        (call("propose", amount=5), "OUTPUT_SCHEMA_INVALID"),
        (call("propose", amount=5, reason="x", extra=1), "OUTPUT_SCHEMA_INVALID"),
        (call("propose", amount=900, reason="x"), "DOMAIN_INVALID"),
        ({"text": ""}, "NO_ACTION"),
    ]
    for turn, code in cases:
        task_id = eng.start("refund", ORDER, actor="ann", version=1)
        eng.step(task_id, model=ScriptedModel([turn], profile="anthropic"))
        event = eng.history(task_id)[-1]
        assert (event.trigger, event.data["turn"]["code"]) == ("repair", code), turn


def test_identity_override_hands_off_at_once_without_a_repair(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    eng.step(task_id, model=ScriptedModel([call("propose", amount=5, reason="x", customer="c2")], profile="anthropic"))
    event = eng.history(task_id)[-1]
    assert (event.trigger, event.to_state, event.data["turn"]["code"]) == (
        "hand_off",
        "assessing~handoff",
        "IDENTITY_OVERRIDE",
    )


def test_tool_choice_unsupported_rules_out_every_forced_form_without_spending_a_repair(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    refusal = {"error": {"status": 400, "message": "Thinking mode does not support this tool_choice"}}
    model = ScriptedModel([refusal, call("decide", ticket_id="T-1", decision="RESOLVE", reason="ok")], profile="qwen")
    task = run(eng, task_id, model)
    assert task.state == "decided"
    assert trail(eng, task_id) == [
        ("demote", "deciding", "named_tool", "TOOL_CHOICE_UNSUPPORTED"),
        ("decide", "decided", "auto_reminder", None),  # not `required`: a forced form too, refused the same way
    ]
    assert [r.tool_choice for r in model.requests] == ["decide", "auto"]
    # Remembered in the log: a worker resuming this task never re-sends the refused shape.
    assert eng.history(task_id)[1].data["turn"]["demoted"] == "qwen:scripted:plain:named_tool"


def test_refused_shapes_are_never_resent_unchanged(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    shape = {"error": {"status": 400, "message": "tool_choice is not supported"}}
    schema = {"error": {"status": 400, "message": "response_format json_schema is not supported"}}
    model = ScriptedModel([schema, schema, shape, {"text": "{}"}], profile="openai")
    run(eng, task_id, model, turns=4)
    sent = [
        (r.response_schema.mode if r.response_schema else None, r.tool_choice, any(t.strict for t in r.tools))
        for r in model.requests
    ]
    # A refused strict schema rules out strict schemas (the schema is sent again, loose; tools lose `strict`);
    # a refused loose one rules out the rung; a refused forced tool choice every forced form, not `required` either.
    assert sent[:4] == [("strict", None, False), ("loose", None, False), (None, "decide", False), (None, "auto", False)]
    assert len(set(map(repr, model.requests[:4]))) == 4
    assert [t[0] for t in trail(eng, task_id)][:3] == ["demote", "demote", "demote"]
    assert [e.data["turn"].get("demoted") for e in eng.history(task_id)[1:4]] == [
        "openai:scripted:plain:strict_schema",
        "openai:scripted:plain:native_schema",
        "openai:scripted:plain:named_tool",
    ]
    assert eng.load(task_id).visit["repairs"] == 1  # only the bad answer spent one


def test_error_inside_the_provider_is_a_provider_error_state_not_a_repair(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    task = run(eng, task_id, ScriptedModel([{"error": {"status": 404, "message": "upstream exploded"}}]))
    assert task.state == "deciding~provider_error" and task.status == "blocked"
    event = eng.history(task_id)[-1]
    assert (event.trigger, event.data["turn"]["code"]) == ("provider_error", "PROVIDER_ERROR")
    # The provider's own words are kept (masked and capped: issue #30), where the turn's code is; never as a repair.
    assert event.data["turn"]["provider_message"] == "upstream exploded"
    assert undeclared([event]) == []
    assert task.visit.get("repairs", 0) == 0


def test_retryable_errors_back_off_inside_their_own_budget(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    rate = {"error": {"status": 429, "message": "rate limit"}}
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    model = ScriptedModel([rate, rate, call("decide", ticket_id="T-1", decision="RESOLVE", reason="fixed")])
    runner = AgentRunner(eng, model, retry=RetryPolicy(attempts=3, base_delay=0.01, sleep=sleep))
    task = runner.step(eng.load(task_id))
    assert task.state == "decided" and len(slept) == 2
    assert eng.history(task_id)[-1].data["turn"]["attempts"] == 3
    assert undeclared(eng.history(task_id)) == []
    # Past the in-process budget it is a durable backoff with the retryable code (issue #30), still no repair spent.
    task_id = eng.start("triage", TICKET, actor="ann")
    task = AgentRunner(eng, ScriptedModel([rate] * 5), retry=NO_SLEEP).step(eng.load(task_id))
    last = eng.history(task_id)[-1]
    assert (task.state, last.trigger, last.data["turn"]["code"]) == ("deciding", "backoff", "RATE_LIMITED")
    assert task.visit.get("repairs", 0) == 0


def test_running_out_of_script_is_empty_response(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    task = eng.step(task_id, model=ScriptedModel([]))
    assert eng.history(task_id)[-1].data["turn"]["code"] == "EMPTY_RESPONSE"
    assert task.state == "deciding~provider_error"


def test_reminders_mark_each_change_of_mode_and_are_never_deleted(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    shape = {"error": {"status": 400, "message": "tool_choice required is not supported"}}
    model = ScriptedModel([{"text": "hmm"}, shape, {"text": "still"}, {"text": "no"}], profile="anthropic")
    run(eng, task_id, model, turns=4)
    requests = model.requests
    for before, after in itertools.pairwise(requests):
        assert after.messages[: len(before.messages)] == before.messages, "history was rewritten"
    reminders = [m.content for m in requests[-1].messages if "<system-reminder>" in m.content]
    # required (tools: no reminder at first); prose restates it; auto_reminder after the demotion gets its own;
    # prose again moves down to json_instructions, which gets the structured one. One per mode, one per restatement.
    assert len(reminders) == 3
    assert "Use the tools again" in reminders[0] and "Call exactly one of these tools" in reminders[1]
    assert "only one JSON object" in reminders[2]
    assert [r.tool_choice for r in requests] == ["required", "required", "auto", None]


def test_a_resumed_task_rebuilds_the_same_conversation_without_calling_the_model_again(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    first = ScriptedModel([{"text": "no"}, {"text": "no"}], profile="anthropic")
    run(eng, task_id, first, turns=2)
    # Another engine (a restarted process) over the same log: nothing but the log carries the conversation.
    with Engine(store=eng.store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as other:
        resumed = ScriptedModel([call("give_up")], profile="anthropic")
        task = AgentRunner(other, resumed, retry=NO_SLEEP).step(other.load(task_id))
    assert task.state == "rejected"
    assert len(resumed.requests) == 1
    expected_prefix = first.requests[-1].messages
    assert resumed.requests[0].messages[: len(expected_prefix)] == expected_prefix


#: (profile, answer, code, whether it ignored the rung). The openai profile's first rung is native_schema
#: (structured); anthropic's for refund is required (tools).
COMPLIANCE = [
    ("anthropic", {"text": "I would refund."}, "NO_ACTION", True),
    ("anthropic", call("fly_to_the_moon"), "ACTION_UNKNOWN", True),
    ("anthropic", call("approve"), "ACTION_NOT_ALLOWED", True),
    ("anthropic", {"tool_calls": [{"name": "note", "arguments": "{not json"}]}, "OUTPUT_NOT_JSON", True),
    ("openai", {"text": "I would refund."}, "OUTPUT_NOT_JSON", True),
    ("openai", {"json": {"refund": 300}}, "OUTPUT_SCHEMA_INVALID", True),  # JSON that ignores the envelope
    # Compliant but wrong: repaired on the same rung, no escalation.
    ("anthropic", call("propose", amount=5), "OUTPUT_SCHEMA_INVALID", False),
    ("anthropic", call("propose", amount=900, reason="x"), "DOMAIN_INVALID", False),
    ("anthropic", {"tool_calls": [call("note", note="a")["tool_calls"][0]] * 2}, "MULTIPLE_ACTIONS", False),
]


@pytest.mark.parametrize(("profile", "answer", "code", "ignored"), COMPLIANCE)
def test_only_an_answer_that_ignored_its_rung_escalates(
    eng: Engine, profile: str, answer: dict[str, Any], code: str, ignored: bool
) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    model = ScriptedModel([answer, {"text": "again"}], profile=profile)
    run(eng, task_id, model, turns=2)
    first = eng.history(task_id)[1].data["turn"]
    assert (first["code"], "escalated" in first) == (code, ignored)
    if ignored:
        assert first["escalated"]["why"] == code and first["escalated"]["step"] == "reminder"
        # The restatement is the last message of that turn, so the next request carries it.
        assert model.requests[1].messages[-1].content == first["messages"][-1]["content"]
        assert "<system-reminder>" in first["messages"][-1]["content"]
    else:
        assert not any("<system-reminder>" in m["content"] for m in first["messages"])


@pytest.mark.parametrize("profile", [p.name for p in BUILTIN_PROFILES])
@pytest.mark.parametrize("thinking", [False, True])
def test_escalation_never_climbs_back_and_never_exceeds_the_budget(eng: Engine, profile: str, thinking: bool) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    model = ScriptedModel([{"text": "no"}] * 10, profile=profile)
    task = run(eng, task_id, model, thinking=thinking)
    assert task.state == "assessing~handoff" and len(model.requests) == 4  # max_repairs 3: four attempts
    turns = [e.data["turn"] for e in eng.history(task_id)[1:]]
    ranks = [RANK[Rung(t["strategy"])] for t in turns]
    assert ranks == sorted(ranks), "a visit only moves down the ladder"
    assert all("escalated" in t for t in turns[:-1]) and "escalated" not in turns[-1]  # the hand-off has no next
    # What `railyard providers` and docs/providers.md show is what the runner does.
    shown = escalation_path(load_profiles()[profile], thinking, n_actions=3)
    assert [t["strategy"] for t in turns] == [attempt.removesuffix("+reminder") for attempt in shown]
    assert [t["escalated"]["step"] for t in turns[:-1]] == [
        "reminder" if attempt.endswith("+reminder") else "rung" for attempt in shown[1:]
    ]


def test_a_resumed_task_escalates_from_where_its_log_left_it(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    run(eng, task_id, ScriptedModel([{"text": "no"}, {"text": "no"}], profile="anthropic"), turns=2)
    # A restarted process: the rung escalation reached comes from the log, not from memory.
    with Engine(store=eng.store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as other:
        resumed = ScriptedModel([call("give_up")], profile="anthropic")
        AgentRunner(other, resumed, retry=NO_SLEEP).step(other.load(task_id))
    assert resumed.requests[0].tool_choice == "auto"  # auto_reminder, where the second prose answer moved it
    assert [t[2] for t in trail(eng, task_id)] == ["required", "required", "auto_reminder"]


def test_the_rung_that_worked_is_where_the_tasks_next_visit_starts_even_after_a_restart(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    # Prose twice moves the visit to auto_reminder, where `note` works: it re-enters `assessing`, a new visit.
    first = ScriptedModel([{"text": "no"}, {"text": "no"}, call("note", note="checked")], profile="anthropic")
    run(eng, task_id, first, turns=3)
    assert eng.history(task_id)[-1].data["turn"]["worked"] == "anthropic:scripted:plain:auto_reminder"
    with Engine(store=eng.store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as other:
        resumed = ScriptedModel([call("give_up")], profile="anthropic")
        fresh = AgentRunner(other, resumed, retry=NO_SLEEP)
        assert fresh.memory.worked_rungs == set()  # a new process remembers nothing: the log does
        fresh.step(other.load(task_id))
    assert [r.tool_choice for r in resumed.requests] == ["auto"]


@pytest.mark.parametrize("profile", [p.name for p in BUILTIN_PROFILES])
@pytest.mark.parametrize("thinking", [False, True])
def test_no_profile_is_sent_a_tool_choice_it_rejects(eng: Engine, profile: str, thinking: bool) -> None:
    for workflow, payload in (("triage", TICKET), ("refund", ORDER)):
        task_id = eng.start(workflow, payload, actor="ann")
        model = ScriptedModel([{"text": "?"}], profile=profile)
        eng.step(task_id, model=model, thinking=thinking)
        request: ModelRequest = model.requests[0]
        allowed = load_profiles()[profile].tool_choices(thinking)
        if request.tool_choice is None:
            assert not request.tools or "auto" not in allowed  # the field is omitted only where it is refused
        elif request.tool_choice in ("auto", "none", "required"):
            assert request.tool_choice in allowed
        else:
            assert "named" in allowed
        assert request.thinking is thinking


def test_glm_gets_auto_and_minimax_gets_no_tool_choice(eng: Engine) -> None:
    for profile, expected in (("glm", "auto"), ("minimax", None)):
        task_id = eng.start("refund", ORDER, actor="ann", version=1)
        model = ScriptedModel([{"text": "?"}], profile=profile)
        eng.step(task_id, model=model, thinking=True)
        assert model.requests[0].tool_choice == expected
        assert [t.name for t in model.requests[0].tools] == ["propose", "give_up", "note"]
        assert "<system-reminder>" in model.requests[0].messages[-1].content


def test_the_model_never_sees_a_tool_outside_the_allowed_set(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    model = ScriptedModel([{"text": "?"}], profile="deepseek")
    eng.step(task_id, model=model)
    assert [t.name for t in model.requests[0].tools] == ["propose", "give_up", "note"]


def test_ladder_order_per_profile() -> None:
    profiles = load_profiles()
    assert ladder(profiles["openai"], False, 1)[:3] == [Rung.NATIVE_SCHEMA, Rung.NAMED_TOOL, Rung.REQUIRED]
    assert ladder(profiles["anthropic"], True, 1) == [Rung.AUTO_REMINDER, Rung.JSON_INSTRUCTIONS]
    assert ladder(profiles["deepseek"], True, 2) == [Rung.AUTO_REMINDER, Rung.JSON_INSTRUCTIONS]
    assert ladder(profiles["deepseek"], False, 2) == [Rung.REQUIRED, Rung.AUTO_REMINDER, Rung.JSON_INSTRUCTIONS]


def test_profiles_can_be_overridden_and_added(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text(
        '[profiles.anthropic]\nnative_schema = "strict"\n\n[profiles.gateway]\nwire = "openai"\n'
        'models = ["gw-*"]\ntool_choice_thinking_off = ["auto"]\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(path))
    profiles = load_profiles()
    assert profiles["anthropic"].native_schema == "strict"
    assert profiles["gateway"].tool_choices(False) == frozenset({"auto"})
    path.write_text(
        '[profiles.gateway]\nwire = "openai"\nmodels = ["gw-*"]\nreminder_role = "system"\nescalation = ["rung"]\n'
        'always_thinking = ["gw-r*"]\nthinking_on = { reasoning_effort = "high" }\n',
        encoding="utf-8",
    )
    gateway = load_profiles()["gateway"]
    assert (gateway.reminder_role, gateway.escalation) == ("system", ("rung",))
    assert gateway.thinks("gw-r1", False) and not gateway.thinks("gw-chat", False)
    assert gateway.thinking_switch("gw-chat", True) == {"reasoning_effort": "high"}
    assert gateway.thinking_switch("gw-chat", False) == {}
    path.write_text("[profiles.anthropic]\nnot_a_setting = 1\n", encoding="utf-8")
    with pytest.raises(RailyardError) as caught:
        load_profiles()
    assert caught.value.code is Code.CONFIG_INVALID


def test_step_outside_an_agent_state_is_refused(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    eng.step(task_id, model=ScriptedModel([call("propose", amount=300, reason="x")], profile="anthropic"))
    with pytest.raises(RailyardError) as caught:
        eng.step(task_id, model=ScriptedModel([]))
    assert caught.value.code is Code.STATE_NOT_AGENT


def test_step_without_a_model_says_how_to_configure_one(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAILYARD_MODEL", raising=False)
    task_id = eng.start("triage", TICKET, actor="ann")
    with pytest.raises(RailyardError) as caught:
        eng.step(task_id)
    assert caught.value.code is Code.MODEL_NOT_CONFIGURED
    assert len(eng.history(task_id)) == 1


# -- arbitrary model output ---------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engine.core.model_errors import PROVIDER_CODES  # noqa: E402
from engine.core.proposal import REPAIRABLE  # noqa: E402

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
names = st.sampled_from(
    [
        "propose",
        "give_up",
        "note",
        "approve",
        "cancel",
        "succeeded",
        "repair",
        "retry",
        "hand_off",
        "",
        "x" * 300,
        "pro\x00pose",
    ]
)
arguments = st.one_of(
    st.fixed_dictionaries({"amount": st.integers(-10, 1000), "reason": st.text(max_size=400)}),
    st.fixed_dictionaries({"note": st.text(max_size=50)}),
    st.dictionaries(
        st.sampled_from(["amount", "reason", "note", "customer", "actor", "role", "tenant", "zzz"]),
        json_values,
        max_size=4,
    ),
    json_values,
)
tool_call = st.builds(
    lambda n, a, raw: {"name": n, "arguments": raw if raw is not None else a},
    names,
    arguments,
    st.none() | st.text(max_size=40) | st.just("\x1b[31m" + "A" * 10_000),
)
turns = st.one_of(
    st.builds(lambda calls: {"tool_calls": calls}, st.lists(tool_call, min_size=0, max_size=3)),
    st.builds(lambda t: {"text": t}, st.text(max_size=200) | st.just("{" * 5000)),
    st.builds(lambda j: {"json": j}, json_values | st.fixed_dictionaries({"action": names, "arguments": arguments})),
    st.builds(
        lambda s, m: {"error": {"status": s, "message": m}},
        st.sampled_from([400, 401, 408, 429, 500, 503]),
        st.sampled_from(["bad", "tool_choice unsupported", "context length exceeded", "rate limit", ""]),
    ),
)

CLOSED = REPAIRABLE | PROVIDER_CODES | {Code.IDENTITY_OVERRIDE, Code.REPAIRS_EXHAUSTED, Code.FORBIDDEN}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turn=turns,
    profile=st.sampled_from([p.name for p in BUILTIN_PROFILES]),
    thinking=st.booleans(),
    repairs=st.integers(0, 3),
)
def test_any_model_output_is_exactly_one_allowed_event_with_a_closed_code(
    eng: Engine, turn: dict[str, Any], profile: str, thinking: bool, repairs: int
) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    if repairs:  # enter the step in the middle of a repair visit
        AgentRunner(eng, ScriptedModel([{"text": "?"}] * repairs, profile="anthropic"), retry=NO_SLEEP).run(
            eng.load(task_id), max_turns=repairs
        )
    before = eng.load(task_id)
    definition = eng.definition_of(before)
    task = AgentRunner(eng, ScriptedModel([turn], profile=profile), thinking=thinking, retry=NO_SLEEP).step(before)
    events = eng.history(task_id)
    assert len(events) == before.seq + 1, "exactly one event per model turn"
    event = events[-1]
    assert event.trigger in definition.triggers(before.state, system=True)
    assert event.to_state in definition.machine.destinations(before.state, event.trigger)
    code = event.data["turn"]["code"]
    assert code is None or Code[code] in CLOSED
    if code is None:
        assert event.trigger in ("propose", "give_up", "note")
    assert task.seq == event.seq


def test_the_repair_budget_is_per_state(eng: Engine) -> None:
    """triage's agent state allows 2 repairs: the third bad answer hands off."""
    task_id = eng.start("triage", TICKET, actor="ann")
    other_ticket = call("decide", ticket_id="T-2", decision="RESOLVE", reason="wrong ticket")
    task = run(eng, task_id, ScriptedModel([other_ticket] * 5, profile="anthropic"))
    assert [t[0] for t in trail(eng, task_id)] == ["repair", "repair", "hand_off"]
    assert [t[3] for t in trail(eng, task_id)] == ["DOMAIN_INVALID", "DOMAIN_INVALID", "REPAIRS_EXHAUSTED"]
    assert task.state == "deciding~handoff"


def test_a_risky_proposal_is_routed_to_review_not_refused(eng: Engine) -> None:
    task_id = eng.start("triage", TICKET, actor="ann")
    task = eng.step(
        task_id,
        model=ScriptedModel(
            [call("decide", ticket_id="T-1", decision="ESCALATE", reason="angry VIP")], profile="anthropic"
        ),
    )
    assert task.state == "escalation_review" and task.status == "blocked"
    event = eng.history(task_id)[-1]
    assert event.trigger == "decide" and event.data["risk"]["reason"] == "escalations are reviewed by a human"
    assert eng.definition_of(task).machine.destinations("deciding", "decide") == ["decided", "escalation_review"]
    eng.fire(task_id, "confirm", actor="dana")
    assert eng.get(task_id).state == "decided"


def test_sensitive_fields_never_reach_the_log() -> None:
    from pydantic import BaseModel, ConfigDict, Field

    from engine import Action, Agent, Terminal, Workflow

    class Card(BaseModel):
        model_config = ConfigDict(extra="forbid")
        last4: str = Field(pattern=r"^\d{4}$")
        pan: str = Field(pattern=r"^\d{16}$", json_schema_extra={"sensitive": True})

    flow = Workflow(
        name="cards",
        version=1,
        states=[Agent("collecting", actions=[Action("store_card", "done", Card)]), Terminal("done")],
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )
    secret = "4111111111111111"
    with Engine(store=MemoryStore(), registry=Registry([flow])) as eng:
        task_id = eng.start("cards", actor="ann")
        model = ScriptedModel(
            [
                call("store_card", last4="11", pan=secret),  # invalid: recorded for the repair
                call("store_card", last4="1111", pan=secret),
            ],
            profile="anthropic",
        )
        task = eng.run(task_id, model=model)
        assert task.state == "done"
        log = json.dumps([e.to_dict() for e in eng.history(task_id)])
        assert eng.history(task_id)[-1].data["args"] == {"last4": "1111", "pan": "[redacted]"}
    assert secret not in log


def test_a_refused_shape_is_remembered_for_the_next_task_too(eng: Engine) -> None:
    refusal = {"error": {"status": 400, "message": "Thinking mode does not support this tool_choice"}}
    answer = call("decide", ticket_id="T-1", decision="RESOLVE", reason="ok")
    model = ScriptedModel([refusal, answer, answer], profile="qwen")
    runner = AgentRunner(eng, model, retry=NO_SLEEP)  # one process's runner, and its ladder's memory
    first = eng.start("triage", TICKET, actor="ann")
    runner.run(eng.load(first))
    second = eng.start("triage", TICKET, actor="ann")
    assert runner.run(eng.load(second)).state == "decided"
    # The forced class is ruled out at once, for the next task too: neither the named tool nor `required`.
    assert [r.tool_choice for r in model.requests] == ["decide", "auto", "auto"]


def test_a_well_formed_envelope_with_a_bad_value_is_repaired_on_the_same_rung(eng: Engine) -> None:
    """The structured rung was obeyed: a wrong amount is an ordinary mistake, not a reason to leave native_schema."""
    bad = {"json": {"action": "propose", "arguments": {"amount": 0, "reason": "damaged"}}}
    good = {"json": {"action": "propose", "arguments": {"amount": 30, "reason": "damaged"}}}
    task_id = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    run(eng, task_id, ScriptedModel([bad, bad, good], profile="openai"), turns=3)
    turns = [e.data["turn"] for e in eng.history(task_id)[1:4]]
    assert [(t["strategy"], t["code"]) for t in turns] == [
        ("native_schema", "OUTPUT_SCHEMA_INVALID"),
        ("native_schema", "OUTPUT_SCHEMA_INVALID"),
        ("native_schema", None),
    ]
    assert not any("escalated" in t or "worked" in t for t in turns)
    # An answer that is not the envelope at all did ignore the rung: that one escalates.
    other = eng.start("refund", {"customer": "c1", "balance": 500}, actor="ann")
    run(eng, other, ScriptedModel([{"json": {"amount": 30}}, good], profile="openai"), turns=2)
    assert eng.history(other)[1].data["turn"]["escalated"]["why"] == "OUTPUT_SCHEMA_INVALID"


def test_the_engines_runners_hand_the_ladders_memory_on_to_the_next_adapter(eng: Engine) -> None:
    """`Engine.step` and `Engine.run` keep one runner per process; a new adapter (of the same model, as each
    `railyard run` opens one) gets a runner that starts with what the last one learned."""
    refusal = {"error": {"status": 400, "message": "Thinking mode does not support this tool_choice"}}
    answer = call("decide", ticket_id="T-1", decision="RESOLVE", reason="ok")
    first, earlier = eng.start("triage", TICKET, actor="ann"), ScriptedModel([refusal, answer], profile="qwen")
    eng.step(first, model=earlier)  # refused: demoted
    assert eng.step(first, model=earlier).state == "decided"  # answered without the shape: the refusal was its
    later = ScriptedModel([answer], profile="qwen")
    second = eng.start("triage", TICKET, actor="ann")
    assert eng.step(second, model=later).state == "decided"
    assert [r.tool_choice for r in later.requests] == ["auto"]  # the forced class was ruled out for it too
