"""The work queue (#19): every task waiting on a person, on the page and at GET /api/work, with the buttons the
state allows for the person and their roles, over the reference workflows and their fakes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from html import unescape
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import Engine, Registry, ScriptedModel
from engine.api import TokenTable, create_app
from engine.providers.scripted import call
from tests.support.api import documented, login
from tests.support.reference import DAMAGED, books, fake_systems, refund  # noqa: F401  (books: a fixture)
from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE, fakes
from workflows.scripts import TICKET_DOUBLE_CHARGE, TICKET_DOUBLE_CHARGE_INPUT

#: dana and erin approve refunds and expenses; sam works the ticket queue; olga picks up expired expense claims.
TOKENS: dict[str, tuple[str, set[str]]] = {
    "tok-dana": ("dana", {"refund_approver", "expense_approver"}),
    "tok-erin": ("erin", {"refund_approver", "expense_approver"}),
    "tok-sam": ("sam", {"support_agent"}),
    "tok-olga": ("olga", {"expense_operator", "refund_operator"}),
    "tok-pat": ("pat", {"customer_portal"}),
    "tok-ann": ("ann", set()),
    "tok-audrey": ("audrey", {"auditor"}),
}


@pytest.fixture
def eng(db_url: str, books: fakes.Systems) -> Iterator[Engine]:  # noqa: F811
    tokens = TokenTable.from_tokens(TOKENS)
    with Engine(db_url, Registry([REFUND_V1, TICKET_TRIAGE, EXPENSE]), authoriser=tokens) as engine:
        yield engine


@pytest.fixture
def client(eng: Engine) -> Iterator[TestClient]:
    app = create_app(eng, TokenTable.from_tokens(TOKENS), session_secret="test-secret")
    with TestClient(app, follow_redirects=False) as c:
        yield documented(c)


def flash(client: TestClient, response: Any, task_id: str) -> str:
    assert response.status_code == 303 and response.headers["location"] == f"/tasks/{task_id}", response.text
    found = re.search(r'id="flash">(.*?)</p>', client.get(f"/tasks/{task_id}").text, flags=re.S)
    return found.group(1) if found else ""


def words(html: str) -> str:
    """A page's text as a reader sees it: tags dropped, entities decoded, white space folded."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def refund_at_approval(eng: Engine) -> str:
    task_id = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(12_999),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    return task_id


def refund_failed(eng: Engine, books: fakes.Systems) -> str:  # noqa: F811
    task_id = refund_at_approval(eng)
    eng.approve(task_id, actor="dana", prepared_digest=eng.load(task_id).prepared["digest"])  # type: ignore[index]
    books.arm("payments.refund", "remote_error")
    assert eng.run(task_id).state == "retryable_failure"
    return task_id


def ticket_queued(eng: Engine) -> str:
    task_id = eng.start("ticket_triage", TICKET_DOUBLE_CHARGE_INPUT, actor="helpdesk")
    assert eng.run(task_id, model=ScriptedModel(TICKET_DOUBLE_CHARGE)).state == "human_queue"
    return task_id


def expense_in_review(eng: Engine, employee: str = "eve") -> str:
    task_id = eng.start("expense", {"employee": employee, "limit_cents": 50_000}, actor=employee)
    claim = call("submit", amount_cents=12_345, currency="EUR", description="Train to the customer visit")
    assert eng.run(task_id, model=ScriptedModel([claim], profile="anthropic")).state == "review"
    return task_id


def test_the_queue_holds_every_kind_of_work_for_the_roles_held_and_counts_the_rest(
    client: TestClient,
    eng: Engine,
    books: fakes.Systems,  # noqa: F811
) -> None:
    approval, failure = refund_at_approval(eng), refund_failed(eng, books)
    ticket, expense = ticket_queued(eng), expense_in_review(eng)
    login(client, "dana")
    html = client.get("/inbox").text
    assert f'id="work-{approval}"' in html and f'id="work-{expense}"' in html  # a row each
    assert failure not in html  # an operator's: counted, not drawn
    assert ticket not in html  # sam's workflow, where dana holds no role: neither drawn nor counted
    assert "1 more wait on roles which you do not hold" in html  # the failed payment: an operator's to retry
    body = client.get("/api/work", headers={"Authorization": "Bearer tok-dana"}).json()
    # Nearest deadline first (the refund's 48 h, the expense's 72 h).
    assert [i["task_id"] for i in body["items"]] == [approval, expense]
    kinds = {i["task_id"]: (i["kind"], i["triggers"]) for i in body["items"]}
    assert kinds[expense] == ("approval", ["approve", "send_back"])  # no reject: expense has none; no cancel:
    assert kinds[approval] == ("approval", ["approve", "reject"])  # cancelling is the operators'
    assert {(c["kind"], c["workflow"]): (c["yours"], c["others"]) for c in body["counts"]} == {
        ("approval", "refund"): (1, 0),
        ("approval", "expense"): (1, 0),
        ("failure", "refund"): (0, 1),
    }
    olga = client.get("/api/work", headers={"Authorization": "Bearer tok-olga"}).json()
    assert [(i["task_id"], i["kind"], i["triggers"]) for i in olga["items"]] == [
        (failure, "failure", ["retry_refund", "give_up", "cancel"])
    ]
    sam = client.get("/api/work", headers={"Authorization": "Bearer tok-sam"}).json()
    assert [(i["task_id"], i["kind"], i["triggers"]) for i in sam["items"]] == [
        (ticket, "handoff", ["resolve", "ask_customer", "cancel", "redrive"])  # support agents run the queue
    ]
    only = client.get("/api/work", params={"kind": "failure"}, headers={"Authorization": "Bearer tok-olga"}).json()
    assert [i["task_id"] for i in only["items"]] == [failure]
    audrey = client.get("/api/work", headers={"Authorization": "Bearer tok-audrey"}).json()
    assert audrey["items"] == []  # a read-only token may fire nothing


