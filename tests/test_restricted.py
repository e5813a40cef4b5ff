"""Restricted fields (issue #28): what a workflow shows only to the roles it names, on every surface.

The reference refund restricts the customer's message (input) and the payment provider's reference (the
`payments_refund` result's `refund_id`) to refund approvers and operators; ticket triage restricts the ticket's
body (the `query_ticket` result's `body`) to support agents. The customer portal reads both workflows and holds
neither role: it is the person each surface must not show them to. The auditor sees them (they prove the
history); the trusted process (no caller) sees everything. Each test asserts on the raw body of the answer, and
that the stored log is the same and still proves itself afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict
from typer.testing import CliRunner

from engine import (
    AUDITOR,
    RESTRICTED,
    Action,
    Agent,
    Caller,
    DefinitionError,
    Engine,
    Event,
    Restricted,
    ScriptedModel,
    Terminal,
    Tool,
    ToolCatalog,
    ToolDef,
    ToolInvocation,
    ToolKind,
    Wait,
    Workflow,
)
from engine.api import TokenTable, create_app
from engine.cli import app as cli
from engine.core.access import sees_restricted
from engine.core.canonical import GENESIS_HASH
from engine.core.payloads import as_event_data
from engine.core.visibility import withholding
from engine.providers.scripted import call
from tests.support import reference
from tests.support.api import login
from tests.support.reference import DAMAGED, refund
from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE, fakes

books, eng = reference.books, reference.eng  # the reference workflows' fixtures

#: The customer's words (refund input `message`, restricted): the secret every refund test looks for.
MESSAGE = DAMAGED["message"]
#: What the model's assessment says, quoting the customer: a copy of the restricted text in other words' company.
FINDING = f"The customer wrote: {MESSAGE}"
PEOPLE: dict[str, set[str]] = {
    "dana": {"refund_approver"},
    "olga": {"refund_operator"},
    "audrey": {AUDITOR},
    "portal": {"customer_portal"},
    "sam": {"support_agent"},
}
#: Who reads refunds and is shown their restricted fields, and who reads them without.
SEES = ("dana", "olga", "audrey")
HIDDEN_FROM = ("portal",)


# -- the declaration -----------------------------------------------------------------------------------------------
class Ask(BaseModel):
    model_config = ConfigDict(extra="forbid")
    email: str
    topic: str


class Lookup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: str


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid")
    number: str
    holder: str


def _lookup(call: ToolInvocation) -> Card:
    return Card(number="4111 1111 1111 1111", holder="A. Customer")


CARDS = ToolCatalog("cards", 1, [ToolDef("lookup_card", Lookup, Card, ToolKind.READ, _lookup)])


def asking(**options: Any) -> Workflow:
    return Workflow(
        name="asking",
        version=1,
        input=Ask,
        tools=CARDS,
        operator_role="ops",
        states=[
            Agent("reading", actions=[Action("look", "looking", Lookup, prepares="lookup_card")]),
            Tool("looking", tool="lookup_card", on_succeeded="done", on_failed="done", on_unknown="waiting"),
            Wait("waiting", actions=[Action("close", "done", role="ops")]),
            Terminal("done"),
        ],
        **options,
    )


def test_a_restriction_naming_what_the_workflow_does_not_have_does_not_validate_and_says_what() -> None:
    with pytest.raises(DefinitionError) as caught:
        asking(
            searchable=("topic",),
            restricted=Restricted(
                roles=("billing",),
                input=("email", "phone", "topic"),
                results=("lookup_card.cvv", "lookup_order", "lookup_card.number"),
            ),
        )
    assert caught.value.problems == [
        "restricted input field 'phone' is not a field of the input model",
        "restricted input field 'topic' is searchable: a search by its value would show whose task it is",
        "restricted result 'lookup_card.cvv': 'cvv' is not a field of lookup_card's result (Card)",
        "restricted result 'lookup_order': tool 'lookup_order' is not in the workflow's tool catalog",
    ]
    with pytest.raises(DefinitionError) as caught:
        asking(restricted=Restricted(input=("email",)))
    assert caught.value.problems == ["restricted fields name no role that may see them: set Restricted(roles=...)"]
    with pytest.raises(DefinitionError) as caught:
        asking(restricted=Restricted(roles=("anyone",), input=("email",)))
    assert caught.value.problems == ["restricted fields cannot be shown to ANYONE: name the roles that may see them"]


def test_a_restriction_is_presentation_it_names_readers_and_leaves_the_digest_alone() -> None:
    plain = asking()
    restricted = asking(restricted=Restricted(roles=("billing",), input=("email",), results=("lookup_card.number",)))
    assert restricted.digest == plain.digest  # tightening it applies to the tasks already running
    assert restricted.roles() == plain.roles() | {"billing"}  # who may see restricted fields reads the tasks
    assert restricted.restricted is not None
    assert restricted.restricted.result_fields("lookup_card") == frozenset({"number"})
    whole = Restricted(roles=("billing",), results=("lookup_card",))
    assert whole.result_fields("lookup_card") == frozenset() and whole.result_fields("other") is None


def test_the_reference_workflows_restrict_something_real_to_roles_they_name() -> None:
    for definition in (REFUND_V1, TICKET_TRIAGE, EXPENSE):
        assert definition.restricted is not None and definition.restricted.roles, definition.ref
        assert set(definition.restricted.roles) <= definition.roles() - {"anyone"}, definition.ref
    assert REFUND_V1.restricted is not None and REFUND_V1.restricted.input == ("message",)


# -- the pure decision ---------------------------------------------------------------------------------------------
def _event(seq: int, trigger: str, data: dict[str, Any]) -> Event:
    return Event(
        "t1",
        seq,
        datetime(2026, 12, 1, tzinfo=UTC),
        "x",
        None,
        trigger,
        "s",
        as_event_data(data),
        GENESIS_HASH,
        "h" * 64,
    )


def test_who_sees_restricted_fields_is_decided_in_one_place() -> None:
    wf = asking(restricted=Restricted(roles=("billing",), input=("email",)))
    assert sees_restricted(wf, None)  # the trusted process
    assert sees_restricted(wf, Caller("audrey", frozenset({AUDITOR})))
    assert sees_restricted(wf, Caller("bill", frozenset({"billing"})))
    assert not sees_restricted(wf, Caller("otto", frozenset({"ops"})))
    assert sees_restricted(asking(), Caller("otto", frozenset({"ops"})))  # nothing restricted
    assert withholding(wf, Caller("bill", frozenset({"billing"}))) is None


def test_restricted_values_and_their_copies_are_withheld_and_nothing_else_is() -> None:
    wf = asking(restricted=Restricted(roles=("billing",), input=("email",), results=("lookup_card.number",)))
    email, number = "someone@example.org", "4111 1111 1111 1111"
    hidden = withholding(wf, Caller("otto", frozenset({"ops"})))
    assert hidden is not None
    start = _event(1, "start", {"input": {"email": email, "topic": "card"}, "workflow": "asking@1"})
    shown = hidden.event(start)
    assert shown.data["input"] == {"email": RESTRICTED, "topic": "card"} and shown.hash == start.hash
    quoting = {
        "args": {"q": f"card of {email}"},
        "prepared": {"action_id": "a" * 32, "tool": "lookup_card", "digest": "d" * 64, "arguments": {"q": email}},
        "turn": {"messages": [{"role": "assistant", "content": "", "arguments": json.dumps({"q": email})}]},
    }
    data, paths = hidden.data(quoting)  # type: ignore[arg-type]
    assert email not in json.dumps(data)
    assert data["args"] == {"q": f"card of {RESTRICTED}"} and data["prepared"]["digest"] == "d" * 64
    assert paths == ("args.q", "prepared.arguments.q", "turn.messages.0.arguments")
    outcome = {
        "action_id": "a" * 32,
        "outcome": {"outcome": "succeeded", "result": {"number": number, "holder": "A. Customer"}},
        "tool_result": {"tool": "lookup_card", "result": {"number": number, "holder": "A. Customer"}},
    }
    data, paths = hidden.data(outcome)  # type: ignore[arg-type]
    assert data["tool_result"]["result"] == {"number": RESTRICTED, "holder": "A. Customer"}
    assert paths == ("tool_result.result.number", "outcome.result.number")
    short = withholding(asking(restricted=Restricted(roles=("billing",), input=("topic",))), Caller("otto"))
    assert short is not None
    short.learn(_event(1, "start", {"input": {"email": email, "topic": "card"}}))
    # Too short to look for in text (it would blank out other words): withheld where it is declared only.
    assert short.data(as_event_data({"args": {"q": "card"}})) == ({"args": {"q": "card"}}, ())


# -- the reference refund, on every surface ------------------------------------------------------------------------
@pytest.fixture
def api(eng: Engine) -> tuple[Engine, FastAPI]:
    tokens = TokenTable.from_tokens({f"tok-{p}": (p, roles) for p, roles in PEOPLE.items()})
    engine = Engine(store=eng.store, registry=eng.registry, authoriser=tokens)
    return engine, create_app(engine, tokens, session_secret="test")


def to_approval(engine: Engine) -> str:
    """A refund whose model quoted the customer's message in its assessment, waiting for an approver."""
    task_id = engine.start("refund", DAMAGED, actor="ann", version=1)
    turns = [
        call("query_order", order_id="O-1001"),
        call("assess_eligibility", order_id="O-1001", finding=FINDING),
        refund(5_000),  # twice in a test, each within the order's balance
    ]
    assert engine.run(task_id, model=ScriptedModel(turns, profile="anthropic")).state == "awaiting_approval"
    return task_id


