"""Evaluation cases from the log (`railyard eval capture`) and runs of them (`railyard eval run`), issue #34.

A case is taken from a task a scripted model drove, then put before scripted models through the real agent
runner: it reproduces the recorded action, the ladder's repairs show in its figures, nothing is written to any
log, and the case file carries no identity, no restricted and no sensitive value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine import Engine, Registry, StaticRoles, migrations
from engine.cli import app
from engine.core.evals import FORMAT, capture_point, case_of
from engine.providers.scripted import ScriptedModel, call
from engine.runtime.evals import run_case
from engine.store.protocol import FlowStore
from tests.support.eval_workflows import CLAIMS

runner = CliRunner()
CUSTOMER = "cust-4471"
INPUT = {"customer": CUSTOMER, "limit_cents": 90_417, "message": f"Customer {CUSTOMER} was charged twice"}
GOOD = call("submit", amount_cents=1250, card_last4="4242")
BAD = call("submit", amount_cents=12.5, card_last4="4242")


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'evals.db'}"
    monkeypatch.setenv("RAILYARD_DATABASE_URL", url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.eval_workflows")
    monkeypatch.chdir(tmp_path)
    migrations.upgrade(url)
    with Engine(url, Registry([CLAIMS]), authoriser=StaticRoles({})) as eng:
        yield eng


def drafted(eng: Engine) -> str:
    """A claim the model drafted: once wrong (euros, not cents), then right."""
    task = eng.start("claims", INPUT, actor="ann")
    scripted = ScriptedModel([BAD, GOOD])
    eng.step(task, model=scripted)
    eng.step(task, model=scripted)
    assert eng.get(task).state == "review"
    return task


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def script(path: Path, *turns: dict[str, Any]) -> str:
    path.write_text(json.dumps({"model": path.stem, "turns": list(turns)}), encoding="utf-8")
    return f"scripted:{path}"


def test_a_captured_case_run_against_the_scripted_model_reproduces_the_recorded_action(
    claims: Engine, tmp_path: Path
) -> None:
    task = drafted(claims)
    events = claims.history(task)
    code, _, err = invoke("eval", "capture", task, "--state", "drafting", "--out", "case.json")
    assert code == 0, err
    case = json.loads((tmp_path / "case.json").read_text(encoding="utf-8"))
    assert (case["format"], case["workflow"], case["state"], case["expected"]) == (
        FORMAT,
        "claims",
        "drafting",
        {"action": "submit"},
    )
    assert case["source"] == {"task_id": task, "seq": 1}
    # The accepted answer comes along (a sensitive argument as the log holds it: redacted), for eval generate.
    assert case["answer"] == {"action": "submit", "args": {"amount_cents": 1250, "card_last4": "[redacted]"}}
    assert set(case["actions"]) == {"submit", "give_up"}

    same = script(tmp_path / "same.json", BAD, GOOD)
    other = script(tmp_path / "other.json", call("give_up"))
    code, out, err = invoke("eval", "run", "case.json", "--model", same, "--model", other, "--json")
    assert code == 0, err
    by_model = {r["model"]: r for r in json.loads(out)["cases"]}
    first = by_model["scripted:same"]
    assert (first["action"], first["met"], first["ended_in"]) == ("submit", True, "review")
    assert [t["code"] for t in first["turns"]] == ["OUTPUT_SCHEMA_INVALID", None]
    assert (first["repairs"], first["schema_failures"]) == (1, {"amount_cents": 1})
    assert (by_model["scripted:other"]["action"], by_model["scripted:other"]["met"]) == ("give_up", False)
    # Nothing was written: the task's log is the one captured, and no other task exists.
    assert claims.history(task) == events
    assert claims.store.task_ids() == [task]

    code, out, _ = invoke("eval", "run", "case.json", "--model", same)
    assert code == 0 and "1 of 1 expectations met" in out


def test_a_case_file_holds_no_identity_no_restricted_and_no_sensitive_value(claims: Engine) -> None:
    task = drafted(claims)
    code, out, err = invoke("eval", "capture", task, "--state", "drafting")
    assert code == 0, err
    case = json.loads(out)
    assert CUSTOMER not in out and "90417" not in out and "4242" not in out
    assert case["input"] == {
        "customer": "[redacted]",
        "limit_cents": "[restricted]",
        "message": "Customer [redacted] was charged twice",
    }


def test_the_pure_parts_pick_the_last_visit_with_a_turn_and_refuse_other_states(claims: Engine) -> None:
    task = drafted(claims)
    events = claims.history(task)
    assert capture_point(events, "drafting") == (1, "submit")
    assert capture_point(events, "review") is None
    code, _, err = invoke("eval", "capture", task, "--state", "review")
    assert (code, err.split(":")[0]) == (2, "EVAL_INVALID")
    then = claims.audit.as_of(task, 1)
    case = case_of(CLAIMS, then, expected=None, source={})
    result = run_case(CLAIMS, case, ScriptedModel([GOOD]))
    assert (result.action, result.met, result.figures.first_try_accepted) == ("submit", None, 1)


def test_a_file_that_is_not_a_case_is_refused_with_a_code(claims: Engine, tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text('{"workflow": "claims", "state": "drafting"}', encoding="utf-8")
    (tmp_path / "text.txt").write_text("not json", encoding="utf-8")
    model = script(tmp_path / "m.json", GOOD)
    for name in ("notes.json", "text.txt"):
        code, _, err = invoke("eval", "run", name, "--model", model)
        assert (code, err.split(":")[0]) == (2, "EVAL_INVALID"), err


def test_a_guard_that_reads_a_value_the_case_withholds_fails_that_case_alone(tmp_path: Path) -> None:
    """expense's within_limit reads the employee's limit, which the workflow restricts: a captured case holds
    `[restricted]` there until its reviewer writes a value of their own."""
    from engine.store import MemoryStore
    from workflows.expense import EXPENSE

    claim = call("submit", amount_cents=4250, currency="EUR", description="Train to Lyon")
    with Engine(store=MemoryStore(), registry=Registry([EXPENSE])) as eng:
        task = eng.start("expense", {"employee": "ann", "limit_cents": 50_000}, actor="ann")
        eng.step(task, model=ScriptedModel([claim]))
        seq, expected = capture_point(eng.history(task), "drafting") or (0, None)
        case = case_of(EXPENSE, eng.audit.as_of(task, seq), expected=expected, source={"task_id": task, "seq": seq})
    assert case["input"]["limit_cents"] == "[restricted]"
    failed = run_case(EXPENSE, case, ScriptedModel([claim]))
    assert failed.error is not None and failed.error.startswith("ValueError") and failed.met is False
    reviewed = {**case, "input": {**case["input"], "limit_cents": 50_000}}
    assert run_case(EXPENSE, reviewed, ScriptedModel([claim])).met is True


# -- comparing models and versions, and the gate -------------------------------------------------------------------
def case_file(path: Path, expected: dict[str, Any] | None = None) -> str:
    """A hand-written case of claims' drafting state, as a reviewer would keep it in the repository."""
    case = {
        "format": FORMAT,
        "workflow": "claims",
        "version": 1,
        "state": "drafting",
        "source": {"written_by": "a reviewer"},
        "input": {"customer": "[redacted]", "limit_cents": 50_000, "message": "I was charged twice for 12.50"},
        "facts": {},
        "expected": expected if expected is not None else {"action": "submit"},
    }
    path.write_text(json.dumps(case), encoding="utf-8")
    return path.name