def test_the_expense_card_offers_approve_and_send_back_and_never_reject(client: TestClient, eng: Engine) -> None:
    task_id = expense_in_review(eng)
    csrf = login(client, "dana")
    html = client.get(f"/tasks/{task_id}").text
    assert f'action="/tasks/{task_id}/approve"' in html and 'name="trigger" value="send_back"' in html
    assert f'action="/tasks/{task_id}/reject"' not in html and "123.45 EUR" in html
    seq = str(eng.load(task_id).seq)
    sent = client.post(
        f"/tasks/{task_id}/fire",
        data={"csrf": csrf, "seq": seq, "trigger": "send_back", "arg.comment": "Add the receipt"},
    )
    assert "send back is recorded" in flash(client, sent, task_id)
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger, last.to_state, last.data["args"]) == (
        "dana",
        "send_back",
        "drafting",
        {"comment": "Add the receipt"},
    )


def test_an_operator_retries_a_failed_payment_from_the_task_page(
    client: TestClient,
    eng: Engine,
    books: fakes.Systems,  # noqa: F811
) -> None:
    task_id = refund_failed(eng, books)
    login(client, "dana")  # the approver reads it, and may not retry it
    assert 'value="retry_refund"' not in client.get(f"/tasks/{task_id}").text
    csrf = login(client, "olga")
    html = client.get(f"/tasks/{task_id}").text
    assert "Confirm: retry the payment (runs payments_refund for 129.99 EUR)" in html  # a write asks first
    seq = str(eng.load(task_id).seq)
    response = client.post(f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": "retry_refund"})
    assert "retry refund is recorded" in flash(client, response, task_id)
    assert eng.get(task_id).state == "executing"
    assert eng.run(task_id).state == "completed"


def test_a_support_agent_resolves_a_queued_ticket_and_a_form_without_its_note_changes_nothing(
    client: TestClient, eng: Engine
) -> None:
    task_id = ticket_queued(eng)
    csrf = login(client, "sam")
    assert f'id="work-{task_id}"' in client.get("/inbox").text
    seq = str(eng.load(task_id).seq)
    before = len(eng.history(task_id))
    empty = client.post(f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": "resolve", "arg.note": ""})
    assert "PAYLOAD_INVALID" in flash(client, empty, task_id)
    assert len(eng.history(task_id)) == before  # refused: the log is unchanged
    done = client.post(
        f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": "resolve", "arg.note": "Refunded twice"}
    )
    assert "resolve is recorded" in flash(client, done, task_id)
    assert eng.get(task_id).state == "resolved"


def test_cancel_from_a_task_page_and_a_trigger_the_role_lacks_is_refused(client: TestClient, eng: Engine) -> None:
    task_id = ticket_queued(eng)
    csrf = login(client, "pat")  # the portal reads tickets, and may neither resolve nor cancel one
    html = client.get(f"/tasks/{task_id}").text
    assert 'name="trigger" value="cancel"' not in html and 'value="resolve"' not in html
    seq = str(eng.load(task_id).seq)
    refused = client.post(
        f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": "resolve", "arg.note": "x"}
    )
    assert "FORBIDDEN" in flash(client, refused, task_id) and eng.get(task_id).state == "human_queue"
    before = len(eng.history(task_id))
    for trigger in ("expired", "hand_off", "approve", "no-such"):  # the engine's own, a decision, a bad name
        forged = client.post(f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": trigger})
        assert re.search(r"FORBIDDEN|TRIGGER_NOT_ALLOWED|PAYLOAD_INVALID", flash(client, forged, task_id)), trigger
    assert len(eng.history(task_id)) == before  # nothing written
    csrf = login(client, "sam")  # the support agent runs the queue: cancel is offered
    assert 'name="trigger" value="cancel"' in client.get(f"/tasks/{task_id}").text
    stale = client.post(
        f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": "1", "trigger": "cancel", "arg.reason": "dup"}
    )
    assert "CONCURRENCY_CONFLICT" in flash(client, stale, task_id) and eng.get(task_id).state == "human_queue"
    done = client.post(
        f"/tasks/{task_id}/fire", data={"csrf": csrf, "seq": seq, "trigger": "cancel", "arg.reason": "Duplicate"}
    )
    assert "cancel is recorded" in flash(client, done, task_id)
    last = eng.history(task_id)[-1]
    assert (last.actor, last.trigger, last.to_state) == ("sam", "cancel", "cancelled")


def test_the_work_api_is_bounded_and_pages_oldest_first_without_repeats(client: TestClient, eng: Engine) -> None:
    started = [expense_in_review(eng, f"e{n:02d}") for n in range(30)]
    auth = {"Authorization": "Bearer tok-dana"}
    seen: list[str] = []
    url: str | None = "/api/work?limit=12"
    pages = 0
    while url is not None:
        body = client.get(url, headers=auth).json()
        assert len(body["items"]) <= 12 and body["limit"] == 12
        seen += [i["task_id"] for i in body["items"]]
        url, pages = body["next"], pages + 1
    assert seen == started and pages == 3
    for bad in ({"limit": 101}, {"limit": 0}, {"kind": "everything"}, {"cursor": "t1.bm9wZQ"}, {"cursor": "x"}):
        response = client.get("/api/work", params=bad, headers=auth)
        assert response.status_code == 422, (bad, response.text)
    assert client.get("/api/work").status_code == 401
    login(client, "dana")
    html = client.get("/inbox").text
    assert html.count('<tr id="work-') == 30 and 'id="last-page"' in html and "page 1 of 1" in html
    assert 'class="card approval"' not in html  # rows, not cards: a card opens on demand


def test_the_timeline_of_a_repaired_approved_and_recovered_refund_says_each_in_words(
    client: TestClient,
    eng: Engine,
    books: fakes.Systems,  # noqa: F811
) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(15_000),  # over the balance: refused, fed back, repaired
            refund(12_999),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    csrf = login(client, "dana")
    digest = eng.load(task_id).prepared["digest"]  # type: ignore[index]
    seq = str(eng.load(task_id).seq)
    approved = client.post(
        f"/tasks/{task_id}/approve", data={"csrf": csrf, "seq": seq, "digest": digest, "comment": "photo checked"}
    )
    assert "approved" in flash(client, approved, task_id)
    books.arm("payments.refund", "lost_reply")  # the provider paid; its answer never came back
    assert eng.run(task_id).state == "retryable_failure"
    eng.fire(task_id, "retry_refund", actor="olga")
    assert eng.run(task_id).state == "completed"
    html = client.get(f"/tasks/{task_id}").text
    text = words(html)
    # grouped by stay, each stay named by the workflow's label for its state (`REFUND_LABELS`)
    assert "In Proposing a refund" in text and "In Waiting for approval" in text and "In Paying the refund" in text
    assert "refused with DOMAIN_INVALID, fed back: within_refundable_balance: amount 15000 exceeds" in text
    assert "the model answered, refused: propose_refund(" in text  # the refused answer itself
    assert "approve by dana as refund_approver: photo checked" in text
    assert f"decided on the prepared call with digest {digest}" in text
    assert "TOOL_REMOTE_ERROR" in text
    assert "recovered by reconciliation: the call (action" in text
    assert "its outcome was not known (the answer was lost" in text  # a lost reply, not a crash
    assert "asked the remote what became of that action id instead of calling again" in text
    assert html.count("mark-recovered") == 1 and html.count("mark-repair") == 1
    assert html.count('<details class="raw">') == len(eng.history(task_id))  # the raw JSON, one click away


def test_decision_cards_show_what_each_reference_workflow_declares_and_a_default_otherwise(
    client: TestClient, eng: Engine
) -> None:
    approval, ticket = refund_at_approval(eng), ticket_queued(eng)
    expense = expense_in_review(eng)
    login(client, "dana")
    text = words(client.get(f"/tasks/{approval}").text)
    assert "Refund 129.99 EUR to C-100 for order O-1001" in text
    assert "the customer's message My laptop arrived with a cracked screen." in text
    assert "order total 129.99 EUR" in text and "still refundable 129.99 EUR" in text  # money, not 12999
    assert re.search(r"query_order returned \(read at 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", text)
    assert re.search(r"proposed by model:scripted:scripted at 20\d\d-", text)
    assert re.search(r"deadline 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC ?, then it goes to needs_human", text)
    assert (
        "Approve the refund: to Paying the refund: runs payments_refund (a write)" in text
        and "Reject: ends the task: No refund" in text  # the states by the workflow's labels
    )
    text = words(client.get("/inbox", params={"open": expense}).text)  # the card opens in place
    assert "Expense of 123.45 EUR by eve: Train to the customer visit" in text
    assert "the employee's limit 500.00 EUR" in text
    login(client, "sam")
    text = words(client.get(f"/tasks/{ticket}").text)
    assert "Ticket T-5001:" in text and "why it was escalated" in text and "not on record" not in text


def test_a_workflow_without_a_card_gets_the_default(db_url: str, tmp_path: Any) -> None:
    from tests.support.api import make_api_engine, make_app, to_approval

    with make_api_engine(db_url, tmp_path) as engine, TestClient(make_app(engine), follow_redirects=False) as c:
        task_id = to_approval(engine)
        page = c.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf and c.post("/login", data={"token": "tok-dana", "csrf": csrf.group(1)}).status_code == 303
        html = c.get(f"/tasks/{task_id}").text
        assert "shop refund waiting in awaiting_approval" in html and "<caption>Inputs</caption>" in html


def test_an_operator_settles_an_open_write_through_its_generated_form(db_url: str, tmp_path: Any) -> None:
    from tests.support.api import make_api_engine, make_app, to_open_write

    with make_api_engine(db_url, tmp_path) as engine, TestClient(make_app(engine), follow_redirects=False) as c:
        task_id = to_open_write(engine)
        csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/login").text)
        assert csrf and c.post("/login", data={"token": "tok-olga", "csrf": csrf.group(1)}).status_code == 303
        html = c.get(f"/tasks/{task_id}").text
        form = re.search(
            r'<form method="post" action="/tasks/[^"]+/fire" class="trigger trigger-settle">.*?</form>', html, re.S
        )
        assert form, html
        assert '<select id="settle-outcome-' in form.group(0) and '<option value="not_executed">' in form.group(0)
        page_csrf = re.search(r'name="csrf" value="([^"]+)"', html)
        assert page_csrf
        data = {"csrf": page_csrf.group(1), "seq": str(engine.load(task_id).seq), "trigger": "settle"}
        bad = c.post(f"/tasks/{task_id}/fire", data={**data, "arg.outcome": "maybe", "arg.evidence": "x"})
        assert "PAYLOAD_INVALID" in flash(c, bad, task_id) and engine.get(task_id).unsettled is not None
        done = c.post(
            f"/tasks/{task_id}/fire", data={**data, "arg.outcome": "not_executed", "arg.evidence": "PSP ticket 42"}
        )
        assert "settle is recorded" in flash(c, done, task_id)
        last = engine.history(task_id)[-1]
        assert (last.actor, last.trigger, last.data["settled"]["outcome"]) == ("olga", "settle", "not_executed")


def test_the_queue_filters_by_how_long_a_task_has_waited(client: TestClient, eng: Engine) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import text

    from tests.support.stores import sql_store

    old, new = expense_in_review(eng, "eve"), expense_in_review(eng, "finn")
    two_days_ago = datetime.now(UTC) - timedelta(days=2)
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE tasks SET updated_at = :at WHERE task_id = :id"), {"at": two_days_ago, "id": old})
    auth = {"Authorization": "Bearer tok-dana"}

    def ids(**params: str) -> list[str]:
        return [i["task_id"] for i in client.get("/api/work", params=params, headers=auth).json()["items"]]

    assert ids() == [old, new] and ids(older_than="1d") == [old] and ids(older_than="3d") == []
    assert client.get("/api/work", params={"older_than": "2h"}, headers=auth).status_code == 422
    login(client, "dana")
    html = client.get("/inbox", params={"older_than": "1d"}).text
    assert f'id="work-{old}"' in html and new not in html and 'value="1d" selected' in html
    assert re.search(r"2 d 0 h", words(html))


def test_the_counts_are_of_what_the_filters_select_and_say_so(
    client: TestClient,
    eng: Engine,
    books: fakes.Systems,  # noqa: F811
) -> None:
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import text

    from tests.support.stores import sql_store

    approval, failure = refund_at_approval(eng), refund_failed(eng, books)
    old, new = expense_in_review(eng, "eve"), expense_in_review(eng, "finn")
    ticket = ticket_queued(eng)  # sam's workflow, where dana holds no role: not even counted
    two_days_ago = datetime.now(UTC) - timedelta(days=2)
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for task_id in (old, failure, ticket):
            conn.execute(
                text("UPDATE tasks SET updated_at = :at WHERE task_id = :id"), {"at": two_days_ago, "id": task_id}
            )
    auth = {"Authorization": "Bearer tok-dana"}

    def queue(**params: str) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[str, int], list[str]]:
        body = client.get("/api/work", params=params, headers=auth).json()
        counts = {(c["kind"], c["workflow"]): (c["yours"], c["others"]) for c in body["counts"]}
        return counts, body["total"], [i["task_id"] for i in body["items"]]

    everything = queue()
    assert everything[0] == {
        ("approval", "refund"): (1, 0),
        ("approval", "expense"): (2, 0),
        ("failure", "refund"): (0, 1),  # an operator's to retry: counted, not listed
    }
    assert everything[1] == {"yours": 3, "others": 1} and len(everything[2]) == 3
    assert queue(kind="approval") == (
        {("approval", "refund"): (1, 0), ("approval", "expense"): (2, 0)},
        {"yours": 3, "others": 0},
        [approval, old, new],
    )
    assert queue(workflow="refund") == (
        {("approval", "refund"): (1, 0), ("failure", "refund"): (0, 1)},
        {"yours": 1, "others": 1},
        [approval],
    )
    assert queue(older_than="1d") == (
        {("approval", "expense"): (1, 0), ("failure", "refund"): (0, 1)},
        {"yours": 1, "others": 1},  # the failure waited as long, on a role dana lacks: counted, not listed
        [old],
    )
    assert queue(workflow="ticket_triage") == ({}, {"yours": 0, "others": 0}, [])  # what she may not read
    assert queue(kind="failure", workflow="expense") == ({}, {"yours": 0, "others": 0}, [])
    # Every page's items add up to the total of what the filters select.
    assert sum(len(queue(kind=k)[2]) for k in ("approval", "failure", "handoff")) == everything[1]["yours"]

    login(client, "dana")
    text_of = words(client.get("/inbox", params={"workflow": "ticket_triage", "older_than": "1d"}).text)
    assert "Of the work these filters select (workflow ticket_triage, waiting longer than a day)" in text_of
    assert "Nothing these filters select waits on anyone." in text_of
    page = client.get("/inbox", params={"kind": "approval"}).text
    shown = words(page)
    assert (
        "Of the work these filters select (kind approvals)" in shown
        and "Failures to retry" not in shown.split("by kind and workflow")[1].split("Nearest deadline")[0]
    )
    # The kind menu says what choosing each kind would find under the other filters, whatever kind is chosen.
    assert re.search(r'<option value="failure">Failures to retry \(0\)</option>', page)  # none of them hers
    assert re.search(r'<option value="approval" selected>Approvals \(3\)</option>', page)
    assert 'id="total-yours">3<' in page and 'id="total-others">0<' in page
    everything_page = words(client.get("/inbox").text)
    assert "Of all the work waiting on people" in everything_page
    assert "1 more wait on roles which you do not hold" in everything_page


def test_the_timeline_of_a_repaired_approved_and_crash_recovered_refund_says_each_in_words(
    client: TestClient,
    eng: Engine,
    books: fakes.Systems,  # noqa: F811
    db_url: str,
    tmp_path: Any,
) -> None:
    """A refund the model proposed too much for (refused, repaired), approved, and whose worker process is
    SIGKILLed between the payment's intent and its outcome (the provider has paid, its answer is held): another
    worker resumes the task and reconciles by action id instead of paying again, and the task page says each in
    words, and `railyard history` that the payment was recovered by reconciliation."""
    import signal
    import subprocess
    import time
    from itertools import takewhile

    from typer.testing import CliRunner

    from engine import Worker
    from engine.cli import app as cli
    from tests.support.reference import expire_leases
    from tests.test_effects import RAILYARD, wait_for, worker_env
    from workflows.refund_tools import SETTLE_SECONDS

    task_id = eng.start("refund", DAMAGED, actor="ann")
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(15_000),  # over the balance: refused, fed back, repaired
            refund(12_999),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"
    digest = eng.load(task_id).prepared["digest"]  # type: ignore[index]
    eng.approve(task_id, actor="dana", prepared_digest=digest, comment="photo checked")
    books.arm("payments.refund", "hold_after")  # the provider pays, then holds its answer
    worker = subprocess.Popen(
        [RAILYARD, "worker", "--once", "--workflows", "refund", "--lease-seconds", "1"],
        env=worker_env(db_url, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: books.held("payments.refund"), what="the payment call to reach the provider")
        worker.send_signal(signal.SIGKILL)  # between the intent, on record, and the outcome, never recorded
        assert worker.wait(timeout=30) == -signal.SIGKILL
    finally:
        worker.kill()
    stranded = eng.get(task_id)
    assert stranded.state == "executing" and stranded.unsettled is not None
    assert stranded.unsettled["status"] == "pending"
    expire_leases(eng)
    time.sleep(SETTLE_SECONDS)  # the killed worker's call can no longer land
    assert Worker(eng, name="heir", listen=False).run_once() == 1
    assert eng.get(task_id).state == "completed"
    events = eng.history(task_id)
    assert [e.trigger for e in events][-2:] == ["call", "succeeded"] and events[-1].data["reconciled"] is True
    assert books.payments.executions() == {events[-1].data["action_id"]: 1}  # paid once

    login(client, "dana")
    html = client.get(f"/tasks/{task_id}").text
    text = words(html)
    assert "payments_refund: succeeded, recovered by reconciliation" in text
    assert (
        "recovered by reconciliation: the call (action "
        f"{events[-1].data['action_id'][:12]}) was made once; the worker that made it stopped before recording its "
        "outcome (it crashed, or lost its lease), so the worker that took the task over asked the remote what "
        "became of that action id instead of calling again, and this outcome is what it found"
    ) in text
    assert html.count("mark-recovered") == 1 and f'id="event-{events[-1].seq}"' in html
    assert "refused with DOMAIN_INVALID, fed back: within_refundable_balance: amount 15000 exceeds" in text
    assert html.count("mark-repair") == 1 and html.count("mark-approval") == 1
    assert "approve by dana as refund_approver: photo checked" in text
    assert f"decided on the prepared call with digest {digest}" in text

    shown = CliRunner().invoke(cli, ["history", task_id], env={"RAILYARD_DATABASE_URL": db_url})
    assert shown.exit_code == 0, shown.output
    # The row of the recovered payment, its data column read across the lines it wraps over.
    lines = shown.stdout.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith(f"│ {events[-1].seq} "))
    row = [lines[first], *takewhile(lambda line: line.startswith("│     │"), lines[first + 1 :])]
    said = " ".join(line.split("│")[-2].strip() for line in row)
    assert said.startswith("payments_refund: succeeded, recovered by reconciliation"), said


def test_an_operator_sends_a_task_that_ran_out_of_budget_back_from_its_page(
    db_url: str,
    books: fakes.Systems,  # noqa: F811
) -> None:
    import dataclasses

    from engine import Budgets

    tight = dataclasses.replace(REFUND_V1, version=2, budgets=Budgets(repeats=2))
    tokens = TokenTable.from_tokens(TOKENS)
    with (
        Engine(db_url, Registry([REFUND_V1, tight, TICKET_TRIAGE, EXPENSE]), authoriser=tokens) as eng,
        TestClient(create_app(eng, tokens, session_secret="s"), follow_redirects=False) as c,
    ):
        task_id = eng.start("refund", DAMAGED, actor="ann", version=2)
        looping = ScriptedModel([call("query_order", order_id="O-1001")] * 6, profile="anthropic")
        assert eng.run(task_id, model=looping).state == "limit_exceeded"
        csrf = login(c, "dana")  # the approver: the redrive (the workflow's operator role) is not offered
        assert 'class="trigger trigger-redrive"' not in c.get(f"/tasks/{task_id}").text
        csrf = login(c, "olga")
        html = c.get(f"/tasks/{task_id}").text
        form = re.search(
            r'<form method="post" action="/tasks/[^"]+/redrive" class="trigger trigger-redrive">.*?</form>', html, re.S
        )
        assert form, html
        assert re.findall(r'<option value="([^"]*)">', form.group(0)) == ["collecting_information", "looking_up_order"]
        assert f'id="work-{task_id}"' in c.get("/inbox").text
        assert "Send back" in words(c.get("/inbox", params={"open": task_id}).text)
        seq = str(eng.load(task_id).seq)
        stale = c.post(
            f"/tasks/{task_id}/redrive",
            data={"csrf": csrf, "seq": "1", "to_state": "collecting_information", "reason": "try again"},
        )
        assert "CONCURRENCY_CONFLICT" in flash(c, stale, task_id) and eng.get(task_id).state == "limit_exceeded"
        done = c.post(
            f"/tasks/{task_id}/redrive",
            data={"csrf": csrf, "seq": seq, "to_state": "collecting_information", "reason": "The order is found now"},
        )
        assert "Sent back to collecting_information" in flash(c, done, task_id)
        last = eng.history(task_id)[-1]
        assert (last.actor, last.trigger, last.to_state, last.data["reason"]) == (
            "olga",
            "redrive",
            "collecting_information",
            "The order is found now",
        )
        assert "redriven by olga, budgets reset: The order is found now" in words(c.get(f"/tasks/{task_id}").text)


# -- #32: the queue as a table, claims, bulk decisions ----------------------------------------------
def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr id="work-([^"]+)"', html)


