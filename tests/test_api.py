"""The JSON API, in-process, on SQLite and PostgreSQL: every endpoint and every refusal code it can give."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import Code, Engine, Registry
from engine.api import STATUS_BY_CODE, create_app
from tests.support.api import (
    REFUND,
    SETTLED_BY_OPERATORS,
    bearer,
    documented,
    make_api_engine,
    make_app,
    to_approval,
    to_open_write,
    token_table,
)
from tests.support.sample_workflows import edited_refund_v1

ORDER = {"customer": "c1", "balance": 500}


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(make_app(engine)) as c:
        yield documented(c)  # every answer these tests provoke is one its operation documents


def refused(response: Any, status: int, code: Code) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == str(code), body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body.get("details"), dict)
    return body


def start(
    client: TestClient, workflow: str = "refund", input: dict[str, Any] | None = None, who: str = "ann", **extra: Any
) -> str:
    body = {"workflow": workflow, "input": ORDER if input is None else input, **extra}
    response = client.post("/api/tasks", json=body, headers=bearer(who))
    assert response.status_code == 201, response.text
    return str(response.json()["task_id"])


# -- the mapping ------------------------------------------------------------
def test_every_code_has_exactly_one_status_in_one_table() -> None:
    assert set(STATUS_BY_CODE) == set(Code)
    assert STATUS_BY_CODE[Code.TASK_NOT_FOUND] == STATUS_BY_CODE[Code.WORKFLOW_UNKNOWN] == 404
    assert STATUS_BY_CODE[Code.VERSION_UNKNOWN] == 404
    for code in (
        Code.CONCURRENCY_CONFLICT,
        Code.APPROVAL_STALE,
        Code.TASK_NOT_AWAITING_APPROVAL,
        Code.TASK_TERMINAL,
        Code.TRIGGER_NOT_ALLOWED,
    ):
        assert STATUS_BY_CODE[code] == 409
    assert STATUS_BY_CODE[Code.FORBIDDEN] == STATUS_BY_CODE[Code.APPROVAL_FORBIDDEN] == 403
    assert STATUS_BY_CODE[Code.PAYLOAD_INVALID] == STATUS_BY_CODE[Code.DOMAIN_INVALID] == 422
    assert STATUS_BY_CODE[Code.ACTOR_REQUIRED] == 401


# -- authentication -----------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic dG9rLWFubg=="}, {"Authorization": "Bearer "}],
)
def test_reads_and_writes_need_a_known_bearer_token(client: TestClient, headers: dict[str, str]) -> None:
    for method, url, body in [
        ("GET", "/api/workflows", None),
        ("GET", "/api/approvals", None),
        ("POST", "/api/tasks", {"workflow": "refund", "input": ORDER}),
    ]:
        response = client.request(method, url, json=body, headers=headers)
        refused(response, 401, Code.ACTOR_REQUIRED)
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/api/tasks", headers=bearer("ann")).json()["tasks"] == []  # nothing was started


def test_whoami_names_the_tokens_actor_and_roles(client: TestClient) -> None:
    assert client.get("/api/me", headers=bearer("dana")).json() == {
        "actor": "dana",
        "roles": ["approver", "refund_approver"],
        "read_only": False,
        "tenants": None,
    }
    assert client.get("/api/me", headers=bearer("audrey")).json()["read_only"] is True


def test_an_auditor_token_reads_everything_and_writes_nothing(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    for url in (
        "/api/workflows",
        "/api/approvals",
        "/api/tasks",
        f"/api/tasks/{task_id}",
        f"/api/tasks/{task_id}/history",
        f"/api/tasks/{task_id}/replay",
        f"/api/tasks/{task_id}/diagram",
    ):
        assert client.get(url, headers=bearer("audrey")).status_code == 200, url
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    writes = [
        ("/api/tasks", {"workflow": "refund", "input": ORDER}),
        (f"/api/tasks/{task_id}/approve", {"digest": digest}),
        (f"/api/tasks/{task_id}/reject", {"reason": "no"}),
        (f"/api/tasks/{task_id}/cancel", {"reason": "no"}),
        (f"/api/tasks/{task_id}/signal", {"trigger": "cancel", "payload": {"reason": "no"}}),
    ]
    for url, body in writes:
        assert (
            refused(client.post(url, json=body, headers=bearer("audrey")), 403, Code.FORBIDDEN)["details"]["reason"]
            == "read_only"
        )
    assert len(engine.history(task_id)) == 5


# -- start, get, list, history ---------------------------------------------------
def test_start_records_the_tokens_actor_never_one_from_the_body(client: TestClient, engine: Engine) -> None:
    response = client.post(
        "/api/tasks", json={"workflow": "refund", "version": 1, "input": ORDER}, headers=bearer("ann")
    )
    assert response.status_code == 201
    body = response.json()
    assert response.headers["Location"] == f"/api/tasks/{body['task_id']}"
    assert (body["workflow"], body["version"], body["state"], body["status"]) == ("refund", 1, "assessing", "runnable")
    assert engine.history(body["task_id"])[0].actor == "ann"
    sneaky = client.post(
        "/api/tasks", json={"workflow": "refund", "input": ORDER, "actor": "dana"}, headers=bearer("ann")
    )
    assert refused(sneaky, 422, Code.PAYLOAD_INVALID)["details"]["errors"][0]["loc"] == ["body", "actor"]
    assert len(client.get("/api/tasks", headers=bearer("ann")).json()["tasks"]) == 1


def test_start_refusals(client: TestClient) -> None:
    refused(client.post("/api/tasks", json={"workflow": "nope"}, headers=bearer("ann")), 404, Code.WORKFLOW_UNKNOWN)
    refused(
        client.post("/api/tasks", json={"workflow": "refund", "version": 9, "input": ORDER}, headers=bearer("ann")),
        404,
        Code.VERSION_UNKNOWN,
    )
    refused(
        client.post(
            "/api/tasks", json={"workflow": "refund", "input": {"customer": "c1", "balance": -1}}, headers=bearer("ann")
        ),
        422,
        Code.PAYLOAD_INVALID,
    )
    refused(client.post("/api/tasks", json={"workflow": "Refund!"}, headers=bearer("ann")), 422, Code.PAYLOAD_INVALID)
    refused(
        client.post("/api/tasks", content=b"not json", headers={**bearer("ann"), "Content-Type": "application/json"}),
        422,
        Code.PAYLOAD_INVALID,
    )


def test_get_and_history(client: TestClient) -> None:
    task_id = start(client)
    view = client.get(f"/api/tasks/{task_id}", headers=bearer("bob")).json()
    assert view["state"] == "assessing" and "propose" in view["allowed"] and view["input"] == ORDER
    events = client.get(f"/api/tasks/{task_id}/history", headers=bearer("bob")).json()
    assert [(e["seq"], e["trigger"], e["actor"]) for e in events] == [(1, "start", "ann")]
    assert len(events[0]["hash"]) == 64 and events[0]["data"]["workflow"] == "refund@2"
    for url in (
        "/api/tasks/no-such-task",
        "/api/tasks/no-such-task/history",
        "/api/tasks/no-such-task/replay",
        "/api/tasks/no-such-task/diagram",
    ):
        refused(client.get(url, headers=bearer("bob")), 404, Code.TASK_NOT_FOUND)
    refused(client.get("/api/tasks/%20bad%20id", headers=bearer("bob")), 422, Code.PAYLOAD_INVALID)


def test_the_task_list_filters_by_workflow_state_and_status(client: TestClient, engine: Engine) -> None:
    first = start(client)
    second = start(client, "counter", {})
    waiting = to_approval(engine)
    client.post(f"/api/tasks/{second}/signal", json={"trigger": "finish"}, headers=bearer("ann"))

    def ids(**query: str) -> set[str]:
        response = client.get("/api/tasks", params=query, headers=bearer("audrey"))
        assert response.status_code == 200, response.text
        return {t["task_id"] for t in response.json()["tasks"]}

    assert ids() == {first, second, waiting}
    assert ids(workflow="counter") == {second}
    assert ids(status="terminal") == {second}
    assert ids(state="awaiting_approval") == {waiting}
    assert ids(workflow="refund", status="runnable") == {first}
    assert ids(workflow="refund", state="done") == set()
    refused(client.get("/api/tasks", params={"status": "lost"}, headers=bearer("ann")), 422, Code.PAYLOAD_INVALID)


# -- signal and cancel ------------------------------------------------------------
def test_signal_fires_a_trigger_as_the_tokens_actor(client: TestClient, engine: Engine) -> None:
    task_id = start(client)
    response = client.post(
        f"/api/tasks/{task_id}/signal",
        json={"trigger": "propose", "payload": {"amount": 300, "reason": "damaged"}, "expected_seq": 1},
        headers=bearer("olga"),
    )
    assert response.status_code == 200, response.text
    assert (response.json()["state"], response.json()["seq"]) == ("awaiting_approval", 2)
    assert engine.history(task_id)[-1].actor == "olga"


def test_signal_refusals_each_with_its_code_and_the_log_unchanged(client: TestClient, engine: Engine) -> None:
    task_id = start(client)

    def signal(trigger: str, payload: dict[str, Any] | None = None, who: str = "ann", **extra: Any) -> Any:
        return client.post(
            f"/api/tasks/{task_id}/signal", json={"trigger": trigger, "payload": payload, **extra}, headers=bearer(who)
        )

    refused(signal("propose", {"amount": "lots", "reason": "x"}), 422, Code.PAYLOAD_INVALID)
    refused(signal("propose", {"amount": 900, "reason": "x"}), 422, Code.DOMAIN_INVALID)
    refused(signal("propose", {"amount": 50, "reason": "x", "actor": "dana"}), 422, Code.IDENTITY_OVERRIDE)
    refused(signal("resume"), 409, Code.TRIGGER_NOT_ALLOWED)
    refused(signal("repair"), 403, Code.FORBIDDEN)  # a system trigger: never from a caller
    refused(signal("succeeded"), 409, Code.TRIGGER_NOT_ALLOWED)
    refused(signal("approve"), 409, Code.TRIGGER_NOT_ALLOWED)  # decisions go through /approve
    refused(signal("note", {"note": "hi"}, expected_seq=7), 409, Code.CONCURRENCY_CONFLICT)
    refused(signal("note", {"note": "hi"}, actor="dana"), 422, Code.PAYLOAD_INVALID)
    refused(
        client.post("/api/tasks/nope/signal", json={"trigger": "note"}, headers=bearer("ann")), 404, Code.TASK_NOT_FOUND
    )
    assert len(engine.history(task_id)) == 1
    client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "stop"}, headers=bearer("ann"))
    refused(signal("note", {"note": "hi"}), 409, Code.TASK_TERMINAL)


def test_a_role_the_transition_needs_comes_from_the_tokens_file(client: TestClient) -> None:
    task_id = start(client, "triage", {"ticket_id": "T-1"})
    decided = client.post(
        f"/api/tasks/{task_id}/signal",
        headers=bearer("ann"),
        json={"trigger": "decide", "payload": {"ticket_id": "T-1", "decision": "ESCALATE", "reason": "angry customer"}},
    )
    assert decided.json()["state"] == "escalation_review"
    refused(
        client.post(f"/api/tasks/{task_id}/signal", json={"trigger": "confirm"}, headers=bearer("bob")),
        403,
        Code.FORBIDDEN,
    )
    confirmed = client.post(f"/api/tasks/{task_id}/signal", json={"trigger": "confirm"}, headers=bearer("dana"))
    assert confirmed.status_code == 200 and confirmed.json()["state"] == "decided"


def test_cancel(client: TestClient, engine: Engine) -> None:
    task_id = start(client)
    response = client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "customer withdrew"}, headers=bearer("bob"))
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    last = engine.history(task_id)[-1]
    assert (last.actor, last.data["args"]) == ("bob", {"reason": "customer withdrew"})
    refused(
        client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "again"}, headers=bearer("bob")),
        409,
        Code.TASK_TERMINAL,
    )
    refused(
        client.post(f"/api/tasks/{task_id}/cancel", json={"reason": ""}, headers=bearer("bob")),
        422,
        Code.PAYLOAD_INVALID,
    )
    refused(
        client.post("/api/tasks/nope/cancel", json={"reason": "x"}, headers=bearer("bob")), 404, Code.TASK_NOT_FOUND
    )


# -- ETag, If-Match and expected_seq: commands act on the state their sender saw ------------------------
def etag(seq: int) -> dict[str, str]:
    return {"If-Match": f'"{seq}"'}


def tagged(response: Any) -> dict[str, Any]:
    """The task body of a response, checked to carry its seq as a strong ETag."""
    assert response.status_code in (200, 201), response.text
    body: dict[str, Any] = response.json()
    assert response.headers["ETag"] == f'"{body["seq"]}"'
    return body


def test_every_task_response_carries_its_seq_as_the_etag(client: TestClient, engine: Engine) -> None:
    started = client.post("/api/tasks", json={"workflow": "refund", "input": ORDER}, headers=bearer("ann"))
    assert tagged(started)["seq"] == 1 and started.headers["ETag"] == '"1"'
    task_id = started.json()["task_id"]
    read = tagged(client.get(f"/api/tasks/{task_id}", headers=bearer("audrey")))
    assert read["seq"] == engine.load(task_id).seq and (read["cancel_requested"], read["unsettled"]) == (None, None)
    signalled = tagged(
        client.post(
            f"/api/tasks/{task_id}/signal", json={"trigger": "note", "payload": {"note": "n"}}, headers=bearer("ann")
        )
    )
    assert signalled["seq"] == 2
    assert (
        tagged(client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "r"}, headers=bearer("ann")))["state"]
        == "cancelled"
    )
    waiting = to_approval(engine)
    digest = engine.load(waiting).prepared["digest"]  # type: ignore[index]
    assert (
        tagged(client.post(f"/api/tasks/{waiting}/approve", json={"digest": digest}, headers=bearer("dana")))["state"]
        == "executing"
    )
    other = to_approval(engine)
    assert (
        tagged(client.post(f"/api/tasks/{other}/reject", json={"reason": "no"}, headers=bearer("erin")))["state"]
        == "rejected"
    )
    # Refusals are about the request, not a task representation: no ETag on them.
    assert "ETag" not in client.get("/api/tasks/nope", headers=bearer("ann")).headers


def test_a_stale_if_match_is_412_names_the_state_now_and_writes_nothing(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    seq = engine.load(task_id).seq
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    commands = [
        ("approve", {"digest": digest}, "dana"),
        ("reject", {"reason": "no"}, "erin"),
        ("cancel", {"reason": "stop"}, "ann"),
        ("signal", {"trigger": "cancel", "payload": {"reason": "x"}}, "ann"),
    ]
    for command, body, who in commands:
        stale = client.post(f"/api/tasks/{task_id}/{command}", json=body, headers={**bearer(who), **etag(seq - 1)})
        details = refused(stale, 412, Code.CONCURRENCY_CONFLICT)["details"]
        assert (details["state"], details["actual"], details["expected"]) == ("awaiting_approval", seq, seq - 1)
        assert "'awaiting_approval'" in stale.json()["message"], command
        assert "ETag" not in stale.headers
    assert engine.load(task_id).seq == seq  # nothing was written
    approved = client.post(
        f"/api/tasks/{task_id}/approve", json={"digest": digest}, headers={**bearer("dana"), **etag(seq)}
    )
    assert tagged(approved)["seq"] == seq + 1 and approved.json()["state"] == "executing"
    late = client.post(
        f"/api/tasks/{task_id}/cancel", json={"reason": "too late"}, headers={**bearer("ann"), **etag(seq)}
    )
    assert refused(late, 412, Code.CONCURRENCY_CONFLICT)["details"]["state"] == "executing"
    assert engine.load(task_id).seq == seq + 1 and engine.replay(task_id).ok


def test_a_current_if_match_applies_each_command(client: TestClient, engine: Engine) -> None:
    task_id = start(client)
    noted = client.post(
        f"/api/tasks/{task_id}/signal",
        json={"trigger": "note", "payload": {"note": "n"}},
        headers={**bearer("ann"), **etag(1)},
    )
    assert tagged(noted)["seq"] == 2
    cancelled = client.post(
        f"/api/tasks/{task_id}/cancel",
        json={"reason": "done"},
        headers={**bearer("ann"), "If-Match": noted.headers["ETag"]},
    )
    assert tagged(cancelled)["state"] == "cancelled"
    waiting = to_approval(engine)
    seq = engine.load(waiting).seq
    rejected = client.post(
        f"/api/tasks/{waiting}/reject", json={"reason": "no"}, headers={**bearer("erin"), **etag(seq)}
    )
    assert tagged(rejected)["state"] == "rejected"


def test_if_match_star_is_no_precondition(client: TestClient) -> None:
    task_id = start(client)
    client.post(
        f"/api/tasks/{task_id}/signal", json={"trigger": "note", "payload": {"note": "n"}}, headers=bearer("ann")
    )
    response = client.post(
        f"/api/tasks/{task_id}/cancel", json={"reason": "any seq"}, headers={**bearer("ann"), "If-Match": "*"}
    )
    assert tagged(response)["state"] == "cancelled"


@pytest.mark.parametrize(
    "value", ['W/"1"', "1", '"1", "2"', '"0"', '"01"', '"abc"', '""', '"1', f'"{2**31}"', '"99999999999"']
)
def test_an_if_match_that_is_not_a_task_etag_is_refused(client: TestClient, value: str) -> None:
    task_id = start(client)
    response = client.post(
        f"/api/tasks/{task_id}/cancel", json={"reason": "x"}, headers={**bearer("ann"), "If-Match": value}
    )
    refused(response, 422, Code.PAYLOAD_INVALID)
    assert client.get(f"/api/tasks/{task_id}", headers=bearer("ann")).json()["seq"] == 1


def test_if_match_and_a_body_expected_seq_must_agree(client: TestClient) -> None:
    task_id = start(client)
    url = f"/api/tasks/{task_id}/signal"
    disagree = client.post(
        url, json={"trigger": "note", "payload": {"note": "n"}, "expected_seq": 1}, headers={**bearer("ann"), **etag(2)}
    )
    assert refused(disagree, 422, Code.PAYLOAD_INVALID)["details"]["header"] == "If-Match"
    # The same seq in both: the header's answer (412), since the header carried it.
    both_stale = client.post(
        url, json={"trigger": "note", "payload": {"note": "n"}, "expected_seq": 5}, headers={**bearer("ann"), **etag(5)}
    )
    refused(both_stale, 412, Code.CONCURRENCY_CONFLICT)
    agree = client.post(
        url, json={"trigger": "note", "payload": {"note": "n"}, "expected_seq": 1}, headers={**bearer("ann"), **etag(1)}
    )
    assert tagged(agree)["seq"] == 2


def test_a_stale_body_expected_seq_is_409_on_every_command(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    seq = engine.load(task_id).seq
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    for command, body, who in [
        ("approve", {"digest": digest}, "dana"),
        ("reject", {"reason": "no"}, "erin"),
        ("cancel", {"reason": "stop"}, "ann"),
        ("signal", {"trigger": "cancel", "payload": {"reason": "x"}}, "ann"),
    ]:
        response = client.post(
            f"/api/tasks/{task_id}/{command}", json={**body, "expected_seq": seq + 3}, headers=bearer(who)
        )
        details = refused(response, 409, Code.CONCURRENCY_CONFLICT)["details"]
        assert (details["state"], details["actual"]) == ("awaiting_approval", seq), command
    assert engine.load(task_id).seq == seq
    current = client.post(
        f"/api/tasks/{task_id}/approve", json={"digest": digest, "expected_seq": seq}, headers=bearer("dana")
    )
    assert tagged(current)["state"] == "executing"
    for body in (
        {"reason": "x", "expected_seq": 0},
        {"reason": "x", "expected_seq": 1.5},
        {"reason": "x", "expected_seq": 2**31},
    ):
        refused(
            client.post(f"/api/tasks/{task_id}/cancel", json=body, headers=bearer("ann")), 422, Code.PAYLOAD_INVALID
        )


# -- settle: an operator records what became of a write whose outcome is open ---------------------------------
def test_settle_records_an_operators_assertion_and_its_refusals(client: TestClient, engine: Engine) -> None:
    task_id = to_open_write(engine)
    url = f"/api/tasks/{task_id}/settle"
    view = tagged(client.get(f"/api/tasks/{task_id}", headers=bearer("audrey")))
    assert view["state"] == "executing" and "settle" in view["allowed"]
    assert view["unsettled"] == {
        "action_id": view["unsettled"]["action_id"],
        "tool": "refund_payment",
        "state": "executing",
        "status": "pending",
    }
    seq = view["seq"]
    ok = {"outcome": "not_executed", "evidence": "the provider's dashboard has no refund for this action id"}
    refused(client.post(url, json=ok, headers=bearer("bob")), 403, Code.FORBIDDEN)  # no operator role
    assert (
        refused(client.post(url, json=ok, headers=bearer("audrey")), 403, Code.FORBIDDEN)["details"]["reason"]
        == "read_only"
    )
    for bad in (
        {"outcome": "maybe", "evidence": "x"},
        {"outcome": "executed", "evidence": ""},
        {"outcome": "executed", "evidence": "x" * 501},
        {"outcome": "executed"},
        {**ok, "actor": "dana"},
    ):
        refused(client.post(url, json=bad, headers=bearer("olga")), 422, Code.PAYLOAD_INVALID)
    refused(client.post(url, json=ok, headers={**bearer("olga"), **etag(seq - 1)}), 412, Code.CONCURRENCY_CONFLICT)
    refused(
        client.post(url, json={**ok, "expected_seq": seq - 1}, headers=bearer("olga")), 409, Code.CONCURRENCY_CONFLICT
    )
    refused(client.post("/api/tasks/nope/settle", json=ok, headers=bearer("olga")), 404, Code.TASK_NOT_FOUND)
    assert engine.load(task_id).seq == seq  # every refusal above left the log alone

    settled = tagged(client.post(url, json=ok, headers={**bearer("olga"), **etag(seq)}))
    assert (settled["seq"], settled["state"], settled["unsettled"]) == (seq + 1, "executing", None)
    last = engine.history(task_id)[-1]
    assert (last.actor, last.trigger, last.data["settled"]["outcome"]) == ("olga", "settle", "not_executed")
    assert last.data["settled"]["evidence"] == ok["evidence"]
    again = client.post(url, json=ok, headers=bearer("olga"))  # nothing is open any more
    refused(again, 409, Code.TRIGGER_NOT_ALLOWED)
    assert engine.replay(task_id).ok


def test_a_cancel_while_a_write_is_open_is_requested_and_settling_completes_it(
    client: TestClient, engine: Engine
) -> None:
    task_id = to_open_write(engine)
    seq = engine.load(task_id).seq
    requested = tagged(
        client.post(
            f"/api/tasks/{task_id}/cancel", json={"reason": "customer called"}, headers={**bearer("ann"), **etag(seq)}
        )
    )
    assert requested["state"] == "executing" and requested["seq"] == seq + 1
    assert {k: requested["cancel_requested"][k] for k in ("actor", "reason", "seq")} == {
        "actor": "ann",
        "reason": "customer called",
        "seq": seq + 1,
    }
    assert isinstance(requested["cancel_requested"]["at"], str)
    settled = tagged(
        client.post(
            f"/api/tasks/{task_id}/settle",
            json={"outcome": "not_executed", "evidence": "no refund in the books"},
            headers={**bearer("olga"), "If-Match": f'"{seq + 1}"'},
        )
    )
    assert (settled["state"], settled["cancel_requested"], settled["unsettled"]) == ("cancelled", None, None)
    assert engine.replay(task_id).ok


# -- approvals ------------------------------------------------------------------------
def test_pending_approvals_show_the_prepared_call_and_filter_by_role(client: TestClient, engine: Engine) -> None:
    shop = to_approval(engine)
    sample = start(client)
    client.post(
        f"/api/tasks/{sample}/signal",
        json={"trigger": "propose", "payload": {"amount": 300, "reason": "r"}},
        headers=bearer("ann"),
    )
    everything = client.get("/api/approvals", headers=bearer("bob")).json()["approvals"]
    assert {p["task_id"] for p in everything} == {shop, sample}
    mine = client.get("/api/approvals", params={"role": "refund_approver"}, headers=bearer("dana")).json()["approvals"]
    assert [p["task_id"] for p in mine] == [shop]
    assert mine[0]["prepared"]["arguments"]["amount_cents"] == 4_000
    assert mine[0]["digest"] == mine[0]["prepared"]["digest"]
    assert client.get("/api/approvals", params={"role": "nobody"}, headers=bearer("dana")).json()["approvals"] == []


def test_approve_with_the_digest_records_the_tokens_actor(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    digest = client.get("/api/approvals", headers=bearer("dana")).json()["approvals"][0]["digest"]
    response = client.post(
        f"/api/tasks/{task_id}/approve", json={"digest": digest, "comment": "photos ok"}, headers=bearer("dana")
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "executing"
    last = engine.history(task_id)[-1]
    assert last.actor == "dana"
    assert last.data["approval"] == {
        "actor": "dana",
        "role": "refund_approver",
        "decision": "approve",
        "comment": "photos ok",
        "digest": digest,
    }
    assert engine.run(task_id).state == "completed"


def test_approval_refusals_each_with_its_code_and_one_decision_at_most(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    own = to_approval(engine, starter="dana")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    approve = f"/api/tasks/{task_id}/approve"
    refused(client.post(approve, json={"digest": "0" * 64}, headers=bearer("dana")), 409, Code.APPROVAL_STALE)
    refused(client.post(approve, json={"digest": digest}, headers=bearer("bob")), 403, Code.APPROVAL_FORBIDDEN)
    own_digest = engine.load(own).prepared["digest"]  # type: ignore[index]
    self_approval = client.post(f"/api/tasks/{own}/approve", json={"digest": own_digest}, headers=bearer("dana"))
    assert refused(self_approval, 403, Code.APPROVAL_FORBIDDEN)["details"]["reason"] == "self_approval"
    refused(
        client.post(approve, json={"comment": "no digest named"}, headers=bearer("dana")), 422, Code.PAYLOAD_INVALID
    )
    refused(
        client.post(approve, json={"digest": digest, "actor": "erin"}, headers=bearer("dana")),
        422,
        Code.PAYLOAD_INVALID,
    )
    refused(
        client.post("/api/tasks/nope/approve", json={"digest": digest}, headers=bearer("dana")),
        404,
        Code.TASK_NOT_FOUND,
    )
    assert len(engine.history(task_id)) == 5
    assert client.post(approve, json={"digest": digest}, headers=bearer("dana")).status_code == 200
    refused(client.post(approve, json={"digest": digest}, headers=bearer("erin")), 409, Code.TASK_NOT_AWAITING_APPROVAL)
    assert [e.trigger for e in engine.history(task_id) if "approval" in e.data] == ["approve"]


def test_reject(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    refused(
        client.post(f"/api/tasks/{task_id}/reject", json={"reason": "no"}, headers=bearer("bob")),
        403,
        Code.APPROVAL_FORBIDDEN,
    )
    response = client.post(f"/api/tasks/{task_id}/reject", json={"reason": "not our fault"}, headers=bearer("erin"))
    assert response.status_code == 200 and response.json()["state"] == "rejected"
    assert engine.history(task_id)[-1].data["approval"]["comment"] == "not our fault"
    refused(
        client.post(f"/api/tasks/{task_id}/reject", json={"reason": "again"}, headers=bearer("erin")),
        409,
        Code.TASK_NOT_AWAITING_APPROVAL,
    )
    refused(client.post(f"/api/tasks/{task_id}/reject", json={}, headers=bearer("erin")), 422, Code.PAYLOAD_INVALID)


# -- workflows, diagrams, replay ------------------------------------------------------
def test_workflows_and_versions(client: TestClient, engine: Engine) -> None:
    listed = {w["name"]: w for w in client.get("/api/workflows", headers=bearer("bob")).json()}
    assert set(listed) == {"shop_refund", SETTLED_BY_OPERATORS, "refund", "counter", "triage"}
    assert listed["refund"]["newest"] == 2 and [v["version"] for v in listed["refund"]["versions"]] == [1, 2]
    one = client.get("/api/workflows/refund", headers=bearer("bob")).json()
    assert one["versions"][0]["digest"] == engine.registry.get("refund", 1).digest
    refused(client.get("/api/workflows/nope", headers=bearer("bob")), 404, Code.WORKFLOW_UNKNOWN)
    diagram = client.get("/api/workflows/refund/diagram", params={"version": 1}, headers=bearer("bob")).json()
    assert diagram["format"] == "mermaid" and "stateDiagram" in diagram["diagram"]
    assert "awaiting_approval --> executing: approve" in diagram["diagram"]
    refused(
        client.get("/api/workflows/refund/diagram", params={"version": 7}, headers=bearer("bob")),
        404,
        Code.VERSION_UNKNOWN,
    )
    refused(client.get("/api/workflows/nope/diagram", headers=bearer("bob")), 404, Code.WORKFLOW_UNKNOWN)


def test_a_tasks_diagram_shows_the_path_it_took(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    body = client.get(f"/api/tasks/{task_id}/diagram", headers=bearer("bob")).json()
    assert body["current"] == "awaiting_approval"
    assert [(s["from_state"], s["trigger"], s["to_state"]) for s in body["path"]] == [
        ("collecting", "query_order", "querying"),
        ("querying", "call", "querying"),
        ("querying", "succeeded", "collecting"),
        ("collecting", "propose_refund", "awaiting_approval"),
    ]
    taken = [line for line in body["diagram"].splitlines() if "propose_refund" in line and "collecting -->" in line]
    assert taken and "1" in taken[0]  # the edge taken carries its count


def test_replay_checks_the_log(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    report = client.get(f"/api/tasks/{task_id}/replay", headers=bearer("audrey")).json()
    assert report == {
        "task_id": task_id,
        "workflow": "shop_refund",
        "version": 1,
        "events": 5,
        "ok": True,
        "findings": [],
    }


def test_a_task_pinned_to_a_version_this_server_lacks_is_a_409(db_url: str, engine: Engine, tmp_path: Path) -> None:
    task_id = engine.start("refund", ORDER, actor="ann", version=1)
    changed = edited_refund_v1()
    for registry, code in ((Registry([]), Code.DEFINITION_MISSING), (Registry([changed]), Code.DEFINITION_CHANGED)):
        with (
            Engine(db_url, registry, authoriser=token_table()) as other,
            TestClient(create_app(other, token_table())) as client,
        ):
            documented(client)
            if code is Code.DEFINITION_MISSING:
                # No definition here names a role of bob's: the task is absent to him (deny by default); the
                # auditor, who reads everything, is told why it cannot be read.
                refused(client.get(f"/api/tasks/{task_id}", headers=bearer("bob")), 404, Code.TASK_NOT_FOUND)
                refused(client.get(f"/api/tasks/{task_id}", headers=bearer("audrey")), 409, code)
                cancel = client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "x"}, headers=bearer("bob"))
                refused(cancel, 404, Code.TASK_NOT_FOUND)
                continue
            refused(client.get(f"/api/tasks/{task_id}", headers=bearer("bob")), 409, code)
            refused(client.post(f"/api/tasks/{task_id}/cancel", json={"reason": "x"}, headers=bearer("bob")), 409, code)


def test_a_database_without_the_schema_is_a_503(tmp_path: Path) -> None:
    with (
        Engine(f"sqlite:///{tmp_path / 'empty.db'}", Registry([]), authoriser=token_table()) as bare,
        TestClient(create_app(bare, token_table())) as client,
    ):
        documented(client)
        refused(client.get("/api/tasks/abc", headers=bearer("bob")), 503, Code.SCHEMA_MISSING)
        refused(client.get("/api/tasks", headers=bearer("bob")), 503, Code.SCHEMA_MISSING)


def test_a_database_that_does_not_answer_is_a_503_that_names_no_host_or_user() -> None:
    url = "postgresql+psycopg://railyard_app:pw-h3@127.0.0.1:1/railyard"
    with (
        Engine(url, Registry([]), authoriser=token_table()) as away,
        TestClient(create_app(away, token_table())) as client,
    ):
        documented(client)
        body = refused(client.get("/api/tasks", headers=bearer("bob")), 503, Code.DATABASE_UNREACHABLE)
    for detail in ("127.0.0.1", "railyard_app", "pw-h3"):  # in the server's log, not in the caller's answer
        assert detail not in str(body), body


# -- the rest of HTTP ---------------------------------------------------------------------
def test_unknown_routes_and_methods_answer_json_without_a_code(client: TestClient) -> None:
    response = client.get("/api/nothing-here", headers=bearer("ann"))
    assert response.status_code == 404 and response.json()["code"] is None
    assert client.delete("/api/tasks", headers=bearer("ann")).status_code == 405


def test_the_openapi_document_lists_every_endpoint(client: TestClient) -> None:
    doc = client.get("/api/openapi.json").json()
    operations = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    assert operations == {
        ("GET", "/api/me"),
        ("POST", "/api/tasks"),
        ("GET", "/api/tasks"),
        ("GET", "/api/tasks/{task_id}"),
        ("GET", "/api/tasks/{task_id}/history"),
        ("POST", "/api/tasks/{task_id}/signal"),
        ("POST", "/api/tasks/{task_id}/cancel"),
        ("POST", "/api/tasks/{task_id}/notes"),
        ("POST", "/api/tasks/{task_id}/settle"),
        ("POST", "/api/tasks/{task_id}/fork"),
        ("POST", "/api/tasks/{task_id}/redrive"),
        ("GET", "/api/tasks/{task_id}/replay"),
        ("GET", "/api/tasks/{task_id}/diagram"),
        ("GET", "/api/approvals"),
        ("GET", "/api/work"),
        ("POST", "/api/tasks/{task_id}/approve"),
        ("POST", "/api/tasks/{task_id}/reject"),
        ("POST", "/api/tasks/{task_id}/claim"),
        ("DELETE", "/api/tasks/{task_id}/claim"),
        ("GET", "/api/workflows"),
        ("GET", "/api/workflows/{name}"),
        ("GET", "/api/workflows/{name}/diagram"),
        ("GET", "/api/access/trail"),
    }
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    for command in ("signal", "cancel", "settle", "approve", "reject"):
        operation = doc["paths"][f"/api/tasks/{{task_id}}/{command}"]["post"]
        assert {"in": "header", "name": "If-Match"}.items() <= next(
            p for p in operation["parameters"] if p["name"] == "If-Match"
        ).items()
        assert {"200", "409", "412", "413"} <= set(operation["responses"]), command
        assert "ETag" in operation["responses"]["200"]["headers"]
    assert "ETag" in doc["paths"]["/api/tasks/{task_id}"]["get"]["responses"]["200"]["headers"]
    assert "ETag" in doc["paths"]["/api/tasks"]["post"]["responses"]["201"]["headers"]


def test_every_response_carries_a_strict_content_security_policy(client: TestClient) -> None:
    for response in (
        client.get("/api/workflows", headers=bearer("ann")),
        client.get("/api/workflows"),
        client.get("/login"),
        client.get("/static/style.css"),
        client.get("/api/openapi.json"),
    ):
        csp = response.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_the_refund_amount_is_in_the_call_not_in_the_reason(engine: Engine) -> None:
    # A sanity check of the fixture the other tests build on: the prepared call carries minor units.
    task_id = to_approval(engine, {**REFUND, "amount_cents": 1_234})
    assert engine.load(task_id).prepared["arguments"]["amount_cents"] == 1_234  # type: ignore[index]


# -- task ids typed short ---------------------------------------------------------------------------
def test_a_task_path_takes_a_unique_prefix_of_8_characters_and_refuses_an_ambiguous_one(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uuid

    ids = [
        "b3678ff0-0000-4000-8000-000000000001",
        "b3678ff0-0000-4000-8000-000000000002",
        "c0ffee00-0000-4000-8000-000000000003",
    ]
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(ids.pop(0)))
    first, second, third = start(client), start(client), start(client)
    answer = client.get(f"/api/tasks/{third[:8]}", headers=bearer("ann"))
    assert answer.status_code == 200 and answer.json()["task_id"] == third
    assert client.get(f"/api/tasks/{third[:8]}/history", headers=bearer("ann")).json()[0]["task_id"] == third
    cancelled = client.post(f"/api/tasks/{third[:10]}/cancel", json={"reason": "typed short"}, headers=bearer("ann"))
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    body = refused(client.get(f"/api/tasks/{first[:8]}", headers=bearer("ann")), 409, Code.TASK_ID_AMBIGUOUS)
    assert first in body["message"] and second in body["message"]
    refused(client.get(f"/api/tasks/{first[:20]}/replay", headers=bearer("ann")), 409, Code.TASK_ID_AMBIGUOUS)
    refused(client.get(f"/api/tasks/{third[:7]}", headers=bearer("ann")), 404, Code.TASK_NOT_FOUND)  # too short
    assert client.get(f"/api/tasks/{first}", headers=bearer("ann")).json()["task_id"] == first  # whole ids as ever
