"""What model turns spend: the usage each turn records, the totals `railyard show` prints, and token budgets.

The providers are the local wire-format server driven through the official
SDKs; the budgets are the workflows' own (`tests/support/token_workflows.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine import Budgets, Code, DefinitionError, Engine, Registry, StaticRoles, Workflow, migrations
from engine.cli import app
from engine.providers.anthropic_adapter import AnthropicAdapter
from engine.providers.openai_adapter import OpenAIAdapter
from engine.providers.scripted import ScriptedModel
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.provider_server import (
    ProviderServer,
    Reply,
    anthropic_message,
    anthropic_stream_of,
    no_sleep,
    openai_chunk,
    openai_completion,
    openai_stream,
    tool_use_block,
)
from tests.support.sample_workflows import ROLES, TRIAGE, all_workflows
from tests.support.token_workflows import CAPPED, PER_STATE

NO_SLEEP = RetryPolicy(attempts=1, base_delay=0.0, sleep=no_sleep)
DECISION = {"ticket_id": "T-1", "decision": "RESOLVE", "reason": "fixed"}
TICKET = {"ticket_id": "T-1"}
runner = CliRunner()

#: What each wire reports, in its own words, and what a turn records of it.
OPENAI_USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
    "completion_tokens_details": {"reasoning_tokens": 12},
}
OPENAI_RECORDED = {"input_tokens": 120, "output_tokens": 30, "cached_tokens": 100, "reasoning_tokens": 12}
ANTHROPIC_USAGE = {"input_tokens": 100, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 5}
#: The whole prompt is the input (as OpenAI counts it); Anthropic reports no separate reasoning count.
ANTHROPIC_RECORDED = {"input_tokens": 125, "output_tokens": 30, "cached_tokens": 20}


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def server(shared_server: ProviderServer) -> ProviderServer:
    shared_server.reset()
    return shared_server


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path}/tokens.db"
    migrations.upgrade(url)
    registry = Registry([*all_workflows(), CAPPED, PER_STATE])
    # A snapshot every other event: replay then checks the token counters the fold keeps against stored ones.
    with Engine(url, registry, authoriser=StaticRoles(ROLES), snapshot_every=2) as engine:
        yield engine


#: What makes OpenAI itself report usage in a stream (`stream_options` is not sent unless asked: docs/providers.md).
INCLUDE_USAGE = {"stream_options": {"include_usage": True}}


def openai(server: ProviderServer, *, stream: bool = False, extra_body: dict[str, Any] | None = None) -> OpenAIAdapter:
    return OpenAIAdapter(
        "gpt-4.1", base_url=server.openai_base_url, api_key="test", stream=stream, timeout=5, extra_body=extra_body
    )


def anthropic(server: ProviderServer, *, stream: bool = False) -> AnthropicAdapter:
    return AnthropicAdapter("claude-test", base_url=server.anthropic_base_url, api_key="test", stream=stream, timeout=5)


def openai_answer(usage: dict[str, Any] | None, *, stream: bool = False, text: str | None = None) -> Reply:
    """A decision (or, with `text`, prose), reporting `usage`, as one body or as a stream."""
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "decide", "arguments": json.dumps(DECISION)},
    }
    if stream:
        delta = {"role": "assistant", "content": text} if text else {"role": "assistant", "tool_calls": [call]}
        chunks = [openai_chunk(delta), openai_chunk({}, finish_reason="stop" if text else "tool_calls")]
        if usage is not None:
            chunks.append(openai_chunk(None, usage=usage))  # the last chunk, as `include_usage` sends it
        return openai_stream(*chunks)
    if text:
        reply = openai_completion(text=text, usage=None)
    else:
        calls = (("c1", "decide", json.dumps(DECISION)),)
        reply = openai_completion(tool_calls=calls, finish_reason="tool_calls", usage=None)
    if usage is not None:
        reply.body["usage"] = usage
    return reply


def anthropic_answer(*, stream: bool) -> Reply:
    block = tool_use_block("tu_1", "decide", DECISION)
    if not stream:
        reply = anthropic_message(block, stop_reason="tool_use")
        reply.body["usage"] = {**ANTHROPIC_USAGE, "output_tokens": 30}
        return reply
    reply = anthropic_stream_of(block, stop_reason="tool_use", usage=(100, 30))
    assert reply.events is not None
    name, data = reply.events[0]  # message_start carries the prompt's counts, message_delta the answer's
    start = json.loads(data)
    start["message"]["usage"] = {**ANTHROPIC_USAGE, "output_tokens": 1}
    return Reply(events=((name, json.dumps(start)), *reply.events[1:]))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_each_turn_records_the_usage_its_provider_reported(
    eng: Engine, server: ProviderServer, wire: str, stream: bool
) -> None:
    if wire == "openai":
        server.reply(openai_answer(OPENAI_USAGE, stream=stream))
        adapter: Any = openai(server, stream=stream, extra_body=INCLUDE_USAGE if stream else None)
    else:
        server.reply(anthropic_answer(stream=stream))
        adapter = anthropic(server, stream=stream)
    task_id = eng.start("triage", TICKET, actor="ann")
    task = AgentRunner(eng, adapter, retry=NO_SLEEP).step(eng.load(task_id))
    assert task.state == "decided"
    turn = eng.history(task_id)[-1].data["turn"]
    assert turn["usage"] == (OPENAI_RECORDED if wire == "openai" else ANTHROPIC_RECORDED)
    if wire == "openai" and stream:
        assert server.last_body["stream_options"] == {"include_usage": True}
    assert "tokens" not in task.usage  # no token budget on triage: the fold keeps no counters (snapshots unchanged)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_turn_whose_provider_reports_no_usage_records_none_rather_than_zero(
    eng: Engine, server: ProviderServer, stream: bool
) -> None:
    server.reply(openai_answer(None, stream=stream))
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, openai(server, stream=stream), retry=NO_SLEEP).step(eng.load(task_id))
    assert "usage" not in eng.history(task_id)[-1].data["turn"]


def test_only_the_counts_reported_are_recorded(eng: Engine, server: ProviderServer) -> None:
    server.reply(openai_answer({"prompt_tokens": 9, "completion_tokens": 4}))  # no details: no cached, no reasoning
    task_id = eng.start("triage", TICKET, actor="ann")
    AgentRunner(eng, openai(server), retry=NO_SLEEP).step(eng.load(task_id))
    assert eng.history(task_id)[-1].data["turn"]["usage"] == {"input_tokens": 9, "output_tokens": 4}


def test_a_task_token_budget_stops_the_task_with_its_code(eng: Engine, server: ProviderServer) -> None:
    prose = {"prompt_tokens": 60, "completion_tokens": 10}
    server.reply(*(openai_answer(prose, text="Let me think.") for _ in range(4)))
    task_id = eng.start("capped", TICKET, actor="ann")
    task = eng.run(task_id, model=openai(server))
    # 70 tokens, then 140: the turn that crossed the cap is kept, the next one is never made.
    assert len(server.requests) == 2
    assert task.state == "limit_exceeded"
    last = eng.history(task_id)[-1]
    assert last.trigger == "limit"
    assert (last.data["code"], last.data["budget"], last.data["used"], last.data["limit"]) == (
        str(Code.AGENT_STEP_LIMIT_EXCEEDED),
        "tokens",
        140,
        100,
    )
    assert not eng.replay(task_id).findings


def test_a_state_token_budget_counts_each_agent_state_apart(eng: Engine, server: ProviderServer) -> None:
    spent = {"prompt_tokens": 60, "completion_tokens": 10}
    draft = openai_answer(spent)
    draft.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "draft"
    server.reply(draft, openai_answer(spent, text="Hmm."), openai_answer(spent, text="Hmm."), openai_answer(spent))
    task_id = eng.start("per_state", TICKET, actor="ann")
    task = eng.run(task_id, model=openai(server))
    # drafting spent 70 and moved on; reviewing's own 140 ran out its 100, though the task's 210 has no cap.
    assert task.state == "limit_exceeded" and len(server.requests) == 3
    last = eng.history(task_id)[-1].data
    assert (last["budget"], last["agent_state"], last["used"], last["limit"]) == ("state_tokens", "reviewing", 140, 100)
    assert (task.usage["tokens"], task.usage["state_tokens"]) == (210, {"drafting": 70, "reviewing": 140})
    assert not eng.replay(task_id).findings


def test_a_token_budget_must_be_a_positive_whole_number() -> None:
    for bad in (0, -5, 2.5, True):
        with pytest.raises(DefinitionError) as caught:
            Workflow(name="bad", version=1, states=TRIAGE.states[:3], budgets=Budgets(tokens=bad))  # type: ignore[arg-type]
        assert caught.value.code is Code.DEFINITION_INVALID
        assert any("budget tokens" in p for p in caught.value.problems)
    # Unset, the budgets' canonical content is what it was, so no published definition changes its digest.
    assert Budgets().spec() == {"model_turns": 50, "tool_calls": 25, "repeats": 3, "deadline_seconds": None}


def test_a_scripted_turn_can_report_usage(eng: Engine) -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "decide", "arguments": DECISION}], "usage": {"input_tokens": 5, "output_tokens": 2}}]
    )
    task_id = eng.start("triage", TICKET, actor="ann")
    eng.step(task_id, model=model)
    assert eng.history(task_id)[-1].data["turn"]["usage"] == {"input_tokens": 5, "output_tokens": 2}


# -- the command line ---------------------------------------------------------------------------------------------


@pytest.fixture
def cli(server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProviderServer:
    monkeypatch.setenv("RAILYARD_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.token_workflows,tests.support.sample_workflows")
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.delenv("RAILYARD_PROFILES_FILE", raising=False)
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    return server


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_run_stops_at_the_token_budget_and_show_prints_the_totals(cli: ProviderServer) -> None:
    prose = {"prompt_tokens": 60, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 40}}
    cli.reply(*(openai_answer(prose, text="Let me think.") for _ in range(3)))
    code, task_id, _ = invoke("start", "capped", "--input", json.dumps(TICKET), "--as", "ann")
    assert code == 0
    task_id = task_id.strip()
    code, out, err = invoke("run", task_id, "--model", "openai:gpt-4.1")
    assert code == 0, err
    assert "--limit--> limit_exceeded" in out and "AGENT_STEP_LIMIT_EXCEEDED" in out

    code, out, _ = invoke("show", task_id, "--json")
    assert code == 0
    assert json.loads(out)["tokens"] == {
        "input_tokens": 120,
        "output_tokens": 20,
        "cached_tokens": 80,
        "reasoning_tokens": 0,
        "total_tokens": 140,
        "turns": 2,
        "reported": 2,
    }
    code, out, _ = invoke("show", task_id)
    assert code == 0
    assert "140 (120 in, 80 of them cached; 20 out) over 2 model turns" in " ".join(out.split())
    # As of the first turn, the totals are that turn's.
    code, out, _ = invoke("show", task_id, "--as-of", "2", "--json")
    assert (json.loads(out)["tokens"]["total_tokens"], json.loads(out)["tokens"]["turns"]) == (70, 1)


def test_show_says_when_the_provider_reported_no_usage(cli: ProviderServer) -> None:
    cli.reply(openai_answer(None))
    code, task_id, _ = invoke("start", "triage", "--input", json.dumps(TICKET), "--as", "ann")
    task_id = task_id.strip()
    assert invoke("run", task_id, "--model", "openai:gpt-4.1")[0] == 0
    code, out, _ = invoke("show", task_id)
    assert code == 0 and "not reported by the provider (1 model turn)" in " ".join(out.split())
    code, task_id, _ = invoke("start", "triage", "--input", json.dumps(TICKET), "--as", "ann")
    code, out, _ = invoke("show", task_id.strip())
    assert code == 0 and "tokens" not in out  # no model turn yet: nothing to total


FAILED_ANSWERS = [
    # (wire, an answer that arrived and still failed, its code, what the turn records)
    ("openai", openai_completion(text="The answer is", finish_reason="length", usage=(5000, 4096)), "TRUNCATED", 9096),
    ("openai", openai_completion(text="", finish_reason="content_filter", usage=(80, 3)), "CONTENT_FILTERED", 83),
    ("openai", openai_completion(text="  ", usage=(70, 2)), "EMPTY_RESPONSE", 72),
    ("anthropic", anthropic_message(stop_reason="max_tokens", usage=(4000, 2048)), "TRUNCATED", 6048),
    ("anthropic", anthropic_message(stop_reason="refusal", usage=(90, 1)), "CONTENT_FILTERED", 91),
]


@pytest.mark.parametrize(("wire", "reply", "code", "tokens"), FAILED_ANSWERS)
def test_an_answer_that_failed_still_records_its_usage_and_counts_against_the_budget(
    eng: Engine, server: ProviderServer, wire: str, reply: Reply, code: str, tokens: int
) -> None:
    """The provider charged for a truncated, filtered or empty answer: the turn says so and the budget counts it."""
    server.reply(reply)
    task_id = eng.start("capped", TICKET, actor="ann")
    model = anthropic(server) if wire == "anthropic" else openai(server)
    task = AgentRunner(eng, model, retry=NO_SLEEP).step(eng.load(task_id))
    last = eng.history(task_id)[-1]
    assert (last.trigger, last.data["turn"]["code"]) == ("provider_error", code)
    usage = last.data["turn"]["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] == tokens
    assert task.usage["tokens"] == tokens  # over the workflow's 100: a retry would stop at the budget
    assert not eng.replay(task_id).findings