def test_the_gate_exits_non_zero_when_a_second_model_is_worse_than_the_baseline(claims: Engine, tmp_path: Path) -> None:
    first = case_file(tmp_path / "first.json")
    second = case_file(tmp_path / "second.json", {"action": "submit", "first_try": True})
    good = script(tmp_path / "good.json", GOOD)
    sloppy = script(tmp_path / "sloppy.json", BAD, GOOD)  # right in the end, but never at the first try
    lost = script(tmp_path / "lost.json", call("give_up"))
    code, out, err = invoke("eval", "run", first, second, "--model", good, "--json")
    assert code == 0, err
    (tmp_path / "baseline.json").write_text(out, encoding="utf-8")
    stored = json.loads(out)["models"]["scripted:good"]
    assert (stored["met_share"], stored["first_try_share"]) == (1.0, 1.0)

    # The same model again passes the gate; a second model that does worse fails it, and says where.
    gate = ("--baseline", "baseline.json", "--max-regression", "0.05")
    code, out, err = invoke("eval", "run", first, second, "--model", good, *gate)
    assert code == 0, err
    assert "scripted:good: 2 of 2 expectations met" in out and "(baseline: 2 of 2 met" in out
    code, out, err = invoke("eval", "run", first, second, "--model", good, "--model", sloppy, *gate)
    assert (code, err.split(":")[0]) == (1, "EVAL_REGRESSION"), err
    assert "scripted:sloppy: expectations met 50%, the baseline 100%" in err and "scripted:good" not in err
    assert "NO: not accepted at the first try" in out
    assert "scripted:sloppy: cases accepted at the first try 0%, the baseline 100% (down 100%)" in err
    # The margin is the team's: a margin of 1 (a hundred points) lets even sloppy's first tries through.
    code, _, err = invoke(
        "eval", "run", first, "--model", sloppy, "--baseline", "baseline.json", "--max-regression", "1"
    )
    assert code == 0, err
    code, _, err = invoke("eval", "run", first, second, "--model", lost, *gate)
    assert code == 1 and "scripted:lost: expectations met 0%" in err


