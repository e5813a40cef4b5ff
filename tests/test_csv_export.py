"""CSV export of the back office's lists (#32): the work queue, the task list, the approvals waiting and the
access trail as the person may see them, with the page's filters, sort and search, every page of them, money
totals per currency, and no formula cells."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from html import unescape

import pytest
from fastapi.testclient import TestClient

from engine import Engine, Registry, ScriptedModel
from engine.api import TokenTable, create_app
from engine.api import csv_export as export
from engine.providers.scripted import call
from engine.runtime.people import People
from tests.support.api import documented, login
from tests.support.reference import DAMAGED, books, refund  # noqa: F401  (books: a fixture)
from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE, fakes

TOKENS: dict[str, tuple[str, set[str]]] = {
    "tok-dana": ("dana", {"refund_approver", "expense_approver"}),
    "tok-xavier": ("xavier", {"expense_approver"}),
    "tok-ann": ("ann", set()),
    "tok-audrey": ("audrey", {"auditor"}),
}


@pytest.fixture
def eng(db_url: str, books: fakes.Systems) -> Iterator[Engine]:  # noqa: F811
    with Engine(db_url, Registry([REFUND_V1, TICKET_TRIAGE, EXPENSE]), authoriser=TokenTable.from_tokens(TOKENS)) as e:
        yield e


@pytest.fixture
def client(eng: Engine) -> Iterator[TestClient]:
    app = create_app(eng, TokenTable.from_tokens(TOKENS), session_secret="test-secret")
    with TestClient(app, follow_redirects=False) as c:
        yield documented(c)


def refund_at_approval(eng: Engine, amount: int) -> str:
    task_id = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(amount),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def expense_in_review(eng: Engine, employee: str, cents: int = 12_345, currency: str = "EUR") -> str:
    task_id = eng.start("expense", {"employee": employee, "limit_cents": 500_000}, actor="eve")
    claim = call("submit", amount_cents=cents, currency=currency, description="Train to the customer visit")
    assert eng.run(task_id, model=ScriptedModel([claim], profile="anthropic")).state == "review"
    return task_id


def table(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr id="work-([^"]+)"', html)


def download_link(html: str) -> str:
    found = re.search(r'<a href="([^"]*)" id="download-csv"', html)
    assert found is not None, "no Download CSV link"
    return unescape(found.group(1))


def test_the_queue_csv_is_the_rows_the_page_lists_in_its_order_with_money_totals_per_currency(
    client: TestClient, eng: Engine
) -> None:
    refunds = [refund_at_approval(eng, 12_999), refund_at_approval(eng, 1_001)]
    expenses = [expense_in_review(eng, "eve", 12_345, "EUR"), expense_in_review(eng, "ed", 5_000, "USD")]
    login(client, "dana")
    page = client.get("/inbox", params={"sort": "created", "order": "desc"}).text
    link = download_link(page)
    assert "format=csv" in link and "sort=created" in link and "order=desc" in link
    answer = client.get(link)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    assert answer.headers["content-disposition"].startswith('attachment; filename="work-')
    rows = table(answer.text)
    listed, totals = rows[:-2], rows[-2:]
    assert [r["task"] for r in listed] == rows_of(page) == (refunds + expenses)[::-1]
    by_id = {r["task"]: r for r in listed}
    assert by_id[refunds[0]]["refund"] == "129.99" and by_id[refunds[0]]["refund currency"] == "EUR"
    assert by_id[refunds[0]]["customer_id"] == "C-100" and by_id[refunds[0]]["state"] == "awaiting_approval"
    assert by_id[expenses[1]]["amount"] == "50.00" and by_id[expenses[1]]["amount currency"] == "USD"
    assert by_id[expenses[0]]["refund"] == ""  # not a refund: no value in the refund's column
    assert [t["task"] for t in totals] == ["total EUR", "total USD"]
    assert totals[0]["refund"] == "140.00" and totals[0]["amount"] == "123.45"
    assert totals[1]["amount"] == "50.00" and totals[1]["refund"] == ""
    # The search and the filters of the page hold in the file too.
    found = table(client.get("/inbox", params={"workflow": "expense", "format": "csv"}).text)
    assert {r["task"] for r in found if not r["task"].startswith("total")} == set(expenses)
    searched = table(client.get("/inbox", params={"q": refunds[1][:13], "format": "csv"}).text)
    assert [r["task"] for r in searched] == [refunds[1], "total EUR"]
    # The API gives the same file for the same filters.
    api = client.get("/api/work", params={"format": "csv"}, headers={"Authorization": "Bearer tok-dana"})
    assert api.status_code == 200 and api.headers["content-type"].startswith("text/csv")
    assert sorted(r["task"] for r in table(api.text)) == sorted([*refunds, *expenses, "total EUR", "total USD"])


def test_a_person_without_a_role_gets_no_row_they_could_not_see_on_the_page(client: TestClient, eng: Engine) -> None:
    refund_at_approval(eng, 12_999)
    expense = expense_in_review(eng, "eve")
    login(client, "xavier")  # approves expenses, not refunds
    page = client.get("/inbox").text
    rows = table(client.get(download_link(page)).text)
    assert [r["task"] for r in rows if not r["task"].startswith("total")] == rows_of(page) == [expense]
    assert "refund" not in rows[0]  # no refund state is listed: no refund column either
    api = table(client.get("/api/work?format=csv", headers={"Authorization": "Bearer tok-xavier"}).text)
    assert [r["task"] for r in api if not r["task"].startswith("total")] == [expense]
    nobody = table(client.get("/api/work?format=csv", headers={"Authorization": "Bearer tok-ann"}).text)
    assert nobody == []  # the header alone: ann holds no role a queue item waits on


def test_cells_that_a_spreadsheet_would_run_are_quoted_and_numbers_are_not(client: TestClient, eng: Engine) -> None:
    hostile = ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)"]
    started = [expense_in_review(eng, name) for name in hostile]
    login(client, "dana")
    rows = table(client.get("/inbox", params={"format": "csv", "sort": "created"}).text)
    by_id = {r["task"]: r for r in rows}
    assert [by_id[t]["employee"] for t in started] == ["'" + name for name in hostile]
    tasks = table(client.get("/tasks", params={"format": "csv", "workflow": "expense"}).text)
    assert sorted(r["employee"] for r in tasks) == sorted("'" + name for name in hostile)
    assert export.safe_cell("-12.50") == "-12.50" and export.safe_cell("-12.50+A1") == "'-12.50+A1"
    assert export.safe_cell("\t=1") == "'\t=1" and export.safe_cell("plain = text") == "plain = text"


def test_the_task_list_csv_has_every_page_and_only_what_the_person_may_read(
    client: TestClient, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "EXPORT_PAGE", 3)  # several keyset pages for a few tasks
    started = [expense_in_review(eng, f"e{n}") for n in range(7)]
    refund_id = refund_at_approval(eng, 500)
    login(client, "dana")
    page = client.get("/tasks", params={"workflow": "expense"}).text
    link = download_link(page)
    assert "workflow=expense" in link
    rows = table(client.get(link).text)
    assert [r["task"] for r in rows] == started[::-1]  # newest first, as the page, no repeats across pages
    assert rows[0]["workflow"] == "expense" and rows[0]["status"] == "blocked" and rows[0]["employee"] == "e6"
    everything = table(client.get("/api/tasks?format=csv", headers={"Authorization": "Bearer tok-dana"}).text)
    assert {r["task"] for r in everything} == {*started, refund_id}
    assert client.get("/api/tasks?format=xml", headers={"Authorization": "Bearer tok-dana"}).status_code == 422


def test_the_queue_csv_reads_in_keyset_pages_and_repeats_no_row(
    client: TestClient, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "EXPORT_PAGE", 2)
    started = [expense_in_review(eng, f"e{n}") for n in range(5)]
    login(client, "dana")
    rows = table(client.get("/inbox", params={"format": "csv", "sort": "created"}).text)
    assert [r["task"] for r in rows] == [*started, "total EUR"]
    assert rows[-1]["amount"] == "617.25"  # 5 x 123.45


def test_a_filter_the_list_refuses_is_refused_before_the_file_starts(client: TestClient, eng: Engine) -> None:
    """A CSV is streamed: a filter refused once the 200 was sent would cut the file short with no code. The
    filters are read before the answer starts, so a bad one is the list's own refusal, as JSON."""
    dana = {"Authorization": "Bearer tok-dana"}
    expense_in_review(eng, "eve")
    for params in ({"created_from": "0"}, {"created_to": "yesterday"}):
        as_json = client.get("/api/tasks", params=params, headers=dana)
        as_csv = client.get("/api/tasks", params={**params, "format": "csv"}, headers=dana)
        assert as_json.status_code == as_csv.status_code == 422, (params, as_csv.text)
        assert as_csv.json()["code"] == as_json.json()["code"] == "PAYLOAD_INVALID"
    assert client.get("/api/tasks", params={"format": "csv"}, headers=dana).status_code == 200


