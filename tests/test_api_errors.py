"""What each operation of the API documents it may refuse with, against what requests make it answer (#19).

Every operation's error responses come from the one list of codes declared at its route (`schemas.refusals`):
a status per code, and per status the codes as an enum, the error body and an example of each. Here: every code
documented is an `engine.Code` with that status; every status an operation documents is one a request provokes
(each provoked below, on SQLite and PostgreSQL); and what a request provokes is a code its operation lists there
(the clients of tests/test_api*.py check that of every answer they get, `tests.support.api.documented`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import Code, Engine, Registry
from engine.api import STATUS_BY_CODE, create_app
from engine.api.auth import context
from tests.support.api import (
    SPECIAL,
    Documented,
    bearer,
    documented,
    make_api_engine,
    make_app,
    to_approval,
    token_table,
)
from tests.support.insider import tamper


def _document() -> dict[str, Any]:
    with Engine("sqlite://", Registry([]), authoriser=token_table()) as engine:
        return make_app(engine).openapi()


DOC = _document()
#: (method, path template) -> operation id, for every operation of the document.
OPERATIONS = {(m.upper(), p): op["operationId"] for p, item in DOC["paths"].items() for m, op in item.items()}


def errors_of(operation_id: str) -> dict[int, dict[str, Any]]:
    [op] = [op for item in DOC["paths"].values() for op in item.values() if op["operationId"] == operation_id]
    return {int(s): r for s, r in op["responses"].items() if int(s) >= 400}


def test_every_code_an_operation_documents_is_a_code_with_that_status_and_an_example() -> None:
    assert DOC["components"]["schemas"]["ErrorBody"]["properties"]["code"] == {
        "$ref": "#/components/schemas/Code",
        "description": "A stable code from engine.Code.",
    }
    for operation_id in OPERATIONS.values():
        found = errors_of(operation_id)
        assert {401, 422, 500} <= set(found), operation_id  # no token, a bad request, a bug: everywhere
        for status, response in found.items():
            body = response["content"]["application/json"]
            codes = body["schema"]["properties"]["code"]["enum"]
            assert body["schema"]["$ref"] == "#/components/schemas/ErrorBody", (operation_id, status)
            assert codes and len(codes) == len(set(codes)), (operation_id, status)
            for name in codes:
                code = Code[name]  # a real code (its members are named as their values)
                assert STATUS_BY_CODE[code] == status or (status, name) in SPECIAL, (operation_id, status, name)
                example = body["examples"][name]["value"]
                assert example == {"code": name, "message": code.reference, "details": {}}, (operation_id, name)
            assert set(body["examples"]) == set(codes), (operation_id, status)
            assert all(f"`{name}`" in response["description"] for name in codes), (operation_id, status)


def test_writes_document_a_read_only_token_and_a_body_too_large_and_reads_do_not() -> None:
    for (method, _path), operation_id in OPERATIONS.items():
        found = errors_of(operation_id)
        if method == "POST":
            assert "FORBIDDEN" in found[403]["content"]["application/json"]["schema"]["properties"]["code"]["enum"]
            assert 413 in found, operation_id
        else:
            assert 413 not in found and 412 not in found, operation_id


def test_each_operation_lists_its_own_codes_not_one_text_for_all() -> None:
    def conflicts(operation_id: str) -> list[str]:
        return list(errors_of(operation_id)[409]["content"]["application/json"]["schema"]["properties"]["code"]["enum"])

    assert "APPROVAL_STALE" in conflicts("approve_task") and "APPROVAL_STALE" not in conflicts("reject_task")
    assert "TASK_NOT_AWAITING_APPROVAL" in conflicts("reject_task")
    assert "TASK_NOT_AWAITING_APPROVAL" not in conflicts("cancel_task")
    assert 409 not in errors_of("list_tasks") and 404 not in errors_of("list_tasks")
    # Who holds a token is the database's too (its tokens, a token's person): even `me` may answer 503.
    assert set(errors_of("who_am_i")) == {401, 422, 500, 503}
    assert errors_of("get_workflow")[404]["content"]["application/json"]["schema"]["properties"]["code"]["enum"] == [
        "WORKFLOW_UNKNOWN"
    ]


# -- every status documented is one a request provokes -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class World:
    engine: Engine
    db_url: str
    tmp_path: Path
    #: A shop refund waiting for its approval, its digest, and a task that has ended (what a fork starts from).
    waiting: str
    digest: str
    ended: str


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    with make_api_engine(db_url, tmp_path) as engine:
        waiting = to_approval(engine)
        prepared = engine.load(waiting).prepared
        assert prepared is not None
        ended = engine.start("counter", actor="ann")
        engine.cancel(ended, actor="ann", reason="done with it")
        yield World(engine, db_url, tmp_path, waiting, prepared["digest"], ended)


def request_of(world: World, operation_id: str) -> tuple[str, str, Any]:
    """A request each operation would take (on `world`'s tasks): the one each case below spoils one way."""
    task, bodies = (
        world.waiting,
        {
            "start_task": {"workflow": "counter"},
            "signal_task": {"trigger": "approve_by_phone"},
            "cancel_task": {"reason": "no longer wanted"},
            "settle_task": {"outcome": "executed", "evidence": "PSP record 7"},
            "fork_task": {"at_seq": 1, "reason": "again"},
            "redrive_task": {"to_state": "collecting", "reason": "again"},
            "approve_task": {"digest": world.digest},
            "reject_task": {"reason": "not this one"},
        },
    )
    [(method, template)] = [k for k, v in OPERATIONS.items() if v == operation_id]
    path = template.replace("{name}", "shop_refund").replace(
        "{task_id}", world.ended if operation_id == "fork_task" else task
    )
    return method, path, bodies.get(operation_id)


Provoked = dict[str, dict[int, set[str]]]


def ask(client: TestClient, provoked: Provoked, operation_id: str, method: str, path: str, **kwargs: Any) -> Any:
    response = client.request(method, path, **kwargs)
    if response.status_code >= 400:
        provoked[operation_id][response.status_code].add(response.json()["code"])
    return response


def test_each_status_an_operation_documents_is_one_a_request_provokes(world: World) -> None:
    provoked: Provoked = defaultdict(lambda: defaultdict(set))
    ids = list(OPERATIONS.values())
    writes = [i for (m, _), i in OPERATIONS.items() if m == "POST"]
    on_a_task = [i for (_, p), i in OPERATIONS.items() if "{task_id}" in p]
    commands = [i for i in on_a_task if i in writes and i != "fork_task"]

    def each(client: TestClient, chosen: list[str], who: str = "dana") -> None:
        for operation_id in chosen:
            method, path, body = request_of(world, operation_id)
            ask(client, provoked, operation_id, method, path, json=body, headers=bearer(who) if who else {})

    assessing = world.engine.start("refund", {"customer": "c1", "balance": 50}, actor="ann")
    twins = ["b3678ff0-0000-4000-8000-000000000001", "b3678ff0-0000-4000-8000-000000000002"]
    with pytest.MonkeyPatch.context() as patched:
        queue = list(twins)
        patched.setattr(uuid, "uuid4", lambda: uuid.UUID(queue.pop(0)))
        for _ in twins:
            world.engine.start("counter", actor="ann")
    with_actor = {"trigger": "cancel", "payload": {"reason": "x", "actor": "admin"}}
    too_much = {"trigger": "propose", "payload": {"amount": 5_000, "reason": "over the balance"}}
    with TestClient(make_app(world.engine)) as client:
        documented(client)
        each(client, ids, who="")  # 401: no token
        for operation_id in ids:  # 422: a query parameter it does not take
            method, path, body = request_of(world, operation_id)
            ask(client, provoked, operation_id, method, path + "?colour=red", json=body, headers=bearer("dana"))
        each(client, writes, who="audrey")  # 403: a read-only token
        for operation_id in on_a_task:  # 404: no such task
            method, path, body = request_of(world, operation_id)
            missing = path.replace(world.waiting, "no-such-task").replace(world.ended, "no-such-task")
            ask(client, provoked, operation_id, method, missing, json=body, headers=bearer("dana"))
        for operation_id in on_a_task:  # 409: a task id typed short that starts two tasks' ids
            method, path, body = request_of(world, operation_id)
            shared = path.replace(world.waiting, twins[0][:12]).replace(world.ended, twins[0][:12])
            ask(client, provoked, operation_id, method, shared, json=body, headers=bearer("dana"))
            assert provoked[operation_id][409] >= {"TASK_ID_AMBIGUOUS"}, operation_id
        for operation_id in commands:  # 412: If-Match names a seq the task is no longer at
            method, path, body = request_of(world, operation_id)
            ask(client, provoked, operation_id, method, path, json=body, headers={**bearer("dana"), "If-Match": '"1"'})
        # The codes each operation adds of its own.
        for operation_id, method, path, body, who in [
            ("start_task", "POST", "/api/tasks", {"workflow": "nothing_like_it"}, "ann"),
            ("get_workflow", "GET", "/api/workflows/nothing_like_it", None, "ann"),
            ("get_workflow_diagram", "GET", "/api/workflows/shop_refund/diagram?version=9", None, "ann"),
            ("fork_task", "POST", f"/api/tasks/{world.ended}/fork", {"at_seq": 1, "reason": "x", "version": 9}, "ann"),
            ("approve_task", "POST", f"/api/tasks/{world.waiting}/approve", {"digest": world.digest}, "ann"),
            ("reject_task", "POST", f"/api/tasks/{world.waiting}/reject", {"reason": "no"}, "ann"),
            ("approve_task", "POST", f"/api/tasks/{world.waiting}/approve", {"digest": "0" * 64}, "dana"),
            ("approve_task", "POST", f"/api/tasks/{world.waiting}/approve", {"digest": world.digest[:6]}, "dana"),
            ("approve_task", "POST", f"/api/tasks/{world.waiting}/approve", {"digest": "z" * 12}, "dana"),
            ("signal_task", "POST", f"/api/tasks/{world.waiting}/signal", {"trigger": "nope"}, "dana"),
            ("settle_task", "POST", f"/api/tasks/{world.waiting}/settle", request_of(world, "settle_task")[2], "olga"),
            ("redrive_task", "POST", f"/api/tasks/{world.waiting}/redrive", {"to_state": "x", "reason": "x"}, "olga"),
            ("fork_task", "POST", f"/api/tasks/{world.waiting}/fork", {"at_seq": 1, "reason": "x"}, "ann"),
            ("cancel_task", "POST", f"/api/tasks/{world.ended}/cancel", {"reason": "again"}, "ann"),
            ("signal_task", "POST", f"/api/tasks/{world.ended}/signal", {"trigger": "tick"}, "ann"),
            ("signal_task", "POST", f"/api/tasks/{world.waiting}/signal", with_actor, "ann"),
            ("signal_task", "POST", f"/api/tasks/{assessing}/signal", too_much, "ann"),
            ("access_trail", "GET", "/api/access/trail", None, "dana"),  # 403: not an auditor
        ]:
            ask(client, provoked, operation_id, method, path, json=body, headers=bearer(who))
        approved = client.post(
            f"/api/tasks/{world.waiting}/approve", json={"digest": world.digest}, headers=bearer("dana")
        )
        assert approved.status_code == 200, approved.text
        for operation_id in ("approve_task", "reject_task"):  # 409: the task is no longer at its approval
            method, path, body = request_of(world, operation_id)
            ask(client, provoked, operation_id, method, path, json=body, headers=bearer("erin"))

    # 413: a body over the server's limit
    with TestClient(create_app(world.engine, token_table(), session_secret="s", max_body=256)) as small:
        documented(small)
        for operation_id in writes:
            method, path, body = request_of(world, operation_id)
            padded = {**(body or {}), "padding": "x" * 512}
            ask(small, provoked, operation_id, method, path, json=padded, headers=bearer("dana"))

    # 500: a bug (any exception the server does not expect), and a log that does not hold together
    buggy = make_app(world.engine)

    def bug() -> None:
        raise RuntimeError("a bug")

    buggy.dependency_overrides[context] = bug
    with TestClient(buggy, raise_server_exceptions=False) as broken:
        documented(broken)
        each(broken, ids)
    task = world.engine.start("shop_refund", {"customer": "c1"}, actor="ann")
    again = to_approval(world.engine)
    world.engine.cancel(task, actor="ann", reason="ended")
    for edited in (again, task):
        tamper(world.db_url, "UPDATE events SET data = '{not json' WHERE task_id = :t AND seq = 1", t=edited)
    with TestClient(make_app(world.engine)) as client:
        documented(client)
        for operation_id in (*on_a_task, "list_approvals", "list_work"):
            method, path, body = request_of(world, operation_id)
            path = path.replace(world.waiting, again).replace(world.ended, task)
            ask(client, provoked, operation_id, method, path, json=body, headers=bearer("dana"))

    # 409: a task pinned to a version this server's code does not define (404 to whoever no definition here names
    # a role of: deny by default; the auditor reads it, and is told why it cannot be)
    with (
        Engine(world.db_url, Registry([]), authoriser=token_table()) as other,
        TestClient(create_app(other, token_table(), session_secret="s")) as client,
    ):
        documented(client)
        each(client, on_a_task)
        each(client, on_a_task, who="audrey")
    # ... and one whose code changed without a new version: still read by whoever its roles name
    changed = Registry([replace(wf, description=f"{wf.description} (edited)") for wf in world.engine.registry])
    with (
        Engine(world.db_url, changed, authoriser=token_table()) as other,
        TestClient(create_app(other, token_table(), session_secret="s")) as client,
    ):
        documented(client)
        each(client, on_a_task)

    # 503: a database without the schema, and one that does not answer
    (world.tmp_path / "away").mkdir()
    for url in (f"sqlite:///{world.tmp_path / 'empty.db'}", "postgresql+psycopg://nobody@127.0.0.1:1/railyard"):
        with (
            make_api_engine(url, world.tmp_path / "away") as bare,
            TestClient(create_app(bare, token_table(), session_secret="s")) as client,
        ):
            documented(client)
            each(client, ids)

    for operation_id in ids:
        assert set(provoked[operation_id]) == set(errors_of(operation_id)), (
            operation_id,
            dict(provoked[operation_id]),
        )
    assert provoked["approve_task"][409] >= {"TASK_NOT_AWAITING_APPROVAL", "APPROVAL_STALE"}
    assert provoked["approve_task"][403] == {"FORBIDDEN", "APPROVAL_FORBIDDEN"}
    assert provoked["approve_task"][422] >= {"PAYLOAD_INVALID", "DIGEST_TOO_SHORT", "DIGEST_INVALID"}
    assert provoked["signal_task"][409] >= {"TASK_TERMINAL", "TRIGGER_NOT_ALLOWED"}
    assert provoked["signal_task"][422] >= {"IDENTITY_OVERRIDE", "DOMAIN_INVALID"}
    assert provoked["get_workflow_diagram"][404] == {"VERSION_UNKNOWN"}
    assert provoked["start_task"][503] == {"SCHEMA_MISSING", "DATABASE_UNREACHABLE"}
    assert provoked["get_task"][500] == {"INTERNAL_ERROR", "HASH_MISMATCH"}


def test_approve_on_a_task_not_waiting_answers_a_code_its_operation_lists(world: World) -> None:
    listed = errors_of("approve_task")[409]["content"]["application/json"]["schema"]["properties"]["code"]["enum"]
    with TestClient(make_app(world.engine)) as client:
        documented(client)
        digest = {"digest": world.digest}
        assert client.post(f"/api/tasks/{world.waiting}/approve", json=digest, headers=bearer("dana")).is_success
        again = client.post(f"/api/tasks/{world.waiting}/approve", json=digest, headers=bearer("erin"))
    assert again.status_code == 409 and again.json()["code"] == "TASK_NOT_AWAITING_APPROVAL" in listed


def test_an_answer_outside_the_document_is_caught() -> None:
    """The check the API tests' clients make can fail: a code the operation does not list, a status it lacks."""
    with Engine("sqlite://", Registry([]), authoriser=token_table()) as engine:
        known = Documented.of(make_app(engine))
    known.check("GET", "/api/tasks/abc", 404, {"code": "TASK_NOT_FOUND"})
    with pytest.raises(AssertionError, match="not one of the codes"):
        known.check("GET", "/api/tasks/abc", 404, {"code": "WORKFLOW_UNKNOWN"})
    with pytest.raises(AssertionError, match="does not document"):
        known.check("GET", "/api/tasks", 404, {"code": "TASK_NOT_FOUND"})
