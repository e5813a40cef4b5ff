"""ticket_triage@1 on SQLite and PostgreSQL: a read-only snapshot, then one TicketDecision forced out of the model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine import Code, Engine, RailyardError, ScriptedModel
from engine.providers.scripted import call
from tests.support import reference
from tests.support.reference import steps
from workflows import fakes
from workflows.fakes.seed import TICKETS

T5001 = {"ticket_id": "T-5001"}

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def answer(profile: str, name: str, **arguments: Any) -> dict[str, Any]:
    """A turn proposing `name` in the form the profile's rung reads: a tool call, or the JSON envelope."""
    if profile == "openai":
        return {"json": {"action": name, "arguments": arguments}}
    return call(name, **arguments)


def decision(
    verdict: str,
    ticket_id: str = "T-5001",
    reason: str = "Duplicate charge: billing must refund it.",
    profile: str = "anthropic",
) -> dict[str, Any]:
    return answer(profile, "decide", ticket_id=ticket_id, decision=verdict, reason=reason)


def triage(
    eng: Engine, turns: list[dict[str, Any]], *, profile: str = "anthropic", ticket: dict[str, str] = T5001
) -> tuple[str, ScriptedModel]:
    task_id = eng.start("ticket_triage", ticket, actor="helpdesk")
    model = ScriptedModel(turns, profile=profile)
    eng.run(task_id, model=model, max_turns=2 * len(turns))  # each turn, and a tool step after each read
    return task_id, model


# (profile, the rung a one-action state gets, the code of a prose answer on it)
LADDERS = [("anthropic", "named_tool", "NO_ACTION"), ("openai", "native_schema", "OUTPUT_NOT_JSON")]


@pytest.mark.parametrize(("profile", "rung", "code"), LADDERS)
def test_a_prose_answer_is_forced_into_a_ticket_decision(eng: Engine, profile: str, rung: str, code: str) -> None:
    task_id, model = triage(
        eng,
        [
            answer(profile, "query_ticket", ticket_id="T-5001"),
            {"text": "This customer was clearly double charged; someone in billing should look at it."},
            decision("ESCALATE", profile=profile),
        ],
        profile=profile,
    )
    assert eng.get(task_id).state == "human_queue"
    assert steps(eng, task_id) == [
        ("helpdesk", "start", "reading"),
        ("model", "query_ticket", "fetching_ticket"),
        ("system", "call", "fetching_ticket"),
        ("system", "succeeded", "deciding"),
        ("model", "repair", "deciding~force"),
        ("model", "decide", "human_queue"),
    ]
    events = eng.history(task_id)
    repair, decided = events[4].data["turn"], events[5].data
    assert (repair["strategy"], repair["code"]) == (rung, code)
    assert decided["turn"]["strategy"] == rung and decided["turn"]["code"] is None
    assert decided["args"] == {
        "ticket_id": "T-5001",
        "decision": "ESCALATE",
        "reason": "Duplicate charge: billing must refund it.",
    }
    # Only the one action was offered, and the error was fed back before the model answered again.
    forced = model.requests[-1]
    if rung == "named_tool":
        assert [t.name for t in forced.tools] == ["decide"] and forced.tool_choice == "decide"
    else:
        assert forced.response_schema is not None and forced.tools == ()
        assert forced.response_schema.schema["properties"]["action"]["enum"] == ["decide"]
    # The error was fed back, then the rung's instruction restated in the role the profile's provider obeys.
    assert code in forced.messages[-2].content
    assert "<system-reminder>" in forced.messages[-1].content
    assert forced.messages[-1].role == ("system" if profile == "openai" else "user")
    assert repair["escalated"] == {"from": rung, "to": rung, "step": "reminder", "why": code}


def test_a_decision_about_another_ticket_is_refused_and_repaired(eng: Engine) -> None:
    task_id, _ = triage(
        eng,
        [
            call("query_ticket", ticket_id="T-5001"),
            decision("RESOLVE", ticket_id="T-5002"),
            decision("RESOLVE", reason="Customer confirmed the duplicate was reversed by the bank."),
        ],
    )
    assert eng.get(task_id).state == "resolved"
    repair = eng.history(task_id)[4]
    assert (repair.trigger, repair.data["turn"]["code"]) == ("repair", "DOMAIN_INVALID")
    assert {e["msg"] for e in repair.data["turn"]["errors"]} == {
        "is_this_ticket: this task is about ticket T-5001, not T-5002"
    }  # no noise from the routing guards
    with pytest.raises(RailyardError) as caught:  # the same check holds for a person standing in for the model
        eng.fire(
            eng.start("ticket_triage", T5001, actor="helpdesk"), "query_ticket", {"ticket_id": "T-5003"}, actor="sam"
        )
    assert caught.value.code is Code.DOMAIN_INVALID


def test_escalate_routes_to_the_human_queue_where_only_support_decides(eng: Engine) -> None:
    task_id, _ = triage(eng, [call("query_ticket", ticket_id="T-5001"), decision("ESCALATE")])
    view = eng.get(task_id)
    assert (view.state, view.status) == ("human_queue", "blocked")
    with pytest.raises(RailyardError) as caught:
        eng.fire(task_id, "resolve", {"note": "done"}, actor="helpdesk")
    assert caught.value.code is Code.FORBIDDEN
    eng.fire(task_id, "resolve", {"note": "Second charge refunded by billing."}, actor="sam")
    assert eng.get(task_id).state == "resolved"


def test_request_info_waits_for_the_customer_and_their_answer_is_read_again(eng: Engine) -> None:
    task_id, _ = triage(
        eng,
        [
            call("query_ticket", ticket_id="T-5002"),
            decision("REQUEST_INFO", ticket_id="T-5002", reason="Which account email?"),
        ],
        ticket={"ticket_id": "T-5002"},
    )
    assert eng.get(task_id).state == "awaiting_customer"
    eng.fire(task_id, "customer_replied", {"note": "It is brook@example.com"}, actor="portal")
    assert eng.get(task_id).state == "reading"


def test_the_model_never_sees_phone_national_id_or_internal_notes(eng: Engine) -> None:
    task_id, model = triage(eng, [call("query_ticket", ticket_id="T-5001"), decision("ESCALATE")])
    snapshot = eng.get(task_id).facts["tool:query_ticket"]
    assert set(snapshot) == {"ticket_id", "subject", "body", "status", "priority", "product", "opened_at"}
    assert snapshot["subject"] == "Charged twice for one order"
    secrets = [TICKETS[0][k] for k in ("phone", "national_id", "internal_notes")]
    logged = json.dumps([e.data for e in eng.history(task_id)])
    sent = json.dumps([m.content for r in model.requests for m in r.messages])
    for secret in secrets:
        assert secret not in logged and secret not in sent
    full = fakes.systems().tickets.get("T-5001")
    assert (full.phone, full.national_id) == ("+44 20 7946 0958", "QQ123456C")  # the help desk has them


def test_a_ticket_that_cannot_be_read_is_shown_to_the_model_as_an_error(eng: Engine, books: fakes.Systems) -> None:
    books.arm("tickets.get", "unavailable")
    task_id, model = triage(
        eng, [call("query_ticket", ticket_id="T-5001"), call("query_ticket", ticket_id="T-5001"), decision("RESOLVE")]
    )
    assert [t for _, t, _ in steps(eng, task_id)] == [
        "start",
        "query_ticket",
        "call",
        "failed",
        "query_ticket",
        "call",
        "succeeded",
        "decide",
    ]
    assert '"error": "TOOL_REMOTE_ERROR"' in model.requests[1].messages[1].content