def test_the_approvals_csv_has_every_page_the_prepared_call_and_money_totals(
    client: TestClient, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "FIRST_PAGE", 1)
    monkeypatch.setattr(export, "EXPORT_PAGE", 1)  # a page per approval: the file must still hold each once
    refunds = [refund_at_approval(eng, 12_999), refund_at_approval(eng, 1_001)]
    dana = {"Authorization": "Bearer tok-dana"}
    as_json = client.get("/api/approvals", headers=dana).json()["approvals"]
    answer = client.get("/api/approvals", params={"format": "csv"}, headers=dana)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    assert answer.headers["content-disposition"].startswith('attachment; filename="approvals-')
    rows = table(answer.text)
    listed, totals = rows[:-1], rows[-1]
    assert [r["task"] for r in listed] == [a["task_id"] for a in as_json] and set(refunds) <= {
        r["task"] for r in listed
    }
    first = next(r for r in listed if r["task"] == refunds[0])
    shown = next(a for a in as_json if a["task_id"] == refunds[0])
    assert (first["workflow"], first["version"], first["role"]) == ("refund", "1", "refund_approver")
    assert first["digest"] == shown["digest"] and first["tool"] == shown["prepared"]["tool"] == "payments_refund"
    assert first["refund"] == "129.99" and first["refund currency"] == "EUR"
    assert totals["task"] == "total EUR" and totals["refund"] == "140.00"
    # The role filter holds in the file, and a person who may read no refund gets none of them.
    assert table(client.get("/api/approvals?format=csv&role=nobody", headers=dana).text) == []
    ann = table(client.get("/api/approvals?format=csv", headers={"Authorization": "Bearer tok-ann"}).text)
    assert [r["task"] for r in ann] == [
        a["task_id"]
        for a in client.get("/api/approvals", headers={"Authorization": "Bearer tok-ann"}).json()["approvals"]
    ]


