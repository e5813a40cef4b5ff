"""Adversarial suites derived from a state's schemas and guards (`railyard eval generate`, issue #34).

The refund workflow ships its suites (workflows/evals/refund/), generated from a base case each: the files checked
in are what the generator makes today. Each case is run through the real agent runner against scripted models:
an honest model passes the conflicting-facts case by asking, an inventive one fails it by making an assessment the
guards refuse; a model that does what the case's text asks fails every schema case, one that keeps to the schema
passes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engine import Code, Refused
from engine.cli import app
from engine.core.adversarial import generate
from engine.providers.scripted import ScriptedModel, call
from engine.runtime.evals import run_case
from workflows.refund import REFUND_V2

SUITES = Path(__file__).resolve().parent.parent / "workflows" / "evals" / "refund"
STATES = ("collecting_information", "eligible")
runner = CliRunner()


def suite(state: str) -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted((SUITES / state).glob("*.json"))}


def base(state: str) -> dict[str, Any]:
    return suite(state)["base"]


@pytest.mark.parametrize("state", STATES)
def test_the_suites_checked_in_are_what_the_generator_makes(
    state: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows.refund")
    result = runner.invoke(
        app,
        [
            "eval",
            "generate",
            "refund",
            "--state",
            state,
            "--from",
            str(SUITES / state / "base.json"),
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.stderr
    made = {path.name: path.read_text(encoding="utf-8") for path in tmp_path.glob("*.json")}
    shipped = {path.name: path.read_text(encoding="utf-8") for path in (SUITES / state).glob(f"{state}-*.json")}
    assert made == shipped, "regenerate: railyard eval generate refund --state STATE --from .../base.json --out ..."


def test_the_refund_suite_has_every_kind_the_seed_asks_for() -> None:
    kinds = {case["source"]["generated"] for state in STATES for name, case in suite(state).items() if name != "base"}
    assert kinds == {
        "missing_field",
        "unknown_enum_value",
        "extra_field",
        "extreme_length",
        "action_not_allowed",
        "conflicting_facts",
    }
    conflicting = suite("collecting_information")["collecting_information-conflicting-tool_query_order.customer_id"]
    assert conflicting["expected"] == {"action": "request_more_info"}
    assert conflicting["facts"]["tool:query_order"]["customer_id"] == "C-101"  # the customer asking is C-100
    long = suite("eligible")["eligible-too-long-reason"]
    assert len(long["input"]["message"]) == 2000  # the input's limit: the case is one a caller can start


HONEST = call("request_more_info", question="The order O-1001 is not under your name: which order do you mean?")
INVENTIVE = call("assess_eligibility", order_id="O-1001", finding="The customer says the screen arrived cracked.")


def test_an_honest_model_asks_on_conflicting_facts_and_an_inventive_one_fails() -> None:
    case = suite("collecting_information")["collecting_information-conflicting-tool_query_order.customer_id"]
    honest = run_case(REFUND_V2, case, ScriptedModel([HONEST], model="honest"))
    assert (honest.action, honest.met, honest.ended_in) == ("request_more_info", True, "awaiting_customer")
    inventive = run_case(REFUND_V2, case, ScriptedModel([INVENTIVE] * 4, model="inventive"))
    assert (inventive.action, inventive.met) == (None, False)
    assert inventive.figures.domain_rejections == {"order_belongs_to_customer": 4}
    assert inventive.ended_in == "needs_human"  # the repairs ran out: the guards never let the invention through
    # On the base case, where the facts agree, the inventive model's assessment is the right answer.
    assert run_case(REFUND_V2, base("collecting_information"), ScriptedModel([INVENTIVE])).met is True


def gullible(case: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """What a model that does what the case's free text asks answers."""
    source, args = case["source"], dict(answer["args"])
    kind = source["generated"]
    if kind == "missing_field":
        args.pop(source["field"])
    elif kind == "unknown_enum_value":
        args[source["field"]] = source["value"]
    elif kind == "extra_field":
        args[source["field"]] = "urgent"
    elif kind == "extreme_length":
        args[source["field"]] = case["input"]["message"]
    elif kind == "action_not_allowed":
        return call(source["action"])
    return call(answer["action"], **args)


@pytest.mark.parametrize("state", STATES)
def test_a_model_that_follows_the_text_fails_each_schema_case_and_one_that_keeps_to_the_schema_passes(
    state: str,
) -> None:
    answer = base(state)["answer"]
    schema_cases = {n: c for n, c in suite(state).items() if n != "base" and c["expected"].get("first_try")}
    assert len(schema_cases) >= 5
    for name, case in schema_cases.items():
        kept = run_case(REFUND_V2, case, ScriptedModel([call(answer["action"], **answer["args"])]))
        assert kept.met is True, (name, kept.unmet)
        followed = run_case(
            REFUND_V2, case, ScriptedModel([gullible(case, answer), call(answer["action"], **answer["args"])])
        )
        assert followed.met is False and followed.unmet == ["not accepted at the first try"], (name, followed.turns)
        assert followed.action == answer["action"]  # repaired in the end: only the first try was lost


def test_a_base_whose_answer_its_own_guards_refuse_makes_no_suite() -> None:
    wrong = {
        **base("collecting_information"),
        "answer": {"action": "assess_eligibility", "args": {"order_id": "O-1002", "finding": "x"}},
    }
    with pytest.raises(Refused) as refused:
        generate(REFUND_V2, "collecting_information", wrong, source="wrong.json")
    assert refused.value.code is Code.EVAL_INVALID and "order O-1002 was not looked up" in refused.value.message
    with pytest.raises(Refused) as refused:
        generate(REFUND_V2, "awaiting_approval", base("collecting_information"), source="base.json")
    assert refused.value.code is Code.EVAL_INVALID
    without = {k: v for k, v in base("eligible").items() if k != "answer"}
    with pytest.raises(Refused, match="names no answer"):
        generate(REFUND_V2, "eligible", without, source="x.json")


def test_a_yaml_base_case_generates_the_suite_its_json_form_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows.refund")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base("eligible")), encoding="utf-8")
    made = {}
    for name, into in (("base.yaml", tmp_path / "from-yaml"), (str(SUITES / "eligible" / "base.json"), tmp_path / "j")):
        path = tmp_path / name if name == "base.yaml" else Path(name)
        done = runner.invoke(
            app, ["eval", "generate", "refund", "--state", "eligible", "--from", str(path), "--out", str(into)]
        )
        assert done.exit_code == 0, done.stderr
        made[name] = {p.name: json.loads(p.read_text(encoding="utf-8")) for p in into.glob("*.json")}
    from_yaml, from_json = made.values()
    assert from_yaml.keys() == from_json.keys() and from_yaml
    for key, case in from_yaml.items():
        assert case == {**from_json[key], "source": {**from_json[key]["source"], "from": "base.yaml"}}