def test_two_versions_of_a_workflow_run_side_by_side_and_the_worse_one_fails_the_gate(
    claims: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.eval_workflows,tests.support.eval_workflows_v2")
    name = case_file(tmp_path / "case.json")
    model = script(tmp_path / "v1model.json", GOOD, GOOD, GOOD, GOOD)  # knows nothing of claims@2's reason
    code, out, err = invoke("eval", "run", name, "--model", model, "--version", "1", "--json")
    assert code == 0, err
    (tmp_path / "baseline.json").write_text(out, encoding="utf-8")
    code, out, err = invoke("eval", "run", name, "--model", model, "--version", "1", "--version", "2")
    assert code == 0, err
    assert "scripted:v1model v1: 1 of 1 expectations met" in out
    assert "scripted:v1model v2: 0 of 1 expectations met" in out
    code, out, err = invoke(
        "eval", "run", name, "--model", model, "--version", "2", "--baseline", "baseline.json", "--max-regression", "0"
    )
    assert (code, err.split(":")[0]) == (1, "EVAL_REGRESSION"), err


def test_an_expectation_on_the_arguments_is_checked_and_a_malformed_one_refused(claims: Engine, tmp_path: Path) -> None:
    within = case_file(tmp_path / "within.json", {"action": "submit", "arguments": {"amount_cents": {"max": 1250}}})
    over = case_file(tmp_path / "over.json", {"arguments": {"amount_cents": {"max": 1000}, "note": {"absent": True}}})
    model = script(tmp_path / "m.json", GOOD)
    code, out, err = invoke("eval", "run", within, over, "--model", model, "--json")
    assert code == 0, err
    met = {r["case"]: (r["met"], r["unmet"]) for r in json.loads(out)["cases"]}
    assert met == {"within.json": (True, []), "over.json": (False, ["amount_cents = 1250 fails max 1000"])}
    bad = case_file(tmp_path / "bad.json", {"arguments": {"amount_cents": {"roughly": 1250}}})
    code, _, err = invoke("eval", "run", bad, "--model", model)
    assert (code, err.split(":")[0]) == (2, "EVAL_INVALID") and "bad.json" in err
    code, _, err = invoke("eval", "run", within, "--model", model, "--max-regression", "0.1")
    assert code == 2 and "--baseline" in err


def test_a_field_a_provider_gets_wrong_30_percent_of_the_time_is_reported_at_30_percent(tmp_path: Path) -> None:
    """Through the OpenAI SDK against a local server that answers like a model: each answer writes amount_cents in
    euros (12.5) with probability 0.3, else right. The run's schema failures of amount_cents over its answers is
    0.3 within three standard errors of the answers counted."""
    import math
    import random
    import threading

    from engine.providers.openai_adapter import OpenAIAdapter
    from tests.support.provider_server import ProviderServer, Reply, openai_completion

    rng, lock = random.Random(34), threading.Lock()
    drawn: list[bool] = []

    def model_like(body: dict[str, Any]) -> Reply:
        with lock:
            wrong = rng.random() < 0.3
            drawn.append(wrong)
        arguments = {"amount_cents": 12.5 if wrong else 1250, "card_last4": "4242"}
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return openai_completion(text=json.dumps({"action": "submit", "arguments": arguments}))
        name = body["tools"][0]["function"]["name"]
        return openai_completion(tool_calls=(("call_1", name, json.dumps(arguments)),), finish_reason="tool_calls")

    case_file(tmp_path / "case.json")
    case = json.loads((tmp_path / "case.json").read_text(encoding="utf-8"))
    with ProviderServer() as server:
        server.respond_with(model_like)
        adapter = OpenAIAdapter("gpt-4o", base_url=server.openai_base_url, api_key="test", timeout=10)
        results = [run_case(CLAIMS, case, adapter, name=f"case-{n}") for n in range(150)]
    answered = sum(r.figures.answered for r in results)
    failed = sum(r.figures.schema_failures["amount_cents"] for r in results)
    assert answered == len(drawn) and failed == sum(drawn)  # every answer counted, each failure under its field
    share, error = failed / answered, math.sqrt(0.3 * 0.7 / answered)
    assert abs(share - 0.3) <= 3 * error, (share, answered)
    assert {f for r in results for f in r.figures.schema_failures} == {"amount_cents"}


# -- flow control: an eval run's calls go through the workers' breaker and quotas -----------------------------------
def test_an_eval_run_waits_out_a_429s_retry_after_and_takes_its_share_of_the_quota_a_worker_shares(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider rate-limits the run's first call (retry-after: 1 s); the run calls again only after that, and
    is answered. Its two calls spent the two requests the shared bucket held: a worker on the same database,
    started right after under the same quota, is put off without reaching the provider."""
    import threading
    import time

    from tests.support.provider_server import ProviderServer, Reply, openai_completion

    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.eval_workflows")
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.delenv("RAILYARD_QUOTAS", raising=False)
    monkeypatch.chdir(tmp_path)
    arrived: list[float] = []
    lock = threading.Lock()

    def rate_limited_once(body: dict[str, Any]) -> Reply:
        with lock:
            arrived.append(time.monotonic())
            first = len(arrived) == 1
        if first:
            return Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}}, headers={"retry-after": "1"})
        arguments = {"amount_cents": 1250, "card_last4": "4242"}
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return openai_completion(text=json.dumps({"action": "submit", "arguments": arguments}))
        name = body["tools"][0]["function"]["name"]
        return openai_completion(tool_calls=(("call_1", name, json.dumps(arguments)),), finish_reason="tool_calls")

    case_file(tmp_path / "case.json")
    # Two requests a minute, two deep: what the run's two calls take; the next one is due 30 s later.
    quotas = json.dumps({"openai:gpt-eval": {"requests_per_minute": 2, "burst_seconds": 60}})
    with Engine(db_url, Registry([CLAIMS]), authoriser=StaticRoles({})) as eng:
        waiting = eng.start("claims", INPUT, actor="ann")
    with ProviderServer() as server:
        server.respond_with(rate_limited_once)
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_base_url)
        code, out, err = invoke("eval", "run", "case.json", "--model", "openai:gpt-eval", "--quotas", quotas, "--json")
        assert code == 0, err
        (result,) = json.loads(out)["cases"]
        assert (result["action"], result["met"]) == ("submit", True)
        assert len(arrived) == 2 and arrived[1] - arrived[0] >= 0.95  # the provider's retry-after, waited out
        worker = ["worker", "--once", "--model", "openai:gpt-eval", "--workflows", "claims", "--quotas", quotas]
        done = runner.invoke(app, worker)
        assert done.exit_code == 0, done.output
        assert len(server.requests) == 2  # the worker's call found the bucket the run emptied
    with Engine(db_url, Registry([CLAIMS]), authoriser=StaticRoles({})) as eng:
        assert eng.store.task_ids() == [waiting] and eng.load(waiting).seq == 1  # the run wrote nothing
        row = eng.store.row(waiting)
        assert row is not None and row.next_run_at is not None  # put off for quota, not failed
        assert row.failures == 0
        assert isinstance(eng.store, FlowStore)
        _, buckets, _ = eng.store.flow_rows()
        assert [b.key for b in buckets] == ["openai:gpt-eval"]


def test_a_bad_quota_setting_stops_an_eval_run_before_any_call(claims: Engine, tmp_path: Path) -> None:
    case_file(tmp_path / "case.json")
    misspelt = json.dumps({"openai:gpt-eval": {"request_per_minute": 1}})
    code, _, err = invoke("eval", "run", "case.json", "--model", "openai:gpt-eval", "--quotas", misspelt)
    assert (code, err.split(":")[0]) == (2, "CONFIG_INVALID"), err
    code, _, err = invoke("eval", "run", "case.json", "--model", "openai:gpt-eval", "--quotas", "{nope")
    assert code == 2 and "--quotas" in err


# -- YAML case files -------------------------------------------------------------------------------------------------
def test_a_case_captured_as_yaml_runs_as_its_json_form_does(claims: Engine, tmp_path: Path) -> None:
    import yaml

    task = drafted(claims)
    code, _, err = invoke("eval", "capture", task, "--state", "drafting", "--out", "case.json")
    assert code == 0, err
    code, _, err = invoke("eval", "capture", task, "--state", "drafting", "--out", "case.yaml")  # by the suffix
    assert code == 0, err
    code, shown, err = invoke("eval", "capture", task, "--state", "drafting", "--format", "yaml")
    assert code == 0, err
    as_json = json.loads((tmp_path / "case.json").read_text(encoding="utf-8"))
    text = (tmp_path / "case.yaml").read_text(encoding="utf-8")
    assert shown.strip() == text.strip() and not text.lstrip().startswith("{")  # block style, for review
    assert yaml.safe_load(text) == as_json and CUSTOMER not in text and "4242" not in text
    # Written as JSON, the case is what it always was; --format json says the same.
    code, out, _ = invoke("eval", "capture", task, "--state", "drafting", "--format", "json")
    assert code == 0 and out == (tmp_path / "case.json").read_text(encoding="utf-8")

    model = script(tmp_path / "same.json", BAD, GOOD)
    runs = {}
    for name in ("case.json", "case.yaml"):
        code, out, err = invoke("eval", "run", name, "--model", model, "--json")
        assert code == 0, err
        (result,) = json.loads(out)["cases"]
        runs[name] = {k: v for k, v in result.items() if k not in ("case", "seconds")}
    assert runs["case.yaml"] == runs["case.json"]
    assert (runs["case.yaml"]["action"], runs["case.yaml"]["met"]) == ("submit", True)


def test_a_malformed_yaml_case_is_refused_with_the_case_files_code(claims: Engine, tmp_path: Path) -> None:
    model = script(tmp_path / "m.json", GOOD)
    (tmp_path / "broken.yaml").write_text("workflow: claims\nstate: [drafting\n", encoding="utf-8")
    (tmp_path / "list.yml").write_text("- workflow: claims\n", encoding="utf-8")
    (tmp_path / "tagged.yaml").write_text("workflow: !!python/object:os.system {}\n", encoding="utf-8")
    for name in ("broken.yaml", "list.yml", "tagged.yaml"):
        code, _, err = invoke("eval", "run", name, "--model", model)
        assert (code, err.split(":")[0]) == (2, "EVAL_INVALID"), err


def test_a_retry_after_longer_than_the_runner_waits_is_slept_through_before_the_next_turn() -> None:
    """A provider that asks for 40 s (more than the runner's in-process retries wait) gets the durable backoff a
    worker would record; the run sleeps until it is due, then calls again and is answered."""
    from engine.core.errors import Code
    from engine.core.model_errors import ModelError
    from engine.core.model_interface import ModelRequest, ModelResponse, ToolCall
    from engine.runtime.agent import RetryPolicy

    class SlowDownOnce:
        provider, model = "openai", "gpt-eval"

        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, request: ModelRequest) -> ModelResponse:
            self.calls += 1
            if self.calls == 1:
                error = ModelError(Code.RATE_LIMITED, "slow down", status=429)
                error.retry_after = 40.0
                raise error
            name = request.tools[0].name if request.tools else "submit"
            return ModelResponse(tool_calls=(ToolCall("c1", name, json.dumps(GOOD_ARGS)),))

    slept: list[float] = []
    adapter = SlowDownOnce()
    case = {"format": FORMAT, "workflow": "claims", "state": "drafting", "input": INPUT, "facts": {}}
    result = run_case(CLAIMS, case, adapter, retry=RetryPolicy(attempts=1), sleep=slept.append)
    assert (adapter.calls, result.action) == (2, "submit")
    assert len(slept) == 1 and 35 <= slept[0] <= 41  # the provider's 40 s, less the time the run took meanwhile
    assert [t["code"] for t in result.turns] == ["RATE_LIMITED", None]


GOOD_ARGS = {"amount_cents": 1250, "card_last4": "4242"}
