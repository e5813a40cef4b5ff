"""Workflow definitions: validation reports every defect at once; digests pin content; one machine per version."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

import workflows as reference
from engine import (
    ANYONE,
    Action,
    Agent,
    Approval,
    CardField,
    Code,
    DecisionCard,
    DefinitionError,
    Refused,
    Registry,
    Terminal,
    Tool,
    Wait,
    Workflow,
)
from tests.support.sample_workflows import COUNTER, REFUND_V1, REFUND_V2, OrderInput, edited_refund_v1, refund_states


class Loose(BaseModel):
    amount: int  # extra fields allowed: refused by validation


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    amount: int


class OtherStrict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str


def always(_ctx: object) -> None:
    return None


def test_every_defect_is_reported_at_once() -> None:
    with pytest.raises(DefinitionError) as caught:
        Workflow(
            name="broken",
            version=1,
            states=[
                Agent(
                    "start_here",
                    actions=[
                        Action("go", "nowhere"),  # unknown target
                        Action("pay", "paid", Loose),  # argument model without extra="forbid"
                        Action("split", "paid"),  # shared trigger without guards ...
                        Action("split", "start_here", guards=[always]),  # ... guarded on one side only
                    ],
                ),
                Agent("idle"),  # agent state with no action, and unreachable
                Terminal("paid", actions=[Action("again", "start_here")]),  # terminal with exits
                Terminal("paid"),  # duplicate state name
            ],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )
    error = caught.value
    assert error.code is Code.DEFINITION_INVALID
    problems = "\n".join(error.problems)
    assert "targets unknown state 'nowhere'" in problems
    assert "argument model must set extra='forbid'" in problems
    assert "trigger 'split' is shared by 2 transitions and not all have guards" in problems
    assert "'idle' is an agent state with no action" in problems
    assert "state 'idle' is unreachable" in problems
    assert "'paid' is terminal but has exits" in problems
    assert "duplicate state name 'paid'" in problems
    assert len(error.problems) == 7


def test_reserved_names_kind_rules_and_deadlines_are_checked() -> None:
    with pytest.raises(DefinitionError) as caught:
        Workflow(
            name="Bad Name",
            version=0,
            states=[
                Agent(
                    "a",
                    actions=[Action("cancel", "b"), Action("step", "b"), Action("step2", "c"), Action("step3", "d")],
                ),
                Approval("b", actions=[Action("ok", "z")]),  # no role
                Tool("c"),  # no tool, no on_succeeded
                Wait("d", actions=[Action("ping", "z")], on_expired="z"),  # on_expired without deadline
                Terminal("z"),
            ],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )
    problems = "\n".join(caught.value.problems)
    assert "workflow name 'Bad Name'" in problems
    assert "version 0 must be an integer >= 1" in problems
    assert "action name 'cancel' is reserved" in problems
    assert "'b' is an approval state with no role" in problems
    assert "'c' is a tool state that names no tool" in problems
    assert "'c' is a tool state with no on_succeeded target" in problems
    assert "'d': deadline and on_expired go together" in problems


def test_shared_trigger_needs_one_argument_model() -> None:
    with pytest.raises(DefinitionError, match="different argument models"):
        Workflow(
            name="w",
            version=1,
            states=[
                Agent(
                    "a",
                    actions=[Action("x", "b", Strict, guards=[always]), Action("x", "c", OtherStrict, guards=[always])],
                ),
                Terminal("b"),
                Terminal("c"),
            ],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )


def test_initial_state_must_exist_and_not_be_terminal() -> None:
    with pytest.raises(DefinitionError, match="initial state 'done' is terminal"):
        Workflow(
            name="w",
            version=1,
            initial="done",
            states=[Agent("a", actions=[Action("x", "done")]), Terminal("done")],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )


def test_digest_is_stable_and_covers_content() -> None:
    again = Workflow(
        name="refund",
        version=1,
        input=OrderInput,
        states=refund_states(),
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )
    assert again.digest == REFUND_V1.digest
    changed = edited_refund_v1()
    assert changed.digest != REFUND_V1.digest
    assert len(REFUND_V1.digest) == 64


def test_argument_schema_change_changes_the_digest() -> None:
    def make(model: type[BaseModel]) -> Workflow:
        return Workflow(
            name="w",
            version=1,
            states=[Agent("a", actions=[Action("x", "b", model)]), Terminal("b")],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )

    assert make(Strict).digest != make(OtherStrict).digest


def test_one_machine_per_version_shared_by_all_tasks() -> None:
    assert REFUND_V1.machine is REFUND_V1.machine
    assert REFUND_V1.machine is not REFUND_V2.machine
    assert REFUND_V1.triggers("assessing") == ["propose", "give_up", "note", "cancel"]
    assert REFUND_V1.machine.destinations("assessing", "propose") == ["auto_refund", "awaiting_approval"]


def test_cancel_and_cancelled_are_added_to_every_workflow() -> None:
    assert COUNTER.has_state("cancelled")
    assert "cancel" in COUNTER.triggers("counting")
    assert COUNTER.triggers("done") == []


def test_registry_holds_versions_side_by_side_newest_by_default() -> None:
    registry = Registry([REFUND_V1, REFUND_V2, COUNTER])
    assert registry.get("refund") is REFUND_V2
    assert registry.get("refund", 1) is REFUND_V1
    assert registry.versions("refund") == [1, 2]
    with pytest.raises(Refused) as unknown:
        registry.get("nope")
    assert unknown.value.code is Code.WORKFLOW_UNKNOWN
    with pytest.raises(Refused) as missing:
        registry.get("refund", 9)
    assert missing.value.code is Code.VERSION_UNKNOWN


def test_registry_refuses_two_contents_under_one_version() -> None:
    changed = edited_refund_v1()
    with pytest.raises(DefinitionError, match="two different definitions claim refund@1"):
        Registry([REFUND_V1, changed])


def test_registry_loads_modules_named_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows, workflows.expense")
    registry = Registry.from_env()
    assert {wf.ref for wf in registry} >= {"refund@1", "refund@2", "counter@1", "expense@1"}


def test_registry_refuses_a_module_that_does_not_import() -> None:
    with pytest.raises(Exception) as caught:
        Registry.from_modules(["no_such_module_here"])
    assert getattr(caught.value, "code", None) is Code.CONFIG_INVALID


def test_graph_renders_mermaid_and_dot() -> None:
    mermaid = REFUND_V1.machine.graph("mermaid")
    assert "stateDiagram-v2" in mermaid
    assert "assessing --> awaiting_approval: propose" in mermaid
    dot = REFUND_V1.machine.graph("dot")
    assert dot.startswith("digraph")
    assert "assessing -> awaiting_approval" in dot


def test_a_declared_cancelled_state_must_be_terminal() -> None:
    with pytest.raises(DefinitionError, match="'cancelled' is where `cancel` leads: it must be terminal"):
        Workflow(
            name="w",
            version=1,
            states=[
                Agent("a", actions=[Action("x", "b")]),
                Terminal("b"),
                Wait("cancelled", actions=[Action("back", "a")]),
            ],
            operator_role=ANYONE,
            model_override_role=ANYONE,
        )


def test_registry_reports_a_module_that_fails_while_importing(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    Path(str(tmp_path), "broken_flows.py").write_text("def oops(:\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Exception) as caught:
        Registry.from_modules(["broken_flows"])
    assert getattr(caught.value, "code", None) is Code.CONFIG_INVALID
    assert "SyntaxError" in str(caught.value)


def test_a_version_compiles_its_machine_when_first_needed_and_once() -> None:
    lazy = Workflow(
        name="lazy",
        version=1,
        states=[Wait("waiting", actions=[Action("done", "finished", role=ANYONE)]), Terminal("finished")],
        operator_role=ANYONE,
        model_override_role=ANYONE,
    )
    assert lazy._machine is None  # built, validated and digested without a machine
    machine = lazy.machine
    assert lazy.machine is machine
    assert lazy.triggers("waiting") == ["done", "cancel"]


def test_searchable_fields_are_fields_of_the_input_and_leave_the_digest_alone() -> None:
    def lookup(**options: Any) -> Workflow:
        states = [Wait("waiting", actions=[Action("finish", "done", role=ANYONE)]), Terminal("done")]
        return Workflow("lookup", 1, states, **options, operator_role=ANYONE, model_override_role=ANYONE)

    with pytest.raises(DefinitionError) as caught:
        lookup(input=OrderInput, searchable=("customer", "order_no"))
    assert "searchable field 'order_no' is not a field of the input model" in str(caught.value)
    with pytest.raises(DefinitionError):
        lookup(searchable=("customer",))  # no input model at all
    plain = lookup(input=OrderInput)
    searchable = lookup(input=OrderInput, searchable=["customer", "balance"])
    assert searchable.digest == plain.digest  # declaring them later needs no new version
    assert searchable.searchable == ("customer", "balance")
    assert searchable.search_values({"customer": "C-1", "balance": 40}) == {"customer": "C-1", "balance": "40"}
    assert searchable.search_values({"customer": "", "balance": True}) == {}  # empty, and not a number
    assert searchable.search_values({"customer": "x" * 500})["customer"] == "x" * 200
    assert plain.search_values({"customer": "C-1"}) == {} and searchable.search_values(None) == {}


def test_the_reference_workflows_declare_what_people_look_tasks_up_by() -> None:
    assert reference.REFUND_V1.searchable == reference.REFUND_V2.searchable == ("customer_id", "order_id")
    assert reference.TICKET_TRIAGE.searchable == ("ticket_id",) and reference.EXPENSE.searchable == ("employee",)


def test_decision_cards_name_human_states_and_fields_and_leave_the_digest_alone() -> None:
    def lookup(**options: Any) -> Workflow:
        states = [Wait("waiting", actions=[Action("finish", "done", role=ANYONE)]), Terminal("done")]
        return Workflow(
            "lookup", 1, states, input=OrderInput, **options, operator_role=ANYONE, model_override_role=ANYONE
        )

    amount = CardField("amount", "input.balance", "balance", "money", currency="EUR")
    card = DecisionCard("Balance {amount} of {customer}", (amount, CardField("customer", "input.customer")))
    assert lookup(cards={"waiting": card}).digest == lookup().digest  # presentation: declared later, same version
    for cards, problem in (
        ({"done": card}, "decision card for 'done': not an approval or wait state"),
        ({"nowhere": card}, "decision card for 'nowhere': not an approval or wait state"),
        ({"waiting": DecisionCard("{who}", (amount,))}, "title names 'who', which is not one of its fields"),
        ({"waiting": DecisionCard("", (CardField("x", "secrets.key"),))}, "path 'secrets.key' must start with"),
        ({"waiting": DecisionCard("", (CardField("x", "input.a", format="pdf"),))}, "format 'pdf' must be one of"),
        ({"waiting": DecisionCard("", (CardField("x", "input.a", section="side"),))}, "section 'side' must be"),
        ({"waiting": DecisionCard("", (CardField("x", "input.a", format="money"),))}, "money needs a currency"),
    ):
        with pytest.raises(DefinitionError) as caught:
            lookup(cards=cards)
        assert problem in str(caught.value), caught.value