def test_the_access_trail_csv_is_the_whole_trail_for_an_auditor_and_refused_to_anyone_else(
    client: TestClient, eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export, "FIRST_PAGE", 2)
    monkeypatch.setattr(export, "EXPORT_PAGE", 2)
    people = People(eng.store)
    people.add("pat", ["support"], by="root")
    people.grant("pat", "refund_approver", by="olga")
    people.revoke("pat", "support", by="olga")
    people.disable("pat", by="olga")
    audrey = {"Authorization": "Bearer tok-audrey"}
    answer = client.get("/api/access/trail", params={"format": "csv"}, headers=audrey)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    rows = table(answer.text)
    entries = client.get("/api/access/trail", headers=audrey).json()["entries"]
    assert [(r["id"], r["by"], r["action"], r["subject"]) for r in rows] == [
        (str(e["id"]), e["by"], e["action"], e["subject"]) for e in entries
    ]
    assert [r["action"] for r in rows] == ["person.added", "role.granted", "role.revoked", "person.disabled"]
    assert '"refund_approver"' in rows[1]["details"] and re.match(r"^\d{4}-\d\d-\d\dT.*Z$", rows[0]["at"])
    refused = client.get("/api/access/trail", params={"format": "csv"}, headers={"Authorization": "Bearer tok-dana"})
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
