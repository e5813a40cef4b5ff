"""How a provider is called, set without Python: the profiles file, the environment, the command line.

Each test drives the real `railyard` commands (CliRunner) against the local
provider server, through the official SDKs, and reads what went on the wire or
what the log recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine.cli import app
from tests.support.provider_server import (
    ProviderServer,
    Reply,
    anthropic_event,
    anthropic_message,
    anthropic_stream,
    anthropic_stream_of,
    openai_chunk,
    openai_completion,
    openai_stream,
    tool_use_block,
)

runner = CliRunner()
DECISION = {"ticket_id": "T-1", "decision": "RESOLVE", "reason": "fixed"}
ANSWER = openai_completion(tool_calls=(("c1", "decide", json.dumps(DECISION)),), finish_reason="tool_calls")
HUNG = Reply(delay=600, body={})  # answers only when the server closes: a provider that never answers


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def server(shared_server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ProviderServer:
    shared_server.reset()
    monkeypatch.setenv("RAILYARD_DATABASE_URL", f"sqlite:///{tmp_path / 'settings.db'}")
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    monkeypatch.setenv("OPENAI_BASE_URL", shared_server.openai_base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", shared_server.anthropic_base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    for name in ("RAILYARD_PROFILES_FILE", "RAILYARD_MODEL", "RAILYARD_MODEL_TIMEOUT", "RAILYARD_MODEL_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RAILYARD_MODEL_STREAM", raising=False)
    monkeypatch.delenv("RAILYARD_MODEL_EXTRA_BODY", raising=False)
    monkeypatch.delenv("RAILYARD_MODEL_THINKING", raising=False)
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    return shared_server


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def start_ticket() -> str:
    code, out, err = invoke("start", "triage", "--input", '{"ticket_id": "T-1"}', "--as", "ann")
    assert code == 0, err
    return out.strip()


def history(task_id: str) -> list[dict[str, Any]]:
    code, out, _ = invoke("history", task_id, "--json")
    assert code == 0
    events: list[dict[str, Any]] = json.loads(out)
    return events


def profiles_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    path = tmp_path / "profiles.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(path))


def test_a_hung_provider_with_a_timeout_from_the_environment_ends_within_the_retry_budget(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.reply(HUNG, HUNG, HUNG)
    monkeypatch.setenv("RAILYARD_MODEL_TIMEOUT", "2")
    monkeypatch.setenv("RAILYARD_MODEL_RETRIES", "1")
    task_id = start_ticket()
    began = time.monotonic()
    code, out, err = invoke("run", task_id, "--model", "openai:gpt-4.1", "--json")
    took = time.monotonic() - began
    assert code == 0, err
    # Two calls of 2 s and one backoff of at most 1 s (0.5 s doubled, jittered), not 3 x 60 s.
    assert 4.0 <= took < 8.0
    assert len(server.requests) == 2
    event = json.loads(out)["events"][-1]
    # Then the wait is durable (issue #30): the task stays put until its next call is due, nobody sleeps.
    assert (event["trigger"], event["to_state"]) == ("backoff", "deciding")
    assert json.loads(out)["task"]["next_try_at"] == event["data"]["retry"]["due_at"]
    turn = event["data"]["turn"]
    assert (turn["code"], turn["attempts"]) == ("PROVIDER_TIMEOUT", 2)
    assert 4.0 <= turn["seconds"] <= took
    assert history(task_id)[-1]["data"]["turn"] == turn


MESSAGE_START = anthropic_event(
    "message_start",
    message={
        "id": "m1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    },
)
#: A chunk every 0.6 s for over 6 s: each read is well inside a 1.5 s timeout, the call is not.
TRICKLES = {
    "openai:gpt-4.1": openai_stream(
        *(openai_chunk({"content": ""}) for _ in range(10)),
        openai_chunk({"content": "hi"}, finish_reason="stop"),
        event_delay=0.6,
    ),
    "anthropic:claude-sonnet-4-5": anthropic_stream(
        MESSAGE_START,
        anthropic_event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        *(
            anthropic_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "."})
            for _ in range(10)
        ),
        anthropic_event("message_stop"),
        event_delay=0.6,
    ),
}


@pytest.mark.parametrize("model", sorted(TRICKLES))
def test_a_stream_that_trickles_is_cut_at_the_calls_deadline_not_left_to_run(
    server: ProviderServer, model: str
) -> None:
    server.reply(TRICKLES[model])
    task_id = start_ticket()
    began = time.monotonic()
    code, _, err = invoke("run", task_id, "--model", model, "--stream", "--timeout", "1.5", "--retries", "0")
    took = time.monotonic() - began
    assert code == 0, err
    turn = history(task_id)[-1]["data"]["turn"]
    assert (turn["code"], turn["attempts"]) == ("PROVIDER_TIMEOUT", 1)
    # Cut at the first chunk after 1.5 s (a read itself waits at most 1.5 s): under 2 x timeout, not 6.6 s.
    assert 1.5 <= turn["seconds"] < 3.0 and took < 6.0
    assert len(server.requests) == 1


def test_a_provider_error_that_is_not_retried_records_one_attempt_and_its_time(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.reply(Reply(status=404, body={"error": {"message": "no such model", "code": "model_not_found"}}))
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1")
    assert code == 0, err
    turn = history(task_id)[-1]["data"]["turn"]
    assert (turn["code"], turn["attempts"]) == ("PROVIDER_ERROR", 1)
    assert 0 <= turn["seconds"] < 5


def test_settings_layer_cli_over_environment_over_profiles_file_over_default(
    server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiles_file(
        tmp_path,
        monkeypatch,
        '[profiles.openai]\ntimeout_seconds = 30\nstream = true\nextra_body = { source = "file" }\n',
    )
    monkeypatch.setenv("RAILYARD_MODEL_EXTRA_BODY", '{"source": "env", "seed": 7}')
    code, out, err = invoke("providers", "--json")
    assert code == 0, err
    openai_row = next(row for row in json.loads(out) if row["name"] == "openai")
    assert openai_row["settings"] == {
        "timeout_seconds": 30.0,
        "retries": 2,
        "stream": True,
        "extra_body": {"source": "env", "seed": 7},
    }
    assert openai_row["settings_from"] == {
        "timeout_seconds": "profiles_file",
        "retries": "default",
        "stream": "profiles_file",
        "extra_body": "env",
    }
    code, out_text, _ = invoke("providers")
    assert code == 0 and "How models are called" in out_text and "30 s" in out_text
    # Another profile is untouched by the file's [profiles.openai], but the environment reaches it.
    glm = next(row for row in json.loads(out) if row["name"] == "glm")
    assert (glm["settings"]["stream"], glm["settings_from"]["extra_body"]) == (False, "env")

    # The command line beats both: --no-stream over the file, --extra-body over the environment.
    server.reply(ANSWER)
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1", "--no-stream", "--extra-body", '{"seed": 1}')
    assert code == 0, err
    body = server.last_body
    assert "stream" not in body and body["seed"] == 1 and "source" not in body
    assert history(task_id)[-1]["trigger"] == "decide"

    # Without the options, the file's stream and the environment's extra body are what is sent.
    server.reply(Reply(events=ANSWER_STREAM))
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1")
    assert code == 0, err
    body = server.last_body
    assert body["stream"] is True and (body["source"], body["seed"]) == ("env", 7)
    assert history(task_id)[-1]["trigger"] == "decide"


def _answer_stream() -> tuple[tuple[str | None, str], ...]:
    from tests.support.provider_server import openai_chunk

    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "decide", "arguments": json.dumps(DECISION)},
    }
    return (
        (None, openai_chunk({"role": "assistant", "tool_calls": [call]})),
        (None, openai_chunk({}, finish_reason="tool_calls")),
        (None, "[DONE]"),
    )


ANSWER_STREAM = _answer_stream()


def test_anthropic_is_reached_through_anthropic_base_url_with_the_settings(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILYARD_MODEL_STREAM", "true")
    server.reply(anthropic_stream_of(tool_use_block("tu_1", "decide", DECISION), stop_reason="tool_use"))
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "anthropic:claude-test-model", "--extra-body", '{"top_k": 5}')
    assert code == 0, err
    assert server.requests[-1].path == "/v1/messages"
    assert (server.last_body["stream"], server.last_body["top_k"]) == (True, 5)
    assert history(task_id)[-1]["trigger"] == "decide"
    # Off again from the command line.
    server.reply(anthropic_message(tool_use_block("tu_2", "decide", DECISION), stop_reason="tool_use"))
    task_id = start_ticket()
    assert invoke("run", task_id, "--model", "anthropic:claude-test-model", "--no-stream")[0] == 0
    assert "stream" not in server.last_body


def test_a_worker_takes_the_settings_from_its_options(server: ProviderServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILYARD_MODEL_TIMEOUT", "30")  # the option beats it
    server.reply(HUNG, HUNG)
    task_id = start_ticket()
    began = time.monotonic()
    code, _, err = invoke(
        "worker", "--once", "--model", "openai:gpt-4.1", "--timeout", "1", "--retries", "0", "--workflows", "triage"
    )
    assert code == 0, err
    assert time.monotonic() - began < 5
    turn = history(task_id)[-1]["data"]["turn"]
    assert (turn["code"], turn["attempts"]) == ("PROVIDER_TIMEOUT", 1)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RAILYARD_MODEL_TIMEOUT", "soon"),
        ("RAILYARD_MODEL_TIMEOUT", "0"),
        ("RAILYARD_MODEL_RETRIES", "-1"),
        ("RAILYARD_MODEL_RETRIES", "2.5"),
        ("RAILYARD_MODEL_STREAM", "maybe"),
        ("RAILYARD_MODEL_EXTRA_BODY", "[1, 2]"),
        ("RAILYARD_MODEL_EXTRA_BODY", "{not json"),
    ],
)
def test_a_bad_setting_in_the_environment_is_refused_and_the_log_is_unchanged(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    task_id = start_ticket()
    monkeypatch.setenv(variable, value)
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1")
    assert code == 2 and err.startswith("CONFIG_INVALID") and variable in err
    assert invoke("providers")[0] == 2
    assert len(history(task_id)) == 1 and server.requests == []


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--timeout", "0"], "timeout_seconds"),
        (["--timeout", "nan"], "timeout_seconds"),
        (["--retries", "99"], "retries"),
    ],
)
def test_a_bad_setting_on_the_command_line_is_refused_and_the_log_is_unchanged(
    server: ProviderServer, options: list[str], needle: str
) -> None:
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1", *options)
    assert code == 2 and err.startswith("CONFIG_INVALID") and needle in err
    assert len(history(task_id)) == 1 and server.requests == []


def test_a_bad_extra_body_option_is_a_usage_error(server: ProviderServer) -> None:
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", "openai:gpt-4.1", "--extra-body", "[1]")
    assert code == 2 and "JSON object" in err
    assert len(history(task_id)) == 1


@pytest.mark.parametrize(
    "line", ["retries = -1", 'timeout_seconds = "fast"', "stream = 1", 'extra_body = "x"', "timeout = 5"]
)
def test_a_bad_setting_in_the_profiles_file_is_refused(
    server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str
) -> None:
    profiles_file(tmp_path, monkeypatch, f"[profiles.openai]\n{line}\n")
    task_id = start_ticket()
    code, _, err = invoke("providers")
    assert code == 2 and err.startswith("CONFIG_INVALID")
    assert invoke("run", task_id, "--model", "openai:gpt-4.1")[0] == 2
    assert len(history(task_id)) == 1 and server.requests == []


def test_settings_are_refused_for_a_model_that_calls_no_provider(server: ProviderServer, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"tool_calls": [{"name": "decide", "arguments": DECISION}]}]}))
    task_id = start_ticket()
    code, _, err = invoke("run", task_id, "--model", f"scripted:{script}", "--timeout", "5")
    assert code == 2 and err.startswith("CONFIG_INVALID")
    assert len(history(task_id)) == 1
    code, _, err = invoke("demo", "--timeout", "5")
    assert code == 2 and err.startswith("CONFIG_INVALID") and "--model" in err


def test_the_demo_calls_its_model_with_the_options_it_is_given(server: ProviderServer, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    server.reply(*([HUNG] * 6))
    exe = Path(sys.executable).with_name("railyard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    env["RAILYARD_MODEL_TIMEOUT"] = "30"  # the option beats it
    for command in (["db", "upgrade"], ["demo", "--model", "openai:gpt-4.1", "--timeout", "1", "--retries", "0"]):
        began = time.monotonic()
        done = subprocess.run([str(exe), *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    # The refund's, the ticket's and the ticket with a refund child's model turns each end after one call of 1 s,
    # not 30 s (or 60 s).
    assert "PROVIDER_TIMEOUT" in done.stdout
    assert time.monotonic() - began < 40
    assert len(server.requests) == 3  # each scenario's first model turn: one call each, no retry


def test_options_apply_to_the_model_named_by_railyard_model_too(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILYARD_MODEL", "openai:gpt-4.1")
    server.reply(HUNG, HUNG, HUNG)
    task_id = start_ticket()
    began = time.monotonic()
    code, _, err = invoke("run", task_id, "--timeout", "1", "--retries", "0")
    assert code == 0, err
    assert time.monotonic() - began < 5 and len(server.requests) == 1
    assert history(task_id)[-1]["data"]["turn"]["attempts"] == 1


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("openai:gpt-4.1", ["OPENAI_API_KEY"]),
        ("anthropic:claude-sonnet-4-5", ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"]),
    ],
)
def test_no_credentials_is_a_configuration_error_that_leaves_the_task_alone(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch, model: str, names: list[str]
) -> None:
    """With no credentials the SDK can find, every call would be refused; before, each task a run or a worker
    reached was moved to `~provider_error` (PROVIDER_AUTH, not retried) and had to be sent back by hand. Whether
    credentials resolve is the SDK's to say (keys, tokens, profiles, workload identity): the engine asks it."""
    for name in names:
        monkeypatch.delenv(name, raising=False)
    task_id = start_ticket()
    before = history(task_id)
    code, _, err = invoke("run", task_id, "--model", model)
    assert code == 2 and "MODEL_NOT_CONFIGURED" in err, err
    code, _, err = invoke("worker", "--once", "--model", model)  # claims it, leaves it for a worker with a key
    assert code == 0 and "config errors 1" in err, err
    assert history(task_id) == before
    assert server.requests == []
    monkeypatch.setenv(names[0], "test-key")  # the key set: the same task runs
    server.reply(
        ANSWER
        if model.startswith("openai")
        else anthropic_message(tool_use_block("t1", "decide", DECISION), stop_reason="tool_use")
    )
    code, _, err = invoke("run", task_id, "--model", model)
    assert code == 0, err
    assert history(task_id)[-1]["trigger"] == "decide"


