"""Who may act and who may read (issue #28): deny by default, standing in for the model, reads scoped by role.

The reference refund workflow is the subject: an approver (dana), an operator (olga), an auditor (audrey), the
customer portal, a support agent of another workflow (sam), a person with no role (bob), an approver of the
task's own tenant (aldo) and one of another tenant (gina). The matrix at the end asks every task route of the API,
for every one of them, at the states a refund waits in, and takes the expected answer from the definition's
declared roles and the people's tenants, not from the code under test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from engine import (
    ANYONE,
    AUDITOR,
    Acting,
    Action,
    Agent,
    Approval,
    Code,
    DefinitionError,
    Engine,
    RailyardError,
    Registry,
    ScriptedModel,
    StaticRoles,
    Terminal,
    Tool,
    ToolCatalog,
    ToolDef,
    ToolInvocation,
    ToolKind,
    Wait,
    Workflow,
)
from engine.api import Principal, TokenTable, create_app
from engine.api.tokens import hash_token
from engine.core.definition import CANCEL
from engine.providers.scripted import call
from tests.support import reference
from tests.support.api import login
from tests.support.reference import DAMAGED, refund
from workflows import REFUND_V1, REFUND_V2, TICKET_TRIAGE, fakes

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


#: What a person standing in for the model fires: the refund the model would propose.
PROPOSAL: dict[str, Any] = refund(12_999)["tool_calls"][0]["arguments"]


def refused(action: Any) -> RailyardError:
    with pytest.raises(RailyardError) as caught:
        action()
    return caught.value


#: The tenant the matrix's refunds belong to (started by a caller confined to no tenant, who may name one).
TENANT = "acme"


def to_eligible(engine: Engine, starter: str = "ann") -> str:
    """A refund the model looked up and assessed: it waits in the agent state `eligible` for a proposal."""
    task_id = engine.start("refund", DAMAGED, actor=starter, version=1, tenant=TENANT)
    model = ScriptedModel(
        [call("query_order", order_id="O-1001"), call("assess_eligibility", order_id="O-1001", finding="damaged")],
        profile="anthropic",
    )
    assert engine.run(task_id, model=model, max_turns=3).state == "eligible"
    return task_id


def to_approval(engine: Engine, starter: str = "ann") -> str:
    task_id = to_eligible(engine, starter)
    assert engine.run(task_id, model=ScriptedModel([refund(12_999)], profile="anthropic")).state == "awaiting_approval"
    return task_id


def to_customer(engine: Engine) -> str:
    task_id = engine.start("refund", DAMAGED, actor="ann", version=1, tenant=TENANT)
    ask = call("request_more_info", question="Which order do you mean?")
    assert engine.run(task_id, model=ScriptedModel([ask], profile="anthropic")).state == "awaiting_customer"
    return task_id


# -- definitions: deny by default --------------------------------------------------------------------------------
class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


def waiting(role: str | None, **options: Any) -> Workflow:
    return Workflow(
        name="w",
        version=1,
        states=[Wait("waiting", actions=[Action("reply", "done", Reply, role=role)]), Terminal("done")],
        **options,
    )


def test_a_wait_trigger_without_a_role_does_not_validate_and_the_error_names_it() -> None:
    with pytest.raises(DefinitionError) as caught:
        waiting(None, operator_role="ops")
    assert caught.value.code is Code.DEFINITION_INVALID
    assert caught.value.problems == [
        "state 'waiting': trigger 'reply' names no role: say who may fire it (role=...), or role=ANYONE for any "
        "signed-in person"
    ]


def test_a_workflow_that_names_nobody_to_cancel_retry_or_settle_does_not_validate() -> None:
    with pytest.raises(DefinitionError) as caught:
        waiting("portal")
    assert len(caught.value.problems) == 1
    assert "'cancel', 'settle', 'redrive', 'fork' and 'retry' name no role" in caught.value.problems[0]
    assert waiting("portal", cancel_role="ops").operator_of(CANCEL) == "ops"  # a narrower role is enough


def test_anyone_is_said_explicitly_and_shows_on_the_diagram_and_in_railyard_workflows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    open_wait = waiting(ANYONE, operator_role="ops")
    assert open_wait.roles() == {ANYONE, "ops"}
    drawn = open_wait.machine.graph("mermaid")
    assert "reply [anyone]" in drawn and "cancel [anyone]" not in drawn

    from engine.cli import app

    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows")
    shown = CliRunner().invoke(app, ["workflows", "--json"])
    assert shown.exit_code == 0, shown.output
    roles = {(r["workflow"], r["version"]): r["roles"] for r in json.loads(shown.output)}
    assert roles[("refund", 1)] == ["customer_portal", "refund_approver", "refund_operator"]
    assert roles[("ticket_triage", 1)] == ["customer_portal", "support_agent"]


def test_the_reference_workflows_name_a_role_for_every_human_trigger_and_keep_duties_apart() -> None:
    for definition in (REFUND_V1, REFUND_V2, TICKET_TRIAGE):
        for state, action in definition.transitions():
            if not action.system and not isinstance(definition.state(state), Agent):
                assert action.role not in (None, ANYONE), (definition.ref, state, action.name)
    assert REFUND_V1.operator_of(CANCEL) == "refund_operator" != REFUND_V1.state("awaiting_approval").role  # type: ignore[attr-defined]


# -- the engine: acting in the model's place ----------------------------------------------------------------------
def test_a_person_without_the_override_role_cannot_propose_a_refund_and_nothing_is_written(eng: Engine) -> None:
    task_id = to_eligible(eng)
    before = eng.history(task_id)
    for person in ("bob", "dana", "portal", "audrey"):  # no role, the approver, the portal, the auditor
        error = refused(lambda p=person: eng.fire(task_id, "propose_refund", PROPOSAL, actor=p))
        assert error.code is Code.FORBIDDEN, (person, error)
        assert "balance" not in error.message and "total" not in error.message  # no guard ran for them
        assert refused(lambda p=person: eng.fire(task_id, "reject", {}, actor=p)).code is Code.FORBIDDEN  # nor payload
    assert eng.history(task_id) == before
    fresh = eng.start("refund", DAMAGED, actor="ann", version=1)  # in the first agent state
    for trigger in ("query_order", "assess_eligibility", "request_more_info"):
        assert refused(lambda t=trigger: eng.fire(fresh, t, {"order_id": "O-1001"}, actor="bob")).code is Code.FORBIDDEN
    assert len(eng.history(fresh)) == 1


def test_an_operator_stands_in_for_the_model_the_event_says_so_and_duties_stay_apart(eng: Engine) -> None:
    task_id = to_eligible(eng)
    eng.fire(task_id, "propose_refund", PROPOSAL, actor="olga")
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger, last.to_state) == ("olga", "propose_refund", "awaiting_approval")
    assert last.data["stood_in"] == {"role": "refund_operator"}
    assert "proposal" not in last.data  # no model turn made it
    pending = eng.approvals()[0]
    assert (pending["task_id"], pending["proposed_by"]) == (task_id, "olga")
    # Someone holding both roles proposed it: separation of duties treats them as the proposer.
    both = Engine(
        store=eng.store, registry=eng.registry, authoriser=_roles(vera={"refund_operator", "refund_approver"})
    )
    other = to_eligible(eng)
    both.fire(other, "propose_refund", PROPOSAL, actor="vera")
    digest = both.load(other).prepared["digest"]  # type: ignore[index]
    error = refused(lambda: both.approve(other, "vera", digest))
    assert (error.code, error.details.get("reason")) == (Code.APPROVAL_FORBIDDEN, "self_approval")


def _roles(**people: set[str]) -> Any:
    from engine import StaticRoles

    return StaticRoles({**reference.ROLES, **people})


def test_operators_run_stopped_refunds_and_approvers_no_longer_need_to(eng: Engine, books: fakes.Systems) -> None:
    task_id = to_approval(eng)
    eng.approve(task_id, "dana", eng.load(task_id).prepared["digest"])  # type: ignore[index]
    books.arm("payments.refund", "remote_error")
    assert eng.run(task_id).state == "retryable_failure"
    for person in ("dana", "bob", "audrey"):
        assert refused(lambda p=person: eng.fire(task_id, "retry_refund", actor=p)).code is Code.FORBIDDEN
        assert refused(lambda p=person: eng.cancel(task_id, p, "no")).code is Code.FORBIDDEN
    assert eng.fire(task_id, "retry_refund", actor="olga").state == "executing"


# -- the API: a matrix from the definitions ------------------------------------------------------------------------
#: Who calls, with which roles: each person's answer in every cell comes from these and the definitions.
PEOPLE: dict[str, set[str]] = {
    "dana": {"refund_approver"},
    "olga": {"refund_operator"},
    "audrey": {AUDITOR},
    "portal": {"customer_portal"},
    "sam": {"support_agent"},  # another workflow's role
    "bob": set(),
    "aldo": {"refund_approver"},  # of the task's tenant
    "gina": {"refund_approver"},  # of another tenant
}
#: The tenants people are confined to (the others are confined to none, as in a single-tenant install).
TENANTS: dict[str, frozenset[str]] = {"aldo": frozenset({TENANT}), "gina": frozenset({"globex"})}


@pytest.fixture
def api(eng: Engine) -> tuple[Engine, FastAPI]:
    """An engine whose roles are the tokens' (as `railyard serve` builds it), over the reference fixtures' store."""
    tokens = TokenTable(
        Principal(p, frozenset(roles), hash_token(f"tok-{p}"), tenants=TENANTS.get(p)) for p, roles in PEOPLE.items()
    )
    engine = Engine(store=eng.store, registry=eng.registry, authoriser=tokens)
    return engine, create_app(engine, tokens, session_secret="test")


def declared_roles(definition: Workflow) -> set[str]:
    """Every role the definition's fields name, read off the fields themselves."""
    found = {definition.operator_role, definition.model_override_role, definition.settle_role}
    for state in definition.all_states:
        found.update(a.role for a in state.actions)
        found.add(getattr(state, "role", None))
    return {r for r in found if r}


