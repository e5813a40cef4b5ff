"""The API's lists, on SQLite and PostgreSQL: cursors and limits, filters, search by task id and by a workflow's
searchable input fields (the reference refund's customer and order ids), and the bounded approvals list."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import Code, Engine, Registry, ScriptedModel
from engine.api import create_app
from engine.store import SqlStore
from engine.store.protocol import TaskQuery
from tests.support.api import (
    SETTLED_BY_OPERATORS,
    bearer,
    documented,
    make_api_engine,
    make_app,
    to_approval,
    token_table,
)
from tests.support.postgres import truncate
from tests.support.shop import Ledger, make_workflow
from tests.support.stores import T0, Log
from workflows import EXPENSE, REFUND_V2, TICKET_TRIAGE


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(make_app(engine)) as c:
        yield documented(c)


@pytest.fixture
def reference(db_url: str) -> Iterator[tuple[Engine, TestClient]]:
    """The reference workflows behind the API: refund declares customer_id and order_id searchable."""
    tokens = token_table()
    eng = Engine(db_url, Registry([REFUND_V2, EXPENSE, TICKET_TRIAGE]), authoriser=tokens)
    with eng, TestClient(create_app(eng, tokens, session_secret="s")) as c:
        yield eng, documented(c)


def get(client: TestClient, path: str, **params: Any) -> dict[str, Any]:
    response = client.get(path, params=params, headers=bearer("audrey"))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def refused(response: Any, code: Code) -> None:
    assert response.status_code == 422, response.text
    assert response.json()["code"] == str(code)


def refund(customer: str, order: str | None = None) -> dict[str, Any]:
    return {"customer_id": customer, "message": "Parcel arrived damaged.", **({"order_id": order} if order else {})}


def page_through(client: TestClient, first: str) -> tuple[list[str], list[int]]:
    """Every task id the pages hold, following `next`, and the size of each page."""
    ids: list[str] = []
    sizes: list[int] = []
    link: str | None = first
    while link is not None:
        page = client.get(link, headers=bearer("audrey")).json()
        ids += [t["task_id"] for t in page["tasks"]]
        sizes.append(len(page["tasks"]))
        assert (page["next"] is None) == (page["next_cursor"] is None)
        link = page["next"]
    return ids, sizes


def test_three_hundred_tasks_page_through_with_none_twice_and_none_left_out(engine: Engine, client: TestClient) -> None:
    started = [engine.start("counter", actor=("ann", "bob")[n % 2]) for n in range(300)]
    ids, sizes = page_through(client, "/api/tasks")
    assert sizes == [50] * 6  # the stated page size, 50 by default; the sixth page says it is the last
    assert len(ids) == len(set(ids)) == 300 and set(ids) == set(started)
    newest_first = [t["task_id"] for t in get(client, "/api/tasks", limit=500)["tasks"]]
    assert ids == newest_first
    rows = {r.task_id: r for r in (engine.store.row(i) for i in ids) if r is not None}
    created = [rows[i].created_at for i in ids]
    assert created == sorted(created, reverse=True)
    # A filter holds across the pages, and so does a smaller page size.
    bobs, sizes = page_through(client, "/api/tasks?started_by=bob&limit=40")
    assert sizes[:3] == [40, 40, 40] and bobs == [i for i in ids if started.index(i) % 2 == 1]


def test_tasks_created_while_paging_shift_no_page(engine: Engine, client: TestClient) -> None:
    old = [engine.start("counter", actor="ann") for _ in range(12)]
    first = get(client, "/api/tasks", limit=5)
    new = [engine.start("counter", actor="ann") for _ in range(3)]
    rest, _ = page_through(client, first["next"])
    seen = [t["task_id"] for t in first["tasks"]] + rest
    assert sorted(seen) == sorted(old) and len(seen) == 12  # the new ones are on a fresh first page
    assert {t["task_id"] for t in get(client, "/api/tasks", limit=3)["tasks"]} == set(new)


def test_limits_and_cursors_are_checked(engine: Engine, client: TestClient) -> None:
    engine.start("counter", actor="ann")
    assert get(client, "/api/tasks")["limit"] == 50
    assert get(client, "/api/tasks", limit=500)["limit"] == 500
    for limit in (0, 501, -1):
        refused(client.get("/api/tasks", params={"limit": limit}, headers=bearer("ann")), Code.PAYLOAD_INVALID)
        refused(client.get("/api/approvals", params={"limit": limit}, headers=bearer("ann")), Code.PAYLOAD_INVALID)
    for cursor in ("nonsense", "t1.!!!", "t1.bm8gc3VjaCB0YXNr", "x" * 201):  # the last but one: "no such task"
        refused(client.get("/api/tasks", params={"cursor": cursor}, headers=bearer("ann")), Code.PAYLOAD_INVALID)
        refused(client.get("/api/approvals", params={"cursor": cursor}, headers=bearer("ann")), Code.PAYLOAD_INVALID)
    for bad in ({"created_from": "yesterday"}, {"created_to": "2026-13-01"}, {"state": "<b>"}, {"status": "lost"}):
        refused(client.get("/api/tasks", params=bad, headers=bearer("ann")), Code.PAYLOAD_INVALID)
    assert len(get(client, "/api/tasks")["tasks"]) == 1  # nothing a refused list did changed anything


def test_the_task_list_filters_by_state_status_starter_and_creation_time(engine: Engine, client: TestClient) -> None:
    waiting = to_approval(engine, starter="ann")
    counter = engine.start("counter", actor="bob")
    before = datetime.now(UTC)
    later = engine.start("counter", actor="bob")

    def ids(**query: Any) -> set[str]:
        return {t["task_id"] for t in get(client, "/api/tasks", **query)["tasks"]}

    assert ids(state="awaiting_approval") == {waiting}
    assert ids(status="blocked") == {waiting} and ids(status="runnable") == {counter, later}
    assert ids(started_by="bob") == {counter, later} and ids(started_by="nobody") == set()
    assert ids(created_from=before.isoformat()) == {later}
    assert ids(created_to=before.isoformat()) == {waiting, counter}  # a date-time is an exclusive bound
    today = before.date().isoformat()
    assert ids(created_from=today, created_to=today) == {waiting, counter, later}  # a date: the whole day
    tomorrow = (before + timedelta(days=1)).date().isoformat()
    assert ids(created_from=tomorrow) == set()
    [row] = [t for t in get(client, "/api/tasks", workflow="shop_refund")["tasks"]]
    assert (row["started_by"], row["fields"], row["state"]) == ("ann", {"customer": "c1"}, "awaiting_approval")


def test_a_public_state_finds_the_tasks_in_its_internal_sub_states(engine: Engine, client: TestClient) -> None:
    task_id = engine.start("shop_refund", {"customer": "c9"}, actor="ann")
    engine.step(task_id, model=ScriptedModel([{"text": "no tool call"}], profile="anthropic"))
    state = engine.get(task_id).state
    assert state == "collecting~force"
    assert task_id in {t["task_id"] for t in get(client, "/api/tasks", state="collecting")["tasks"]}
    assert {t["task_id"] for t in get(client, "/api/tasks", state="collecting~force")["tasks"]} == {task_id}


def test_search_finds_tasks_by_customer_id_order_id_or_task_id_prefix(reference: tuple[Engine, TestClient]) -> None:
    engine, client = reference
    mine = [engine.start("refund", refund("C-1001", f"O-{n:04d}"), actor="ann") for n in range(3)]
    other = engine.start("refund", refund("C-2002"), actor="ann")
    ticket = engine.start("ticket_triage", {"ticket_id": "T-5001"}, actor="bob")

    def found(q: str, **query: Any) -> list[str]:
        return [t["task_id"] for t in get(client, "/api/tasks", q=q, **query)["tasks"]]

    assert found("C-1001") == mine[::-1]  # newest first
    assert found("O-0001") == [mine[1]] and found("T-5001") == [ticket]
    assert found("C-100") == [] and found("c-1001") == []  # a field's whole value, as written
    assert found(other[:8]) == [other] and found(other.upper()[:13]) == [other]
    assert found("C-1001", workflow="ticket_triage") == []
    paged = get(client, "/api/tasks", q="C-1001", limit=2)
    assert len(paged["tasks"]) == 2 and "q=C-1001" in paged["next"]
    rest = client.get(paged["next"], headers=bearer("audrey")).json()
    assert [t["task_id"] for t in rest["tasks"]] == [mine[0]] and rest["next"] is None
    [row] = get(client, "/api/tasks", q="O-0002")["tasks"]
    assert row["fields"] == {"customer_id": "C-1001", "order_id": "O-0002"}


def test_the_approvals_list_is_bounded_and_pages_oldest_first(engine: Engine, client: TestClient) -> None:
    waiting = [to_approval(engine) for _ in range(7)]
    engine.start("counter", actor="ann")
    first = get(client, "/api/approvals", limit=3)
    assert [p["task_id"] for p in first["approvals"]] == waiting[:3] and first["limit"] == 3
    second = client.get(first["next"], headers=bearer("audrey")).json()
    third = client.get(second["next"], headers=bearer("audrey")).json()
    assert [p["task_id"] for p in second["approvals"] + third["approvals"]] == waiting[3:]
    assert third["next"] is None and third["next_cursor"] is None
    assert "role=refund_approver" in get(client, "/api/approvals", role="refund_approver", limit=1)["next"]
    assert len(get(client, "/api/approvals")["approvals"]) == 7 and get(client, "/api/approvals")["limit"] == 50


def test_a_task_left_off_a_page_of_approvals_does_not_end_the_list(db_url: str, tmp_path: Path) -> None:
    """One of the waiting tasks cannot be loaded (its version's code changed without a new version): the page it
    falls on is short, and the list still goes on to the tasks after it."""
    with make_api_engine(db_url, tmp_path) as engine:
        waiting = [to_approval(engine) for _ in range(2)]
        changed = to_approval(engine, workflow=SETTLED_BY_OPERATORS)
        waiting += [to_approval(engine) for _ in range(2)]
    shop = make_workflow(Ledger(tmp_path / "ledger.db"))
    edited = dataclasses.replace(shop, name=SETTLED_BY_OPERATORS, settle_role="somebody_else")
    tokens = token_table()
    with (
        Engine(db_url, Registry([shop, edited]), authoriser=tokens) as engine,
        TestClient(create_app(engine, tokens, session_secret="s")) as client,
    ):
        for limit in (1, 2, 3):
            seen, page = [], get(client, "/api/approvals", limit=limit)
            while True:
                seen += [p["task_id"] for p in page["approvals"]]
                if page["next"] is None:
                    break
                page = client.get(page["next"], headers=bearer("audrey")).json()
            assert seen == waiting and changed not in seen, limit


def test_dates_past_the_calendars_ends_are_refused_not_a_server_error(client: TestClient) -> None:
    bad = [("created_to", "9999-12-31")]  # the day after it, which the bound is, is past the calendar
    for bound in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "20261201", "2026-W48"):
        bad += [("created_from", bound), ("created_to", bound)]
    for name, bound in bad:
        refused(client.get("/api/tasks", params={name: bound}, headers=bearer("audrey")), Code.PAYLOAD_INVALID)
    assert get(client, "/api/tasks", created_from="9999-12-31")["tasks"] == []  # a day that exists: no task yet


def test_a_searchable_value_with_a_control_character_starts_its_task_and_is_not_indexed(
    reference: tuple[Engine, TestClient],
) -> None:
    """PostgreSQL's text refuses a NUL: the task starts with its input whole, and the value is not searchable
    (a search can never carry a control character)."""
    engine, client = reference
    for employee in ("a\x00b", "a\tb"):
        task_id = engine.start("expense", {"employee": employee, "limit_cents": 5000}, actor="ann")
        assert engine.load(task_id).input["employee"] == employee
        assert get(client, "/api/tasks", q=task_id[:8])["tasks"][0]["task_id"] == task_id
    plain = engine.start("expense", {"employee": "zed", "limit_cents": 5000}, actor="ann")
    assert [t["task_id"] for t in get(client, "/api/tasks", q="zed")["tasks"]] == [plain]  # not a hex id prefix


def test_every_list_query_is_served_by_an_index_on_postgresql(pg_database: str) -> None:
    """With sequential scans and sorts priced out, the planner still finds a plan for each filter and search:
    one exists that reads an index in the list's order (or the search's indexes), never the whole table."""
    truncate(pg_database)
    store = SqlStore(pg_database)
    try:
        log = Log("a1b2-0001")
        store.create(log.row(), log.first, {"customer_id": "C-1"})
        variants = [
            TaskQuery(),
            TaskQuery(workflow="refund"),
            TaskQuery(status="blocked"),
            TaskQuery(started_by="ann"),
            TaskQuery(created_from=T0, created_before=T0 + timedelta(days=1)),
            TaskQuery(field_value="C-1"),
            TaskQuery(id_prefix="a1b2", field_value="a1b2"),
            TaskQuery(workflow="refund", after="a1b2-0001"),
        ]
        with store.engine.connect() as conn:
            conn.exec_driver_sql("SET enable_seqscan = off")
            conn.exec_driver_sql("SET enable_sort = off")
            for query in variants:
                compiled = store.list_statement(query).compile(
                    dialect=conn.dialect, compile_kwargs={"render_postcompile": True}
                )
                plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}", compiled.params))
                assert "Seq Scan" not in plan, (query, plan)
                if not (query.field_value or query.id_prefix):  # a search sorts what it found; a list never
                    assert "Sort" not in plan, (query, plan)
    finally:
        store.close()


def test_control_characters_in_a_text_filter_are_refused_before_the_database_sees_them(client: TestClient) -> None:
    for params in ({"q": "C-1\x00"}, {"started_by": "ann\x00"}, {"q": "a\nb"}):
        refused(client.get("/api/tasks", params=params, headers=bearer("ann")), Code.PAYLOAD_INVALID)