def test_the_demo_stops_when_its_model_has_no_credentials(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`railyard demo --model openai:...` without a key: the first model step is MODEL_NOT_CONFIGURED and leaves
    the refund untouched, so the demo must stop there (exit 2). Going on, its third scenario's worker (serving every
    refund, with a silent scripted model) took up that untouched refund and wrote a provider_error by a model the
    user never chose into it (second attacker review)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, _, err = invoke("demo", "--model", "openai:gpt-4.1", "--timeout", "1", "--retries", "0")
    assert code == 2 and "MODEL_NOT_CONFIGURED" in err, err
    import os
    import sqlite3

    path = os.environ["RAILYARD_DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        actors = [row[0] for row in db.execute("SELECT actor FROM events")]
    assert actors and not [a for a in actors if a.startswith("model:")], actors  # only the starts: no model wrote
    assert server.requests == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[profile.openai]\nretries = 1\n", "unknown table 'profile' (did you mean 'profiles'?)"),
        ("retries = 1\n", "unknown table 'retries'"),
        (
            "[profiles.openai]\ntimout_seconds = 5\n",
            "unknown setting 'timout_seconds' (did you mean 'timeout_seconds'?)",
        ),
        ("[profiles]\nopenai = 3\n", "[profiles.NAME] must be tables of settings"),
    ],
)
def test_a_misspelt_table_or_setting_in_the_profiles_file_is_refused_with_the_closest_name(
    server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, needle: str
) -> None:
    """A table or key the file does not know is no longer ignored: a file that silently sets nothing is the
    mistake that costs a day."""
    profiles_file(tmp_path, monkeypatch, text)
    task_id = start_ticket()
    code, _, err = invoke("providers")
    assert code == 2 and err.startswith("CONFIG_INVALID") and needle in err, err
    assert invoke("run", task_id, "--model", "openai:gpt-4.1")[0] == 2
    assert len(history(task_id)) == 1 and server.requests == []


