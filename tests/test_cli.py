"""The `railyard` command line: commands, --json output and the exit-code contract (0, 1, 2, 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from tests.support.insider import tamper

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()
#: A workflow of the user's own: the reference `expense@1`, renamed.
OWN_WORKFLOW = (REPO / "workflows" / "expense.py").read_text(encoding="utf-8").replace('name="expense"', 'name="own"')


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\ndana = ["approver"]\nolga = ["operator"]\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_DATABASE_URL", url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows,workflows.expense")
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    yield url


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def start_refund(balance: int = 500) -> str:
    code, out, _ = invoke(
        "start", "refund", "--input", json.dumps({"customer": "c1", "balance": balance}), "--as", "ann"
    )
    assert code == 0, out
    return out.strip()


def test_workflows_lists_every_version(cli_env: str) -> None:
    code, out, _ = invoke("workflows", "--json")
    assert code == 0
    refs = {(w["workflow"], w["version"]) for w in json.loads(out)}
    assert {("refund", 1), ("refund", 2), ("counter", 1), ("expense", 1)} <= refs


def test_start_show_fire_history_cancel(cli_env: str) -> None:
    task_id = start_refund()
    code, out, _ = invoke("show", task_id, "--json")
    assert code == 0
    shown = json.loads(out)
    assert (shown["state"], shown["seq"], shown["version"]) == ("assessing", 1, 2)

    code, out, _ = invoke(
        "fire", task_id, "propose", "--payload", '{"amount": 300, "reason": "broken"}', "--as", "model", "--json"
    )
    assert code == 0 and json.loads(out)["state"] == "awaiting_approval"
    code, out, _ = invoke("fire", task_id, "approve", "--as", "dana")
    assert code == 0 and "executing" in out

    code, out, _ = invoke("cancel", task_id, "--as", "ann", "--reason", "customer called")
    assert code == 0 and "cancelled" in out
    code, out, _ = invoke("history", task_id, "--json")
    events = json.loads(out)
    assert [e["trigger"] for e in events] == ["start", "propose", "approve", "cancel"]
    assert events[1]["data"]["args"] == {"amount": 300, "reason": "broken"}
    assert all(len(e["hash"]) == 64 for e in events)
    code, out, _ = invoke("history", task_id)
    assert code == 0 and "propose" in out


def test_start_on_a_named_version(cli_env: str) -> None:
    code, out, _ = invoke(
        "start", "refund", "--version", "1", "--input", '{"customer": "c", "balance": 1}', "--as", "ann", "--json"
    )
    assert code == 0 and json.loads(out)["version"] == 1


@pytest.mark.parametrize(
    ("args", "code_text"),
    [
        (["start", "nope", "--as", "ann"], "WORKFLOW_UNKNOWN"),
        (["start", "refund", "--version", "9", "--as", "ann"], "VERSION_UNKNOWN"),
        (["start", "refund", "--input", '{"customer": "c"}', "--as", "ann"], "PAYLOAD_INVALID"),
        (["show", "missing-task"], "TASK_NOT_FOUND"),
        (["history", "missing-task", "--json"], "TASK_NOT_FOUND"),
        (["graph", "nope"], "WORKFLOW_UNKNOWN"),
    ],
)
def test_domain_refusals_exit_1_with_their_code(cli_env: str, args: list[str], code_text: str) -> None:
    code, _, err = invoke(*args)
    assert code == 1
    assert code_text in err


def test_refused_transitions_exit_1_and_leave_the_log_unchanged(cli_env: str) -> None:
    task_id = start_refund(balance=100)
    for args, code_text in [
        (["fire", task_id, "approve", "--as", "dana"], "TRIGGER_NOT_ALLOWED"),
        (["fire", task_id, "propose", "--payload", '{"amount": 500, "reason": "x"}', "--as", "m"], "DOMAIN_INVALID"),
        (["fire", task_id, "propose", "--payload", '{"amount": "x", "reason": "x"}', "--as", "m"], "PAYLOAD_INVALID"),
        (
            ["fire", task_id, "note", "--payload", '{"note": "x"}', "--as", "m", "--expected-seq", "7"],
            "CONCURRENCY_CONFLICT",
        ),
    ]:
        code, _, err = invoke(*args)
        assert (code, code_text in err) == (1, True), err
    assert json.loads(invoke("show", task_id, "--json")[1])["seq"] == 1


def test_role_comes_from_the_roles_file(cli_env: str) -> None:
    task_id = start_refund()
    assert invoke("fire", task_id, "propose", "--payload", '{"amount": 300, "reason": "x"}', "--as", "m")[0] == 0
    code, _, err = invoke("fire", task_id, "approve", "--as", "bob")
    assert code == 1 and "FORBIDDEN" in err
    assert invoke("fire", task_id, "approve", "--as", "dana")[0] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["start", "refund"],  # --as missing
        ["start", "refund", "--as", "ann", "--input", "{not json"],
        ["start", "refund", "--as", "ann", "--input", "[1, 2]"],
        ["graph", "refund", "--format", "png"],
        ["no-such-command"],
    ],
)
def test_usage_errors_exit_2(cli_env: str, args: list[str]) -> None:
    assert invoke(*args)[0] == 2


def test_a_tampered_log_exits_3(cli_env: str) -> None:
    task_id = start_refund()
    tamper(cli_env, "UPDATE tasks SET state = 'completed' WHERE task_id = :t", t=task_id)
    code, _, err = invoke("show", task_id)
    assert code == 3 and "STATE_MISMATCH" in err


def test_graph_prints_mermaid_and_dot(cli_env: str) -> None:
    code, out, _ = invoke("graph", "refund", "--version", "1")
    assert code == 0 and "stateDiagram-v2" in out and "assessing --> awaiting_approval: propose" in out
    code, out, _ = invoke("graph", "refund", "--format", "dot")
    assert code == 0 and out.startswith("digraph")


def test_the_installed_console_script_runs(tmp_path: Path) -> None:
    """`railyard db upgrade && railyard workflows` on the SQLite default, as a user types them.

    In a folder with no `workflows` package of the user's own, the registry is empty and says so: Railyard's
    reference workflows are not installed, so they are not served by default (this used to list `expense`).
    """
    exe = Path(sys.executable).with_name("railyard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    for command in (["db", "upgrade"], ["workflows"]):
        done = subprocess.run([str(exe), *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "railyard.db").exists()
    assert "expense" not in done.stdout and "no workflows registered" in done.stderr
    own = tmp_path / "workflows"
    own.mkdir()
    (own / "__init__.py").write_text(OWN_WORKFLOW, encoding="utf-8")
    listed = [str(exe), "workflows", "--json"]
    done = subprocess.run(listed, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # the user's own `workflows` package, by the RAILYARD_WORKFLOWS convention
    assert [w["workflow"] for w in json.loads(done.stdout)] == ["own"]


def test_demo_runs_on_a_fresh_database(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("railyard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_")}
    for command in (["db", "upgrade"], ["demo"]):
        done = subprocess.run([str(exe), *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert "DOMAIN_INVALID" in done.stdout and "APPROVAL_FORBIDDEN" in done.stdout
    assert "killed by SIGKILL" in done.stdout and "verified" in done.stdout and "railyard history" in done.stdout


def test_run_drives_an_agent_state_with_a_scripted_model(cli_env: str, tmp_path: Path) -> None:
    script = tmp_path / "model.json"
    script.write_text(
        json.dumps(
            {
                "profile": "anthropic",
                "turns": [
                    {"text": "Let me think."},
                    {"tool_calls": [{"name": "propose", "arguments": {"amount": 300, "reason": "broken on arrival"}}]},
                ],
            }
        ),
        encoding="utf-8",
    )
    task_id = start_refund()
    code, out, err = invoke("run", task_id, "--model", f"scripted:{script}", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["task"]["state"] == "awaiting_approval"
    assert [(e["trigger"], e["data"]["turn"]["code"]) for e in result["events"]] == [
        ("repair", "NO_ACTION"),
        ("propose", None),
    ]
    # Nothing to run once the task waits for a human: no model call, no event.
    code, out, _ = invoke("run", task_id, "--model", f"scripted:{script}", "--json")
    assert code == 0 and json.loads(out)["events"] == []


@pytest.mark.parametrize(
    "settings",
    [
        'escalation = ["pray"]',
        "escalation = []",
        'reminder_role = "assistant"',
        'reminder_role = "system"',  # on the anthropic wire: its one system prompt is the cached prefix
        'thinking_on = "high"',
        'thinking_on_by_model = { "claude-x*" = "adaptive" }',
    ],
)
def test_run_refuses_a_profiles_file_that_would_mislead_the_ladder_and_leaves_the_log_alone(
    cli_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: str
) -> None:
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(f"[profiles.anthropic]\n{settings}\n", encoding="utf-8")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"profile": "anthropic", "turns": [{"text": "hm"}]}), encoding="utf-8")
    task_id = start_refund()
    before = invoke("history", task_id, "--json")[1]
    monkeypatch.setenv("RAILYARD_PROFILES_FILE", str(profiles))
    code, _, err = invoke("run", task_id, "--model", f"scripted:{script}")
    assert code == 2 and "CONFIG_INVALID" in err
    assert invoke("providers")[0] == 2
    assert invoke("history", task_id, "--json")[1] == before


def test_run_refuses_a_bad_model_spec_and_a_missing_model(cli_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    task_id = start_refund()
    for spec in ("nonsense", "scripted:/no/such/file.json"):  # a configuration error: exit 2, like a usage error
        code, _, err = invoke("run", task_id, "--model", spec)
        assert code == 2 and "CONFIG_INVALID" in err
    monkeypatch.delenv("RAILYARD_MODEL", raising=False)
    code, _, err = invoke("run", task_id)
    assert code == 2 and "MODEL_NOT_CONFIGURED" in err


def test_providers_lists_every_profile_and_its_rungs(cli_env: str) -> None:
    code, out, _ = invoke("providers", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert {"openai", "anthropic", "gemini", "deepseek", "qwen", "glm", "minimax", "mistral", "ollama"} <= set(rows)
    assert rows["anthropic"]["rung_thinking_on"] == "auto_reminder"
    assert rows["anthropic"]["rung_thinking_off_one_action"] == "named_tool"
    assert rows["minimax"]["tool_choice_thinking_off"] == []
    # The escalation order each profile declares, and the attempts it makes of a model that ignores every rung.
    assert rows["glm"]["reminder_role"] == "system" and rows["glm"]["escalation"] == ["reminder", "rung"]
    assert rows["openai"]["escalation_thinking_off"] == [
        "native_schema",
        "native_schema+reminder",
        "required",
        "auto_reminder",
    ]
    assert rows["deepseek"]["thinking_on"] == {"thinking": {"type": "enabled"}}
    code, text, _ = invoke("providers")
    assert code == 0 and "Escalation after an ignored rung" in text


def test_approvals_approve_and_reject_from_the_command_line(cli_env: str) -> None:
    first, second = start_refund(), start_refund()
    for task_id in (first, second):
        assert invoke("fire", task_id, "propose", "--payload", '{"amount": 300, "reason": "x"}', "--as", "m")[0] == 0
    code, out, _ = invoke("approvals", "--role", "approver", "--json")
    assert code == 0 and {p["task_id"] for p in json.loads(out)} == {first, second}
    assert json.loads(invoke("approvals", "--role", "nobody", "--json")[1]) == []
    code, _, err = invoke("approve", first, "--as", "bob")
    assert code == 1 and "APPROVAL_FORBIDDEN" in err
    code, _, err = invoke("approve", first, "--as", "ann")  # the starter: separation of duties
    assert code == 1 and "APPROVAL_FORBIDDEN" in err
    assert invoke("approve", first, "--as", "dana", "--comment", "ok")[0] == 0
    code, _, err = invoke("approve", first, "--as", "dana")
    assert code == 1 and "TASK_NOT_AWAITING_APPROVAL" in err
    code, out, _ = invoke("reject", second, "--as", "dana", "--reason", "no receipt", "--json")
    assert code == 0 and json.loads(out)["state"] == "rejected"
    assert json.loads(invoke("approvals", "--json")[1]) == []


def test_status_counts_tasks_per_workflow_and_status(cli_env: str) -> None:
    first, _second = start_refund(), start_refund()
    invoke("fire", first, "propose", "--payload", '{"amount": 300, "reason": "x"}', "--as", "m")
    code, out, _ = invoke("start", "counter", "--as", "ann")
    invoke("cancel", out.strip(), "--as", "ann", "--reason", "test")
    code, out, _ = invoke("status", "--json")
    assert code == 0
    rows = {r["workflow"]: r for r in json.loads(out)["workflows"]}
    assert (rows["refund"]["runnable"], rows["refund"]["blocked"], rows["refund"]["terminal"]) == (1, 1, 0)
    assert rows["refund"]["leased"] == 0
    assert rows["counter"]["terminal"] == 1 and rows["counter"]["oldest_runnable_seconds"] is None
    assert rows["refund"]["oldest_runnable_seconds"] >= 0
    assert invoke("status")[0] == 0


# -- the auditor's commands ------------------------------------------------------------------------------------
def refund_path(cli_env: str) -> str:
    """refund@2: a scripted turn without an action (repair, NO_ACTION), a proposal, an approval."""
    task_id = start_refund()
    script = Path(cli_env.removeprefix("sqlite:///")).with_name("audit-model.json")
    script.write_text(
        json.dumps(
            {
                "profile": "anthropic",
                "turns": [
                    {"text": "Let me think."},
                    {"tool_calls": [{"name": "propose", "arguments": {"amount": 300, "reason": "broken on arrival"}}]},
                ],
            }
        ),
        encoding="utf-8",
    )
    assert invoke("run", task_id, "--model", f"scripted:{script}")[0] == 0
    assert invoke("approve", task_id, "--as", "dana")[0] == 0
    return task_id


def test_history_shows_codes_and_summaries(cli_env: str) -> None:
    task_id = refund_path(cli_env)
    code, out, _ = invoke("history", task_id)
    assert code == 0
    assert all(column in out for column in ("seq", "actor", "trigger", "code", "data"))
    assert "NO_ACTION" in out and "approve" in out and "broken on" in out
    events = json.loads(invoke("history", task_id, "--json")[1])
    assert [e["seq"] for e in events] == [1, 2, 3, 4]


def test_replay_exits_0_on_a_clean_log_and_3_on_a_tampered_one(cli_env: str) -> None:
    task_id = refund_path(cli_env)
    other = start_refund()
    code, out, _ = invoke("replay", task_id, "--json")
    assert code == 0
    assert json.loads(out) == {"task_id": task_id, "workflow": "refund@2", "events": 4, "ok": True, "findings": []}
    code, out, _ = invoke("replay", task_id)
    assert code == 0 and "no findings" in out
    code, out, _ = invoke("replay", "--all", "--json")
    assert code == 0
    assert json.loads(out) == {"reports": [], "tasks": 2, "events": 5, "findings": 0, "ok": True}

    tamper(cli_env, "UPDATE events SET actor = 'mallory' WHERE task_id = :t AND seq = 4", t=task_id)
    code, out, _ = invoke("replay", task_id, "--json")
    assert code == 3
    assert [(f["code"], f["seq"]) for f in json.loads(out)["findings"]] == [("HASH_MISMATCH", 4)]
    code, out, _ = invoke("replay", task_id)
    assert code == 3 and "HASH_MISMATCH" in out
    code, out, _ = invoke("replay", "--all", "--json")
    summary = json.loads(out)
    assert code == 3 and (summary["tasks"], summary["findings"], summary["ok"]) == (2, 1, False)
    assert [r["task_id"] for r in summary["reports"]] == [task_id]
    code, out, _ = invoke("replay", "--all", "--workflow", "counter", "--json")
    assert code == 0 and json.loads(out)["tasks"] == 0
    code, out, _ = invoke("replay", "--all", "--since", "2000-01-01")
    assert code == 3 and "replayed 2 tasks, 5 events" in out
    assert invoke("replay", other)[0] == 0


def test_replay_with_jobs_says_what_one_process_says(cli_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.audit import parallel as replay_jobs

    monkeypatch.setattr(replay_jobs, "PAGE", 1)  # a page per task: two tasks are enough to go parallel
    task_id = refund_path(cli_env)
    start_refund()
    tamper(cli_env, "UPDATE events SET actor = 'mallory' WHERE task_id = :t AND seq = 3", t=task_id)
    serial = invoke("replay", "--all", "--json", "--jobs", "1")
    assert serial[0] == 3
    assert invoke("replay", "--all", "--json", "--jobs", "2") == serial
    assert invoke("replay", "--all", "--json") == serial  # one job per CPU


@pytest.mark.parametrize(
    "args",
    [
        ["replay"],
        ["replay", "x", "--all"],
        ["replay", "x", "--workflow", "refund"],
        ["replay", "--all", "--jobs", "-1"],
        ["replay", "--all", "--since", "yesterday"],
        ["export"],
        ["show", "x", "--as-of", "soon"],
    ],
)
def test_audit_usage_errors_exit_2(cli_env: str, args: list[str]) -> None:
    assert invoke(*args)[0] == 2


def test_show_as_of_a_seq_or_a_time(cli_env: str) -> None:
    task_id = refund_path(cli_env)
    code, out, _ = invoke("show", task_id, "--as-of", "1", "--json")
    assert code == 0
    first = json.loads(out)
    assert (first["state"], first["seq"], first["as_of"]["seq"], first["as_of"]["trigger"]) == (
        "assessing",
        1,
        1,
        "start",
    )
    third = json.loads(invoke("show", task_id, "--as-of", "3", "--json")[1])
    assert (third["state"], third["status"], third["facts"]["propose"]["amount"]) == (
        "awaiting_approval",
        "blocked",
        300,
    )
    at = third["as_of"]["at"]
    assert json.loads(invoke("show", task_id, "--as-of", at, "--json")[1])["seq"] == 3
    code, out, _ = invoke("show", task_id, "--as-of", "3")
    assert code == 0 and "as of seq 3" in out and "awaiting_approval" in out
    assert invoke("show", task_id, "--as-of", "9")[0] == 2
    assert invoke("show", task_id, "--as-of", "2001-01-01T00:00:00Z")[0] == 2


def test_export_then_verify_export(cli_env: str, tmp_path: Path) -> None:
    task_id = refund_path(cli_env)
    result = runner.invoke(app, ["export", task_id])
    assert result.exit_code == 0
    export = tmp_path / "task.jsonl"
    export.write_bytes(result.stdout_bytes)
    assert [json.loads(line)["kind"] for line in result.stdout_bytes.splitlines()] == ["task"] + ["event"] * 4 + ["end"]
    code, out, _ = invoke("verify-export", str(export), "--json")
    assert code == 0 and json.loads(out) == {"reports": [], "tasks": 1, "events": 4, "findings": 0, "ok": True}
    code, out, _ = invoke("verify-export", str(export))
    assert code == 0 and "verified 1 task, 4 events: no findings" in out

    data = bytearray(export.read_bytes())
    data[data.index(b'"amount":300') + 10] ^= 0x01
    export.write_bytes(bytes(data))
    code, out, _ = invoke("verify-export", str(export), "--json")
    assert code == 3 and json.loads(out)["reports"][0]["findings"][0]["code"] == "HASH_MISMATCH"
    everything = runner.invoke(app, ["export", "--all", "--since", "2000-01-01"])
    assert everything.exit_code == 0 and everything.stdout_bytes.count(b'"kind":"task"') == 1
    code, _, err = invoke("export", "missing-task")
    assert code == 1 and "TASK_NOT_FOUND" in err
    assert invoke("verify-export", str(tmp_path / "nope.jsonl"))[0] == 2


def test_graph_highlights_a_tasks_path(cli_env: str) -> None:
    task_id = refund_path(cli_env)
    code, out, _ = invoke("graph", "refund", "--task", task_id)
    assert code == 0
    assert "assessing --> assessing~force: repair (1x)" in out
    assert "awaiting_approval --> executing: approve (1x)" in out
    assert "Class executing s_active" in out and "Class assessing s_previous" in out
    code, out, _ = invoke("graph", "refund", "--task", task_id, "--format", "dot")
    assert code == 0 and 'awaiting_approval -> executing [label="approve (1x)" color=blue' in out
    assert invoke("graph", "counter", "--task", task_id)[0] == 2
    assert invoke("graph", "refund", "--task", "missing-task")[0] == 1


def test_approve_takes_the_digest_approvals_shows_and_prints_nothing_before_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference refund at its approval of a prepared payment: `approvals` shows the first 12 characters of
    the digest, and `approve --digest` with them approves that call; fewer is DIGEST_TOO_SHORT, 12 that are not
    the call's APPROVAL_STALE, each alone on stderr with the log unchanged."""
    from engine import Engine, Registry, ScriptedModel, StaticRoles
    from workflows import fakes
    from workflows.scripts import REFUND_WRONG_ITEM_INPUT, refund_wrong_item

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\ndana = ["refund_approver"]\n', encoding="utf-8")
    for name, value in {"RAILYARD_DATABASE_URL": url, "RAILYARD_WORKFLOWS": "workflows"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    assert invoke("db", "upgrade")[0] == 0
    fakes.bind(url)
    fakes.systems(url).reset()
    with Engine(url, Registry.from_modules(["workflows"]), authoriser=StaticRoles({})) as eng:
        task_id = eng.start("refund", REFUND_WRONG_ITEM_INPUT, actor="portal")
        eng.run(task_id, model=ScriptedModel(refund_wrong_item(eng.get(task_id).version)))
        prepared = eng.load(task_id).prepared
        assert prepared is not None and eng.get(task_id).state == "awaiting_approval"
        seq = eng.get(task_id).seq
    digest = str(prepared["digest"])

    code, out, _ = invoke("approvals")
    assert code == 0 and digest[:12] in out and digest[:13] not in out
    for named, refusal in ((digest[:11], "DIGEST_TOO_SHORT"), ("0" * 12, "APPROVAL_STALE")):
        code, out, err = invoke("approve", task_id, "--as", "dana", "--digest", named)
        assert code == 1 and out == "" and err.startswith(f"{refusal}: ") and err.count("\n") == 1, err
    code, out, err = invoke("approve", task_id, "--as", "nobody")  # no --digest: still nothing before the refusal
    assert code == 1 and err.startswith("APPROVAL_FORBIDDEN: ") and err.count("\n") == 1, err
    code, out, _ = invoke("show", task_id, "--json")
    assert json.loads(out)["seq"] == seq  # every refusal left the log as it was

    code, out, err = invoke("approve", task_id, "--as", "dana", "--digest", digest[:12], "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == "executing"
    code, out, _ = invoke("history", task_id, "--json")
    assert json.loads(out)[-1]["data"]["approval"]["digest"] == digest  # the whole digest is what is recorded


def test_an_unknown_workflow_is_named_with_the_known_ones_and_the_closest(cli_env: str) -> None:
    code, out, err = invoke("start", "refnd", "--as", "ann")
    assert code == 1 and out == ""
    assert err.startswith("WORKFLOW_UNKNOWN: no workflow named 'refnd' (did you mean refund?); the known ones are ")
    assert "counter, " in err and " and " in err and "[" not in err  # in words, not a Python list
    code, _, err = invoke("graph", "zzz")
    assert code == 1 and "did you mean" not in err and "the known ones are" in err


def test_a_note_from_the_cli_is_an_event_in_the_history_and_none_after_the_end(cli_env: str) -> None:
    task_id = start_refund()
    code, out, err = invoke("note", task_id, "Customer called about the parcel.", "--as", "dana", "--json")
    assert code == 0, err
    assert (json.loads(out)["state"], json.loads(out)["seq"]) == ("assessing", 2)
    code, out, _ = invoke("history", task_id, "--json")
    last = json.loads(out)[-1]
    assert (last["trigger"], last["actor"], last["data"]) == (
        "comment",
        "dana",
        {"note": {"text": "Customer called about the parcel."}},
    )
    invoke("cancel", task_id, "--as", "ann", "--reason", "test")
    code, out, err = invoke("note", task_id, "Too late", "--as", "dana")
    assert code != 0 and "TASK_TERMINAL" in out + err
