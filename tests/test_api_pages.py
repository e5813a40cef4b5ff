"""The back-office pages without a browser: login, sessions, CSRF, escaping, filters, refusals shown with codes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from engine import Engine
from tests.support.api import make_api_engine, make_app, to_approval, to_open_write

SCRIPT = "<script>alert('reason')</script>"


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(make_app(engine), follow_redirects=False) as c:
        yield c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


def seqs_of(html: str, task_id: str) -> list[str]:
    """The seq each decision form of `task_id` carries, in page order."""
    forms = re.findall(
        rf'<form method="post" action="/tasks/{re.escape(task_id)}/(?:approve|reject)".*?</form>', html, flags=re.S
    )
    return [m.group(1) for f in forms if (m := re.search(r'name="seq" value="(\d+)"', f))]


def login(client: TestClient, who: str) -> str:
    """Log in through the form; returns the CSRF token of the new session (from the next page)."""
    page = client.get("/login")
    response = client.post("/login", data={"token": f"tok-{who}", "csrf": csrf_of(page.text)})
    assert response.status_code == 303 and response.headers["location"] == "/inbox"
    return csrf_of(client.get("/inbox").text)


def test_pages_need_a_session(client: TestClient) -> None:
    for url in ("/inbox", "/tasks", "/tasks/abc"):
        response = client.get(url)
        assert response.status_code == 303 and response.headers["location"] == "/login"
    assert client.get("/").headers["location"] == "/inbox"


def test_login_sets_a_signed_httponly_samesite_strict_cookie(client: TestClient) -> None:
    page = client.get("/login")
    response = client.post("/login", data={"token": "tok-dana", "csrf": csrf_of(page.text)})
    cookie = response.headers["set-cookie"]
    assert "railyard_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "tok-dana" not in cookie
    assert "dana" in client.get("/inbox").text
    client.cookies.clear()
    client.cookies.set("railyard_session", "forged.value.here")
    assert client.get("/inbox").status_code == 303


def test_a_wrong_token_or_a_missing_login_csrf_is_refused(client: TestClient) -> None:
    page = client.get("/login")
    wrong = client.post("/login", data={"token": "tok-nobody", "csrf": csrf_of(page.text)})
    assert wrong.status_code == 401 and "not one this server knows" in wrong.text
    client.cookies.clear()
    assert client.post("/login", data={"token": "tok-dana", "csrf": "made-up"}).status_code == 403


def test_a_post_without_the_sessions_csrf_token_is_refused(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    login(client, "dana")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    for csrf in ("", "forged"):
        response = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})
        assert response.status_code in (403, 422)
    assert engine.get(task_id).state == "awaiting_approval"


def test_the_inbox_shows_the_prepared_call_evidence_reason_and_history(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine, text="Customer sent photos of the damage.")
    login(client, "dana")
    html = client.get("/inbox").text
    assert f'id="approval-{task_id}"' in html
    assert "40.00 EUR" in html and "refund_payment" in html  # minor units shown as money
    assert "damaged parcel" in html and "Customer sent photos of the damage." in html  # the model's reason
    assert "Parcel arrived damaged." in html and "50.00 EUR" in html  # evidence: the order, balance as money
    assert "propose_refund" in html and "query_order" in html  # the history so far
    assert 'action="/tasks/' + task_id + '/approve"' in html


def test_model_and_tool_text_is_escaped(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(
        engine,
        {"order_id": "O-1", "amount_cents": 100, "currency": "EUR", "reason": SCRIPT},
        text=f"<img src=x onerror=alert(1)> {SCRIPT}",
    )
    login(client, "dana")
    for url in ("/inbox", f"/tasks/{task_id}"):
        html = client.get(url).text
        assert SCRIPT not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(&#39;reason&#39;)&lt;/script&gt;" in html


def test_approving_from_the_page_records_the_sessions_actor(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "dana")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    seq = engine.load(task_id).seq
    response = client.post(
        f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest, "comment": "ok", "seq": str(seq)}
    )
    assert response.status_code == 303 and response.headers["location"] == f"/tasks/{task_id}?done=approved"
    last = engine.history(task_id)[-1]
    assert (last.actor, last.trigger, last.data["approval"]["comment"]) == ("dana", "approve", "ok")
    again = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})  # a form without seq
    assert again.status_code == 409 and "TASK_NOT_AWAITING_APPROVAL" in again.text


def test_every_decision_form_carries_the_seq_it_was_rendered_at(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    login(client, "dana")
    seq = str(engine.load(task_id).seq)
    for url in ("/inbox", f"/tasks/{task_id}"):
        assert seqs_of(client.get(url).text, task_id) == [seq, seq], url  # approve and reject


@pytest.mark.parametrize("form", ["approve", "reject"])
def test_a_stale_form_is_refused_with_the_state_the_task_is_in_now(
    client: TestClient, engine: Engine, form: str
) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "dana")
    [seq, _] = seqs_of(client.get("/inbox").text, task_id)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    engine.signal(task_id, "cancel", {"reason": "customer withdrew"}, actor="ann")  # while the page was open
    fields = {"approve": {"digest": digest, "comment": "ok"}, "reject": {"reason": "no"}}[form]
    response = client.post(f"/tasks/{task_id}/{form}", data={"csrf": csrf, "seq": seq, **fields})
    assert response.status_code == 409 and "CONCURRENCY_CONFLICT" in response.text
    assert "&#39;cancelled&#39;" in response.text  # the state it is in now, named on the error page
    assert [e.trigger for e in engine.history(task_id)][-1] == "cancel" and engine.get(task_id).state == "cancelled"


def test_a_reject_form_left_open_while_another_approver_approved_is_stale(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "erin")
    [_, seq] = seqs_of(client.get(f"/tasks/{task_id}").text, task_id)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    engine.approve(task_id, actor="dana", prepared_digest=digest, expected_seq=int(seq))
    response = client.post(f"/tasks/{task_id}/reject", data={"csrf": csrf, "seq": seq, "reason": "duplicate"})
    assert response.status_code == 409 and "CONCURRENCY_CONFLICT" in response.text
    assert "&#39;executing&#39;" in response.text
    assert [e.trigger for e in engine.history(task_id) if "approval" in e.data] == ["approve"]
    assert seqs_of(client.get(f"/tasks/{task_id}").text, task_id) == []  # nothing left to decide


def test_rejecting_from_the_page(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "erin")
    response = client.post(
        f"/tasks/{task_id}/reject",
        data={"csrf": csrf, "reason": "duplicate claim", "seq": str(engine.load(task_id).seq)},
    )
    assert response.status_code == 303
    assert engine.get(task_id).state == "rejected"
    assert engine.history(task_id)[-1].data["approval"]["comment"] == "duplicate claim"


def test_without_the_role_the_page_offers_no_buttons_and_the_server_refuses(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "bob")
    html = client.get("/inbox").text
    assert "Nothing waits for a decision you can take." in html
    assert "which you do not hold" in html and f'action="/tasks/{task_id}/approve"' not in html
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    response = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})
    assert response.status_code == 403 and "APPROVAL_FORBIDDEN" in response.text
    assert engine.get(task_id).state == "awaiting_approval"


def test_an_auditor_session_cannot_decide(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "audrey")
    assert "read-only" in client.get(f"/tasks/{task_id}").text
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    response = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})
    assert response.status_code == 403 and "FORBIDDEN" in response.text


def test_the_task_page_shows_timeline_path_and_diagram(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    login(client, "bob")
    html = client.get(f"/tasks/{task_id}").text
    assert 'id="task-state">awaiting_approval<' in html
    assert "stateDiagram" in html and "collecting --&gt; awaiting_approval" in html
    assert "propose_refund" in html and "system:tools" in html
    assert client.get("/tasks/no-such-task").status_code == 404


def test_the_task_page_shows_an_open_write_and_a_cancel_waiting_for_it(client: TestClient, engine: Engine) -> None:
    task_id = to_open_write(engine)
    engine.cancel(task_id, actor="ann", reason="<b>customer</b> called")
    login(client, "olga")
    html = client.get(f"/tasks/{task_id}").text
    assert 'id="task-unsettled"' in html and "refund_payment" in html and "is pending" in html
    assert 'id="task-cancel-requested"' in html and "by ann" in html
    assert "&lt;b&gt;customer&lt;/b&gt; called" in html  # the reason is text
    plain = to_approval(engine)
    assert "task-unsettled" not in client.get(f"/tasks/{plain}").text


def test_the_task_list_filters(client: TestClient, engine: Engine) -> None:
    waiting = to_approval(engine)
    other = engine.start("counter", actor="ann")
    login(client, "bob")
    assert waiting in client.get("/tasks").text and other in client.get("/tasks").text
    filtered = client.get("/tasks", params={"workflow": "counter", "state": "", "status": "runnable"}).text
    assert other in filtered and waiting not in filtered
    by_state = client.get("/tasks", params={"state": "awaiting_approval"}).text
    assert waiting in by_state and other not in by_state
    assert client.get("/tasks", params={"status": "<b>"}).status_code == 422


def test_logout_ends_the_session(client: TestClient) -> None:
    csrf = login(client, "dana")
    response = client.post("/logout", data={"csrf": csrf})
    assert response.status_code == 303
    assert client.get("/inbox").status_code == 303