def test_a_worker_thinks_when_told_by_option_or_environment_and_the_option_wins(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.core.profiles import load_profiles

    on = load_profiles()["openai"].thinking_switch("gpt-4.1", True)
    assert on  # the switch the request carries when thinking is on
    switches = []
    for options, variable in (([], "true"), (["--no-thinking"], "true"), (["--thinking"], "false"), ([], None)):
        if variable is None:
            monkeypatch.delenv("RAILYARD_MODEL_THINKING", raising=False)
        else:
            monkeypatch.setenv("RAILYARD_MODEL_THINKING", variable)
        server.reply(ANSWER)
        task_id = start_ticket()
        worker = ("worker", "--once", "--model", "openai:gpt-4.1", "--workflows", "triage", *options)
        code, _, err = invoke(*worker)
        assert code == 0, err
        switches.append(history(task_id)[1]["data"]["turn"].get("thinking_switch", {}))
    assert switches == [on, {}, on, {}]


def test_a_bad_thinking_variable_is_refused_before_anything_runs(
    server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = start_ticket()
    monkeypatch.setenv("RAILYARD_MODEL_THINKING", "maybe")
    for command in (["run", task_id, "--model", "openai:gpt-4.1"], ["worker", "--once", "--model", "openai:gpt-4.1"]):
        code, _, err = invoke(*command)
        assert code == 2 and err.startswith("CONFIG_INVALID") and "RAILYARD_MODEL_THINKING" in err, command
    assert len(history(task_id)) == 1 and server.requests == []