def paid(engine: Engine) -> tuple[str, str]:
    """A refund approved and paid: its id, and the payment provider's reference (restricted)."""
    task_id = to_approval(engine)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    engine.approve(task_id, actor="dana", prepared_digest=digest)
    assert engine.run(task_id).state == "completed"
    receipt = engine.load(task_id).facts["tool:payments_refund"]
    return task_id, str(receipt["refund_id"])


def proves_itself(engine: Engine, task_id: str, before: list[Event]) -> None:
    assert engine.history(task_id) == before  # reads change nothing stored
    assert engine.replay(task_id).ok


def test_the_api_shows_restricted_values_only_to_the_roles_named_and_the_auditor(api: tuple[Engine, FastAPI]) -> None:
    engine, app = api
    client = TestClient(app)
    task_id, reference_id = paid(engine)
    waiting = to_approval(engine)
    stored = {t: engine.history(t) for t in (task_id, waiting)}
    assert MESSAGE in json.dumps([e.to_dict() for e in stored[task_id]])  # the log holds it, whole
    for person in (*SEES, *HIDDEN_FROM):
        headers = {"Authorization": f"Bearer tok-{person}"}
        bodies = [
            client.get(f"/api/tasks/{task_id}", headers=headers),
            client.get(f"/api/tasks/{task_id}/history", headers=headers),
            client.get(f"/api/tasks/{waiting}", headers=headers),
            client.get(f"/api/tasks/{waiting}/history", headers=headers),
            client.get("/api/approvals", headers=headers),
            client.get("/api/work", headers=headers),
        ]
        assert [b.status_code for b in bodies] == [200] * len(bodies), person
        text = "".join(b.text for b in bodies)
        seen = person in SEES
        assert (MESSAGE in text) is seen, person
        assert (reference_id in text) is seen, person
        assert (RESTRICTED in text) is not seen, person
        approvals = bodies[4].json()["approvals"]
        assert [a["task_id"] for a in approvals] == [waiting], person
        assert approvals[0]["input"]["message"] == (MESSAGE if seen else RESTRICTED)
        events = bodies[1].json()
        assert [e["hash"] for e in events] == [e.hash for e in stored[task_id]]  # the stored hashes, as stored
        assert events[0]["data"]["input"]["customer_id"] == "C-100"  # what is not restricted is shown
    for task in (task_id, waiting):
        proves_itself(engine, task, stored[task])