def test_the_queue_sorts_searches_and_pages_and_page_two_is_not_page_one(client: TestClient, eng: Engine) -> None:
    started = [expense_in_review(eng, f"e{n:02d}") for n in range(60)]
    login(client, "dana")
    first = client.get("/inbox").text
    assert rows_of(first) == started[:50]  # no deadline differs: oldest first
    assert "1-50 of 60" in words(first) and "page 1 of 2" in first
    following = re.search(r'href="([^"]*)" id="next-page"', first)
    assert following is not None
    second = client.get(unescape(following.group(1))).text
    assert rows_of(second) == started[50:] and "51-60 of 60" in words(second) and "page 2 of 2" in second
    newest = client.get("/inbox", params={"sort": "created", "order": "desc"}).text
    assert rows_of(newest) == started[::-1][:50]
    assert 'href="/inbox?sort=created"' in newest  # its header link sorts the other way
    found = client.get("/inbox", params={"q": started[7][:13]}).text
    assert rows_of(found) == [started[7]] and "1-1 of 1" in words(found)
    assert "matching" in words(found)  # the counts say what they are of
    assert client.get("/inbox", params={"sort": "nonsense"}).status_code == 422
    assert client.get("/inbox", params={"order": "sideways"}).status_code == 422


def test_after_a_decision_on_the_opened_item_the_queue_opens_the_next(client: TestClient, eng: Engine) -> None:
    one, two = expense_in_review(eng, "eve"), expense_in_review(eng, "finn")
    csrf = login(client, "dana")
    opened = client.get("/inbox", params={"open": one}).text
    then = re.search(r'name="then" value="([^"]+)"', opened)
    assert then is not None and f"open={two}" in unescape(then.group(1))
    done = client.post(
        f"/tasks/{one}/approve",
        data={"csrf": csrf, "seq": str(eng.load(one).seq), "comment": "ok", "then": unescape(then.group(1))},
    )
    assert done.status_code == 303 and f"open={two}" in done.headers["location"]
    page = client.get(done.headers["location"]).text
    assert "Your decision (approved) is recorded." in page and f'id="approval-{two}"' in page
    assert rows_of(page) == [two] and eng.get(one).state == "paid"
    # A refused decision does not move on: the task page says why.
    stale = client.post(f"/tasks/{two}/approve", data={"csrf": csrf, "seq": "1", "comment": "ok", "then": "/inbox"})
    assert stale.headers["location"] == f"/tasks/{two}"
    # `then` is a path of this server or nothing.
    away = client.post(
        f"/tasks/{two}/approve",
        data={"csrf": csrf, "seq": str(eng.load(two).seq), "comment": "ok", "then": "https://evil.example/"},
    )
    assert away.headers["location"] == "/inbox" and eng.get(two).state == "paid"