def may_read(person: str) -> bool:
    in_tenant = person not in TENANTS or TENANT in TENANTS[person]
    return in_tenant and (AUDITOR in PEOPLE[person] or bool(PEOPLE[person] & declared_roles(REFUND_V1)))


def role_for(state: str, trigger: str) -> str | None:
    """The role the definition declares for `trigger` in `state`, as a person fires it."""
    found = REFUND_V1.state(state)
    if isinstance(found, Agent) and trigger != CANCEL:
        return REFUND_V1.model_override_role
    if trigger == CANCEL:
        return REFUND_V1.cancel_role or REFUND_V1.operator_role
    if trigger in ("redrive", "fork"):
        return REFUND_V1.redrive_role or REFUND_V1.settle_role or REFUND_V1.cancel_role or REFUND_V1.operator_role
    if isinstance(found, Approval):
        return found.role
    return next(a.role for a in found.actions if a.name == trigger)


def may_fire(person: str, state: str, trigger: str) -> bool:
    return AUDITOR not in PEOPLE[person] and role_for(state, trigger) in PEOPLE[person]


def headers(person: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{person}"}


#: (the state a refund waits in, how to get a task there, the commands to try: route, body)
CELLS = [
    (
        "eligible",
        to_eligible,
        [
            ("signal", {"trigger": "propose_refund", "payload": PROPOSAL}),
            ("signal", {"trigger": "reject", "payload": {"reason": "Out of policy."}}),
            ("cancel", {"reason": "asked to stop"}),
        ],
    ),
    (
        "awaiting_approval",
        to_approval,
        [("approve", {"comment": "ok"}), ("reject", {"reason": "no"}), ("cancel", {"reason": "asked to stop"})],
    ),
    (
        "awaiting_customer",
        to_customer,
        [
            ("signal", {"trigger": "customer_replied", "payload": {"message": "Order O-1001, cracked screen."}}),
            ("cancel", {"reason": "asked to stop"}),
        ],
    ),
]


def to_hand_off(engine: Engine) -> str:
    task_id = engine.start("refund", DAMAGED, actor="ann", version=1, tenant=TENANT)
    mute = ScriptedModel([{"text": "hmm"}] * 4, profile="anthropic")
    assert engine.run(task_id, model=mute).state == "needs_human"
    return task_id


def to_cancelled(engine: Engine) -> str:
    task_id = to_eligible(engine)
    engine.cancel(task_id, "olga", "asked to stop")
    return task_id


CELLS += [
    (
        "needs_human",
        to_hand_off,
        [
            ("signal", {"trigger": "reopen"}),
            ("signal", {"trigger": "close", "payload": {"reason": "Refunded by bank transfer."}}),
            ("redrive", {"to_state": "collecting_information", "reason": "try again"}),
            ("cancel", {"reason": "asked to stop"}),
        ],
    ),
    ("cancelled", to_cancelled, [("fork", {"at_seq": 1, "reason": "start again"})]),
]
READS = ["", "/history", "/replay", "/diagram"]


@pytest.mark.parametrize(("state", "setup", "commands"), CELLS, ids=[c[0] for c in CELLS])
def test_every_task_route_answers_each_person_as_the_definition_says(
    api: tuple[Engine, FastAPI], state: str, setup: Any, commands: list[tuple[str, dict[str, Any]]]
) -> None:
    engine, app = api
    client = TestClient(app)
    task_id = setup(engine)
    for person in PEOPLE:
        for read in READS:
            got = client.get(f"/api/tasks/{task_id}{read}", headers=headers(person))
            if may_read(person):
                assert got.status_code == 200, (person, read, got.text)
            else:  # absent, in the words of a task that does not exist
                assert (got.status_code, got.json()["code"]) == (404, "TASK_NOT_FOUND"), (person, read)
                assert got.json()["message"] == f"no task {task_id!r}"
        listed = client.get("/api/tasks", headers=headers(person)).json()["tasks"]
        assert (task_id in {t["task_id"] for t in listed}) is may_read(person), person
        work = client.get("/api/work", headers=headers(person)).json()
        if not may_read(person):
            assert work["items"] == [] and work["total"] == {"yours": 0, "others": 0}, person
        approvals = client.get("/api/approvals", headers=headers(person)).json()["approvals"]
        if state == "cancelled":  # nothing waits on anyone
            assert task_id not in {i["task_id"] for i in work["items"]}
        assert (task_id in {a["task_id"] for a in approvals}) is (may_read(person) and state == "awaiting_approval")
        for route, body in commands:
            trigger = str(body.get("trigger", route))
            before = engine.history(task_id)
            if route == "approve":
                body = {**body, "digest": engine.load(task_id).prepared["digest"]}  # type: ignore[index]
            got = client.post(f"/api/tasks/{task_id}/{route}", json=body, headers=headers(person))
            if not may_read(person):
                assert (got.status_code, got.json()["code"]) == (404, "TASK_NOT_FOUND"), (person, route)
            elif not may_fire(person, state, trigger):
                assert got.status_code == 403, (person, route, trigger, got.text)
                assert got.json()["code"] in ("FORBIDDEN", "APPROVAL_FORBIDDEN")
            else:
                assert got.status_code in (200, 201), (person, route, trigger, got.text)
                task_id = setup(engine)  # it moved (or forked): the next cell needs a task where this one was
                continue
            assert engine.history(task_id) == before, (person, route)  # a refusal writes nothing


def test_pages_show_a_person_only_what_they_may_read_and_offer_only_what_they_may_fire(
    api: tuple[Engine, FastAPI],
) -> None:
    engine, app = api
    task_id = to_eligible(engine)
    seq = len(engine.history(task_id))
    for person in PEOPLE:
        with TestClient(app, follow_redirects=False) as browser:
            csrf = login(browser, person)
            page = browser.get(f"/tasks/{task_id}")
            if not may_read(person):
                assert page.status_code == 404 and "no task" in page.text, person
                forms = {
                    "fire": {"trigger": CANCEL, "arg.reason": "stop"},
                    "approve": {"digest": "0" * 64},
                    "reject": {"reason": "no"},
                    "redrive": {"to_state": "collecting_information", "reason": "again"},
                }
                for form, fields in forms.items():
                    posted = browser.post(f"/tasks/{task_id}/{form}", data={"csrf": csrf, **fields})
                    assert posted.status_code == 303, (person, form)  # refused, said in the flash
                    shown = browser.get(posted.headers["location"]).text
                    assert "TASK_NOT_FOUND" in shown and f"no task &#39;{task_id}&#39;" in shown, (person, form)
                assert len(engine.history(task_id)) == seq  # nothing written
                continue
            assert page.status_code == 200, person
            menu = browser.get("/tasks").text  # the filter menus offer only workflows the person may read
            assert ('<option value="ticket_triage"' in menu) is (person in ("sam", "portal", "audrey")), person
            offered = 'value="propose_refund"' in page.text
            assert offered is may_fire(person, "eligible", "propose_refund"), person
            assert ('value="cancel"' in page.text) is may_fire(person, "eligible", CANCEL), person


def test_a_hand_off_is_work_for_an_operator_only_and_nobody_without_a_role_is_handed_any(
    api: tuple[Engine, FastAPI],
) -> None:
    engine, app = api
    task_id = to_hand_off(engine)
    client = TestClient(app)
    queue = {p: client.get("/api/work", headers=headers(p)).json() for p in PEOPLE}
    assert [i["task_id"] for i in queue["olga"]["items"]] == [task_id]
    assert queue["olga"]["items"][0]["triggers"] == ["reopen", "close", "cancel", "redrive"]
    assert queue["olga"]["total"] == {"yours": 1, "others": 0}
    assert queue["dana"]["items"] == [] and queue["dana"]["total"] == {"yours": 0, "others": 1}  # seen, not hers
    assert queue["aldo"]["total"] == {"yours": 0, "others": 1}  # an approver of the task's tenant: the same
    for person in ("bob", "sam", "gina"):  # another tenant's approver neither sees nor counts it
        assert queue[person]["items"] == [] and queue[person]["total"] == {"yours": 0, "others": 0}


class Lookup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: str


class Found(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool


def test_a_tool_is_told_who_started_the_task_who_proposed_the_call_and_the_tenant(db_url: str) -> None:
    """Tools receive the acting identity in their trusted context (`ToolInvocation.acting`), from the log: a tool
    guarding an object checks ownership against it, never against what the model wrote, and the task's tenant."""
    seen: list[Acting] = []

    def lookup(call: ToolInvocation) -> Found:
        seen.append(call.acting)
        return Found(ok=True)

    catalog = ToolCatalog("who", 1, [ToolDef("lookup", Lookup, Found, ToolKind.READ, lookup)])
    flow = Workflow(
        name="who",
        version=1,
        tools=catalog,
        operator_role="ops",
        model_override_role="ops",
        states=[
            Agent("asking", actions=[Action("lookup", "looking", Lookup, prepares="lookup"), Action("end", "done")]),
            Tool("looking", tool="lookup", on_succeeded="asking", on_failed="asking", on_unknown="asking"),
            Terminal("done"),
        ],
    )
    people = StaticRoles({"olga": {"ops"}}, tenants={"portal": {"acme"}})
    with Engine(db_url, Registry([flow]), authoriser=people) as engine:
        task_id = engine.start("who", actor="portal")
        engine.fire(task_id, "lookup", {"q": "by hand"}, actor="olga")  # standing in for the model
        engine.run(task_id, max_turns=1)  # the tool state only
        model = ScriptedModel([call("lookup", q="by the model")], profile="anthropic")
        engine.run(task_id, model=model, max_turns=2)
    assert seen == [Acting("portal", "olga", "acme"), Acting("portal", "model:scripted:scripted", "acme")]


def test_a_task_id_typed_short_is_resolved_among_what_the_caller_may_read(
    api: tuple[Engine, FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix shared with a task the caller may not read neither makes it ambiguous nor names that task."""
    import uuid

    from workflows.scripts import TICKET_DOUBLE_CHARGE_INPUT

    engine, app = api
    ids = ["b3678ff0-0000-4000-8000-000000000001", "b3678ff0-0000-4000-8000-000000000002"]
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(ids.pop(0)))
    refund_id = engine.start("refund", DAMAGED, actor="ann", version=1)
    ticket_id = engine.start("ticket_triage", TICKET_DOUBLE_CHARGE_INPUT, actor="helpdesk")
    client = TestClient(app)
    for person, expected in (("dana", refund_id), ("sam", ticket_id)):
        got = client.get("/api/tasks/b3678ff0", headers=headers(person))
        assert (got.status_code, got.json()["task_id"]) == (200, expected), person
    for person in ("bob", "portal"):  # bob reads neither; the portal reads both: ambiguous, both its own to see
        got = client.get("/api/tasks/b3678ff0", headers=headers(person))
        if person == "bob":
            assert (got.status_code, got.json()["code"]) == (404, "TASK_NOT_FOUND")
        else:
            assert (got.status_code, got.json()["code"]) == (409, "TASK_ID_AMBIGUOUS")
    audrey = client.get("/api/tasks/b3678ff0", headers=headers("audrey")).json()
    assert audrey["code"] == "TASK_ID_AMBIGUOUS" and refund_id in audrey["message"] and ticket_id in audrey["message"]
    with TestClient(app, follow_redirects=False) as browser:  # a page resolves first: it names no task
        login(browser, "dana")
        page = browser.get("/tasks/b3678ff0")
        assert page.status_code == 409 and refund_id not in page.text and ticket_id not in page.text