def test_a_command_answers_with_the_task_as_its_sender_may_see_it(api: tuple[Engine, FastAPI]) -> None:
    engine, app = api
    client = TestClient(app)
    task_id = engine.start("refund", DAMAGED, actor="ann", version=1)
    ask = call("request_more_info", question="Which order do you mean?")
    assert engine.run(task_id, model=ScriptedModel([ask], profile="anthropic")).state == "awaiting_customer"
    reply = {"trigger": "customer_replied", "payload": {"message": "Order O-1001."}}
    answered = client.post(f"/api/tasks/{task_id}/signal", json=reply, headers={"Authorization": "Bearer tok-portal"})
    assert answered.status_code == 200, answered.text
    assert MESSAGE not in answered.text and answered.json()["input"]["message"] == RESTRICTED
    assert engine.get(task_id).input["message"] == MESSAGE  # the trusted process reads it whole
    assert engine.replay(task_id).ok


def test_the_pages_show_restricted_values_only_to_the_roles_named_and_the_auditor(
    api: tuple[Engine, FastAPI],
) -> None:
    engine, app = api
    task_id, reference_id = paid(engine)
    waiting = to_approval(engine)
    asked = engine.start("refund", DAMAGED, actor="ann", version=1)  # waits on the portal: in its inbox
    ask = call("request_more_info", question="Which order do you mean?")
    assert engine.run(asked, model=ScriptedModel([ask], profile="anthropic")).state == "awaiting_customer"
    before = {t: engine.history(t) for t in (task_id, waiting, asked)}
    for person in (*SEES, *HIDDEN_FROM):
        with TestClient(app, follow_redirects=False) as browser:
            login(browser, person)
            pages = [browser.get(f"/tasks/{t}") for t in (task_id, waiting, asked)]
            pages.append(browser.get("/inbox"))
            assert [p.status_code for p in pages] == [200] * 4, person
            text = "".join(p.text for p in pages)
            seen = person in SEES
            assert (MESSAGE in text) is seen, person
            assert ("cracked screen" in text) is seen, person  # nor any copy of it (the model's quote)
            assert (reference_id in text) is seen, person
            assert (RESTRICTED in text) is not seen, person
    inbox = TestClient(app, follow_redirects=False)
    login(inbox, "portal")
    assert f"/tasks/{asked}" in inbox.get("/inbox").text  # the work is there, without the words
    for task, events in before.items():
        proves_itself(engine, task, events)