def test_a_claim_shows_who_is_on_an_item_and_another_approver_is_refused_unless_taking_it_over(
    client: TestClient, eng: Engine
) -> None:
    task_id = expense_in_review(eng, "eve")
    before = eng.history(task_id)
    dana = {"Authorization": "Bearer tok-dana"}
    erin = {"Authorization": "Bearer tok-erin"}
    claimed = client.post(f"/api/tasks/{task_id}/claim", json={}, headers=dana)
    assert claimed.status_code == 200 and claimed.json()["actor"] == "dana"
    assert claimed.json()["seq"] == eng.load(task_id).seq and claimed.json()["taken_from"] is None
    [item] = client.get("/api/work", headers=erin).json()["items"]
    assert (item["claimed_by"], item["seq"]) == ("dana", eng.load(task_id).seq)
    refused = client.post(f"/api/tasks/{task_id}/claim", json={}, headers=erin)
    assert refused.status_code == 409 and refused.json()["code"] == "WORK_CLAIMED"
    assert refused.json()["details"]["claimed_by"] == "dana" and "dana is on task" in refused.json()["message"]
    blank = client.post(f"/api/tasks/{task_id}/claim", json={"take_over": ""}, headers=erin)
    assert blank.status_code == 422 and blank.json()["code"] == "PAYLOAD_INVALID"
    assert (
        client.post(f"/api/tasks/{task_id}/claim", json={}, headers={"Authorization": "Bearer tok-audrey"}).json()[
            "code"
        ]
        == "FORBIDDEN"
    )
    assert (
        client.post(f"/api/tasks/{task_id}/claim", json={}, headers={"Authorization": "Bearer tok-sam"}).json()["code"]
        == "TASK_NOT_FOUND"
    )  # sam may not read expenses: to him the task does not exist
    taken = client.post(f"/api/tasks/{task_id}/claim", json={"take_over": "dana is out today"}, headers=erin).json()
    assert (taken["actor"], taken["taken_from"], taken["reason"]) == ("erin", "dana", "dana is out today")
    # Each claim is an event where the task stands (the take-over with its reason); refusals wrote nothing.
    added = eng.history(task_id)[len(before) :]
    assert [(e.trigger, e.actor, e.to_state) for e in added] == [
        ("work_claimed", "dana", "review"),
        ("work_claimed", "erin", "review"),
    ]
    assert (added[1].data["claim"]["taken_from"], added[1].data["claim"]["reason"]) == ("dana", "dana is out today")
    # On the page: erin sees herself on it, dana sees erin and the take-over, with its reason.
    login(client, "dana")
    page = words(client.get("/inbox", params={"open": task_id}).text)
    assert "erin is on it" in page and "taken over from dana: dana is out today" in page
    assert client.delete(f"/api/tasks/{task_id}/claim", headers=erin).status_code == 204
    assert "nobody" in words(client.get("/inbox").text)