def test_ticket_bodies_are_shown_to_support_agents_and_not_to_the_portal(api: tuple[Engine, FastAPI]) -> None:
    engine, app = api
    task_id = engine.start("ticket_triage", {"ticket_id": "T-5001"}, actor="helpdesk")
    turns = [
        call("query_ticket", ticket_id="T-5001"),
        call("decide", ticket_id="T-5001", decision="ESCALATE", reason="Charged twice."),
    ]
    assert engine.run(task_id, model=ScriptedModel(turns, profile="anthropic"), max_turns=4).state == "human_queue"
    body = fakes.systems().tickets.get("T-5001").body
    client = TestClient(app)
    for person, seen in (("sam", True), ("audrey", True), ("portal", False)):
        headers = {"Authorization": f"Bearer tok-{person}"}
        text = client.get(f"/api/tasks/{task_id}", headers=headers).text
        text += client.get(f"/api/tasks/{task_id}/history", headers=headers).text
        with TestClient(app, follow_redirects=False) as browser:
            login(browser, person)
            text += browser.get(f"/tasks/{task_id}").text
        assert (body in text) is seen, person
        assert "Charged twice for one order" in text, person  # the subject is not restricted
    assert engine.replay(task_id).ok


# -- the CLI's reads --as, and exports ----------------------------------------------------------------------------
runner = CliRunner()


@pytest.fixture
def cli_env(eng: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The CLI on the reference fixtures' database, with PEOPLE's roles in its roles file."""
    roles = tmp_path / "roles.toml"
    lines = [f"{p} = {json.dumps(sorted(r))}" for p, r in PEOPLE.items()]
    roles.write_text("[users]\n" + "\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows")
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    yield eng


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_the_cli_reads_as_a_person_show_them_only_what_their_roles_may_see(cli_env: Engine) -> None:
    engine = cli_env
    task_id, reference_id = paid(engine)
    waiting = to_approval(engine)
    before = engine.history(task_id)
    reads = [
        ("show", task_id, "--json"),
        ("show", task_id),
        ("show", task_id, "--as-of", "2", "--json"),
        ("history", task_id, "--json"),
        ("history", task_id),
        ("approvals", "--json"),
        ("approvals",),
    ]
    for person in (None, *SEES, *HIDDEN_FROM):
        text = ""
        for read in reads:
            code, out, err = invoke(*read, *(("--as", person) if person else ()))
            assert code == 0, (person, read, err)
            text += out
        seen = person is None or person in SEES
        assert (MESSAGE in text) is seen, person
        assert (reference_id in text) is seen, person
        assert (RESTRICTED in text) is not seen, person
        assert waiting[:8] in text, person
        code, out, _ = invoke("show", task_id, *(("--as", person) if person else ()))
        assert (f'"message": "{RESTRICTED}"' in out) is not seen, out  # the table shows the marker as written
    code, _out, err = invoke("show", task_id, "--as", "sam")  # a person who may not read refunds at all
    assert code == 1 and err.startswith("TASK_NOT_FOUND") and f"no task '{task_id}'" in err
    code, out, _ = invoke("approvals", "--json", "--as", "sam")
    assert code == 0 and json.loads(out) == []
    proves_itself(engine, task_id, before)


def test_a_cli_command_prints_the_task_as_its_actor_may_see_it(cli_env: Engine) -> None:
    engine = cli_env
    task_id = engine.start("refund", DAMAGED, actor="ann", version=1)
    ask = call("request_more_info", question="Which order do you mean?")
    assert engine.run(task_id, model=ScriptedModel([ask], profile="anthropic")).state == "awaiting_customer"
    reply = json.dumps({"message": "Order O-1001."})
    code, out, err = invoke("fire", task_id, "customer_replied", "--payload", reply, "--as", "portal", "--json")
    assert code == 0, err
    assert MESSAGE not in out and json.loads(out)["input"]["message"] == RESTRICTED
    code, out, err = invoke("cancel", task_id, "--as", "olga", "--reason", "asked to stop", "--json")
    assert code == 0, err
    assert json.loads(out)["input"]["message"] == MESSAGE  # an operator is shown it
    assert engine.replay(task_id).ok


def test_an_export_made_for_a_person_without_the_role_withholds_and_says_so(cli_env: Engine, tmp_path: Path) -> None:
    engine = cli_env
    task_id, reference_id = paid(engine)
    before = engine.history(task_id)
    files = {}
    for person in (None, "audrey", "dana", "portal"):
        code, out, err = invoke("export", task_id, *(("--as", person) if person else ()))
        assert code == 0, (person, err)
        files[person] = tmp_path / f"{person}.jsonl"
        files[person].write_text(out, encoding="utf-8")
    assert files["audrey"].read_text() == files[None].read_text() == files["dana"].read_text()
    full, withheld = files[None].read_text(), files["portal"].read_text()
    assert MESSAGE in full and reference_id in full
    assert MESSAGE not in withheld and "cracked screen" not in withheld and reference_id not in withheld
    lines = [json.loads(line) for line in withheld.splitlines()]
    marked = {line["seq"]: line["withheld"] for line in lines if "withheld" in line}
    assert marked[1] == ["input.message"]  # the start event: the customer's words
    assert any("tool_result.result.refund_id" in paths for paths in marked.values())
    assert [line.get("hash") for line in lines] == [json.loads(line).get("hash") for line in full.splitlines()]

    code, out, _ = invoke("verify-export", str(files[None]), "--json")
    assert code == 0, out
    code, out, _ = invoke("verify-export", str(files["portal"]), "--json")
    assert code == 3  # it proves the chain's links, not the content it withholds
    found = [f for report in json.loads(out)["reports"] for f in report["findings"]]
    assert {f["code"] for f in found} == {"FIELDS_WITHHELD"}, found
    assert found[0]["seq"] == 1 and "input.message" in found[0]["message"]
    # A withheld line that was edited is still found: its link to the line after it no longer holds.
    edited = withheld.replace('"to_state":"collecting_information"', '"to_state":"eligible"', 1)
    (tmp_path / "edited.jsonl").write_text(edited, encoding="utf-8")
    code, out, _ = invoke("verify-export", str(tmp_path / "edited.jsonl"), "--json")
    codes = {f["code"] for report in json.loads(out)["reports"] for f in report["findings"]}
    assert code == 3 and codes - {"FIELDS_WITHHELD"}, codes

    code, out, err = invoke("export", "--all", "--as", "sam")  # sam reads tickets only: no refund is exported
    assert code == 0, err
    assert task_id not in out and json.loads(out.splitlines()[-1])["tasks"] == 0
    code, _out, err = invoke("export", task_id, "--as", "sam")
    assert code == 1 and err.startswith("TASK_NOT_FOUND")
    proves_itself(engine, task_id, before)