def test_two_approvers_claiming_at_once_one_wins_and_the_other_is_told_who(client: TestClient, eng: Engine) -> None:
    from tests.support.races import together

    task_ids = [expense_in_review(eng, f"e{n}") for n in range(4)]

    def claims(task_id: str, who: str) -> Callable[[], Any]:
        return lambda: client.post(
            f"/api/tasks/{task_id}/claim", json={}, headers={"Authorization": f"Bearer tok-{who}"}
        )

    for task_id in task_ids:
        answers = together(claims(task_id, "dana"), claims(task_id, "erin"))
        codes = sorted(a.status_code for a in answers)  # type: ignore[attr-defined]
        assert codes == [200, 409], codes
        won = next(a.json()["actor"] for a in answers if a.status_code == 200)  # type: ignore[attr-defined]
        lost = next(a.json() for a in answers if a.status_code == 409)  # type: ignore[attr-defined]
        assert lost["code"] == "WORK_CLAIMED" and lost["details"]["claimed_by"] == won


def test_a_claim_from_the_page_and_its_end_when_the_task_is_decided(client: TestClient, eng: Engine) -> None:
    task_id = expense_in_review(eng, "eve")
    csrf = login(client, "dana")
    back = f"/inbox?open={task_id}"
    done = client.post(f"/tasks/{task_id}/claim", data={"csrf": csrf, "then": back})
    assert done.status_code == 303 and done.headers["location"] == back
    page = words(client.get(back).text)
    assert "You are on it: the others see that you have it." in page and "you are on it" in page
    login(client, "erin")
    page = client.get(back).text
    assert "dana is on it" in words(page) and "Take it over" in page
    refused = client.post(f"/tasks/{task_id}/claim", data={"csrf": csrf_of_page(page), "then": back})
    assert refused.headers["location"] == back
    assert "WORK_CLAIMED" in client.get(back).text
    eng.approve(task_id, actor="erin", prepared_digest=None, comment="ok", expected_seq=eng.load(task_id).seq)
    assert eng.get(task_id).state == "paid"  # the claim ended with the decision: nothing to show or hold
    assert client.post(f"/tasks/{task_id}/claim", data={"csrf": csrf_of_page(page), "then": back}).status_code == 303
    assert "TASK_TERMINAL" in client.get(back).text


def csrf_of_page(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


def test_a_bulk_approval_decides_each_row_on_its_own_seq_and_refuses_the_one_that_moved(
    client: TestClient, eng: Engine
) -> None:
    started = [expense_in_review(eng, f"e{n:02d}") for n in range(10)]
    csrf = login(client, "dana")
    page = client.get("/inbox").text
    picks = re.findall(r'name="pick" value="([^"]+)"', page)
    assert [p.split(":")[0] for p in picks] == started
    stale = started[3]
    eng.signal(stale, "cancel", {"reason": "withdrawn"}, actor="olga")  # it moves after the page was drawn
    before = eng.history(stale)
    answer = client.post(
        "/inbox/bulk", data={"csrf": csrf, "decision": "approve", "reason": "Receipts match.", "pick": picks}
    )
    assert answer.status_code == 200
    shown = words(answer.text)
    assert "Approve: 9 of 10 done" in shown and "CONCURRENCY_CONFLICT" in shown and "cancelled" in shown
    assert re.search(rf'id="result-{stale}" data-done="no"', answer.text)
    assert eng.history(stale) == before  # refused, never applied
    assert [eng.get(t).state for t in started if t != stale] == ["paid"] * 9
    # Sent again (a reload): every seq has moved, nothing is decided twice.
    again = client.post("/inbox/bulk", data={"csrf": csrf, "decision": "approve", "pick": picks})
    assert "Approve: 0 of 10 done" in words(again.text)
    assert sum(e.trigger == "approve" for t in started for e in eng.history(t)) == 9
    # Rejecting or cancelling needs a reason; a made-up row is refused as one.
    left = expense_in_review(eng, "zed")
    pick = f"{left}:{eng.load(left).seq}:"
    none = client.post("/inbox/bulk", data={"csrf": csrf, "decision": "cancel", "pick": [pick]})
    assert "PAYLOAD_INVALID" in none.text and eng.get(left).state == "review"
    bad = client.post("/inbox/bulk", data={"csrf": csrf, "decision": "approve", "reason": "x", "pick": ["nope"]})
    assert "PAYLOAD_INVALID" in bad.text and "0 of 1 done" in words(bad.text)


def test_the_api_carries_the_handles_to_decide_and_documents_one_enum_per_kind(client: TestClient, eng: Engine) -> None:
    task_id = refund_at_approval(eng)
    auth = {"Authorization": "Bearer tok-dana"}
    body = client.get(f"/api/tasks/{task_id}", headers=auth)
    prepared = body.json()["prepared"]
    assert prepared["digest"] == eng.load(task_id).prepared["digest"]  # type: ignore[index]
    assert prepared["kind"] == "write" and prepared["tool"] == "payments_refund"
    assert body.headers["ETag"] == f'"{body.json()["seq"]}"'
    [item] = client.get("/api/work", headers=auth).json()["items"]
    assert (item["digest"], item["seq"]) == (prepared["digest"], body.json()["seq"])
    approved = client.post(
        f"/api/tasks/{task_id}/approve",
        json={"digest": item["digest"], "comment": "ok"},
        headers={**auth, "If-Match": f'"{item["seq"]}"'},
    )
    assert approved.status_code == 200 and approved.json()["state"] == "executing"
    document = client.get("/api/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert schemas["WorkKind"]["enum"] == ["approval", "handoff", "failure", "limit", "cancel_review", "wait"]
    assert schemas["WorkItemBody"]["properties"]["kind"]["$ref"] == "#/components/schemas/WorkKind"
    assert "PreparedCallBody" in schemas and schemas["ToolKind"]["enum"] == ["read", "write"]
    for path in ("/api/tasks", "/api/work"):
        for parameter in document["paths"][path]["get"]["parameters"]:
            assert parameter["schema"].get("default") != "", (path, parameter["name"])  # unset: not sent
    kind = next(p for p in document["paths"]["/api/work"]["get"]["parameters"] if p["name"] == "kind")
    assert {"$ref": "#/components/schemas/WorkKind"} in kind["schema"]["anyOf"]
