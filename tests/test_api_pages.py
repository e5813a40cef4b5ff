"""The back-office pages without a browser: login, sessions, CSRF, origins, escaping, filters, refusals shown with
codes after a redirect."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

from engine import Engine
from engine.api import create_app
from engine.api.auth import LOGIN_FAILURES_PER_ACCOUNT, LOGIN_FAILURES_PER_ADDRESS, LOGIN_WINDOW_SECONDS
from tests.support.api import (
    csrf_of,
    live_server,
    login,
    make_api_engine,
    make_app,
    to_approval,
    to_open_write,
    token_table,
)

SCRIPT = "<script>alert('reason')</script>"


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(make_app(engine), follow_redirects=False) as c:
        yield c


def seqs_of(html: str, task_id: str) -> list[str]:
    """The seq each decision form of `task_id` carries, in page order."""
    forms = re.findall(
        rf'<form method="post" action="/tasks/{re.escape(task_id)}/(?:approve|reject)".*?</form>', html, flags=re.S
    )
    return [m.group(1) for f in forms if (m := re.search(r'name="seq" value="(\d+)"', f))]


def after_redirect(client: TestClient, response: Any, to: str) -> str:
    """The page a command redirected to (Post/Redirect/Get), as the browser then loads it."""
    assert response.status_code == 303, response.text
    assert response.headers["location"] == to
    page = client.get(to)
    assert page.status_code == 200
    return page.text


def flash_of(html: str) -> str | None:
    found = re.search(r'<p class="flash [a-z]+" role="(?:alert|status)" id="flash">(.*?)</p>', html, flags=re.S)
    return found.group(1) if found else None


def test_pages_need_a_session_and_send_the_browser_back_after_the_login(client: TestClient) -> None:
    for url in ("/inbox", "/tasks", "/tasks/abc", "/tasks?state=review&q=C-1"):
        response = client.get(url)
        assert response.status_code == 303 and response.headers["location"] == f"/login?next={quote(url, safe='')}"
    assert client.get("/").headers["location"] == "/inbox"
    page = client.get("/login", params={"next": "/tasks?state=review&q=C-1"})
    assert 'name="next" value="/tasks?state=review&amp;q=C-1"' in page.text
    data = {"token": "tok-dana", "csrf": csrf_of(page.text), "next": "/tasks?state=review&q=C-1"}
    response = client.post("/login", data=data)
    assert response.status_code == 303 and response.headers["location"] == "/tasks?state=review&q=C-1"


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/x",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        " /tasks",
        "/tasks\nLocation: https://evil.example",
        "/login",
        "tasks",
        "",
    ],
)
def test_a_login_never_redirects_off_this_server(client: TestClient, target: str) -> None:
    page = client.get("/login", params={"next": target})
    assert 'name="next" value="/inbox"' in page.text  # the page does not even carry it
    response = client.post("/login", data={"token": "tok-dana", "csrf": csrf_of(page.text), "next": target})
    assert response.status_code == 303 and response.headers["location"] == "/inbox"


def test_login_sets_an_httponly_samesite_strict_cookie_naming_a_server_side_session(
    client: TestClient, engine: Engine
) -> None:
    page = client.get("/login")
    response = client.post("/login", data={"token": "tok-dana", "user": "dana", "csrf": csrf_of(page.text)})
    cookie = response.headers["set-cookie"]
    assert "railyard_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "tok-dana" not in cookie and "dana" not in cookie.split(";")[0]
    assert "dana" in client.get("/inbox").text
    # The session is the database's, not the process's: a restarted server (another app) still knows it.
    with TestClient(create_app(engine, token_table(), session_secret="another"), follow_redirects=False) as other:
        other.cookies.set("railyard_session", client.cookies["railyard_session"])
        assert 'id="actor">dana<' in other.get("/inbox").text
    client.cookies.clear()
    client.cookies.set("railyard_session", "forged.value.here")
    assert client.get("/inbox").status_code == 303


def test_a_wrong_token_or_a_missing_login_csrf_is_refused(client: TestClient) -> None:
    page = client.get("/login")
    wrong = client.post("/login", data={"token": "tok-nobody", "csrf": csrf_of(page.text)})
    assert wrong.status_code == 401 and "not one this server knows" in wrong.text
    someone_elses = client.post("/login", data={"token": "tok-dana", "user": "erin", "csrf": csrf_of(wrong.text)})
    assert someone_elses.status_code == 401 and "railyard_session" not in someone_elses.headers.get("set-cookie", "")
    assert client.post("/login", data={"token": "tok-dana"}).status_code == 403  # no csrf field at all
    client.cookies.clear()
    assert client.post("/login", data={"token": "tok-dana", "csrf": "made-up"}).status_code == 403


def test_a_post_without_the_sessions_csrf_token_is_refused_with_403_and_writes_nothing(
    client: TestClient, engine: Engine
) -> None:
    task_id = to_approval(engine)
    login(client, "dana")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    before = engine.history(task_id)
    for form in ({"csrf": "", "digest": digest}, {"csrf": "forged", "digest": digest}, {"digest": digest}):
        response = client.post(f"/tasks/{task_id}/approve", data=form)
        assert response.status_code == 403 and "FORBIDDEN" in response.text, form
        assert f'href="/tasks/{task_id}" id="back"' in response.text and 'id="logout"' in response.text
    # Missing with every other field missing too (a reject with no reason): still 403, not the schema's 422.
    assert client.post(f"/tasks/{task_id}/reject", data={}).status_code == 403
    assert client.post("/logout", data={}).status_code == 403
    assert engine.history(task_id) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://testserver.evil.example"},
        {"Referer": "https://evil.example/page"},
        {"Origin": "https://evil.example", "Referer": "http://testserver/tasks"},
    ],
)
def test_a_post_from_a_foreign_origin_is_refused_even_with_a_valid_token(
    client: TestClient, engine: Engine, headers: dict[str, str]
) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "dana")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    before = engine.history(task_id)
    data = {"csrf": csrf, "digest": digest, "seq": str(engine.load(task_id).seq)}
    response = client.post(f"/tasks/{task_id}/approve", data=data, headers=headers)
    assert response.status_code == 403 and "FORBIDDEN" in response.text
    assert client.post("/logout", data={"csrf": csrf}, headers=headers).status_code == 403
    page = client.get("/login")
    login_form = {"token": "tok-dana", "csrf": csrf_of(page.text)}
    assert client.post("/login", data=login_form, headers=headers).status_code == 403
    assert engine.history(task_id) == before
    same = client.post(f"/tasks/{task_id}/approve", data=data, headers={"Origin": "http://testserver"})
    assert same.status_code == 303 and engine.get(task_id).state != "awaiting_approval"


def test_the_inbox_shows_the_prepared_call_evidence_reason_and_history(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine, text="Customer sent photos of the damage.")
    login(client, "dana")
    html = client.get("/inbox", params={"open": task_id}).text  # its row, and its card opened in place
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
    html = after_redirect(client, response, f"/tasks/{task_id}")
    assert flash_of(html) == "Your decision (approved) is recorded."
    assert flash_of(client.get(f"/tasks/{task_id}").text) is None  # shown once: a reload does not repeat it
    last = engine.history(task_id)[-1]
    assert (last.actor, last.trigger, last.data["approval"]["comment"]) == ("dana", "approve", "ok")
    again = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})  # a form without seq
    assert "TASK_NOT_AWAITING_APPROVAL" in (flash_of(after_redirect(client, again, f"/tasks/{task_id}")) or "")
    assert [e.trigger for e in engine.history(task_id)].count("approve") == 1


def test_the_recorded_banner_comes_from_the_server_not_the_url(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    login(client, "erin")
    for query in ("?done=rejected", "?done=approved", "?flash=Refund+sent"):
        html = client.get(f"/tasks/{task_id}{query}").text
        assert flash_of(html) is None and "is recorded" not in html and "Refund sent" not in html


def test_a_refused_command_redirects_to_the_page_with_the_code_and_the_header(
    client: TestClient, engine: Engine
) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "dana")
    response = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": "0" * 64})
    html = after_redirect(client, response, f"/tasks/{task_id}")
    assert "APPROVAL_STALE" in (flash_of(html) or "") and 'role="alert"' in html
    assert 'id="logout"' in html and engine.get(task_id).state == "awaiting_approval"
    missing = client.get("/tasks/no-such-task")
    assert missing.status_code == 404 and 'id="logout"' in missing.text  # the error page keeps the header
    bad = client.post(f"/tasks/{task_id}/reject", data={"csrf": csrf, "reason": ""})  # a field that fails
    assert "PAYLOAD_INVALID" in (flash_of(after_redirect(client, bad, f"/tasks/{task_id}")) or "")
    assert engine.get(task_id).state == "awaiting_approval"
    client.cookies.delete("railyard_session")  # without a session a command is sent to the login page
    lost = client.post(f"/tasks/{task_id}/reject", data={"csrf": csrf, "reason": "x"})
    assert lost.status_code == 303 and lost.headers["location"] == "/login"


def test_every_decision_form_carries_the_seq_it_was_rendered_at(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    login(client, "dana")
    seq = str(engine.load(task_id).seq)
    for url in (f"/inbox?open={task_id}", f"/tasks/{task_id}"):
        assert seqs_of(client.get(url).text, task_id) == [seq, seq], url  # approve and reject
    assert f'data-seq="{seq}"' in client.get("/inbox").text  # the queue's row, for a bulk decision


@pytest.mark.parametrize("form", ["approve", "reject"])
def test_a_stale_form_is_refused_with_the_state_the_task_is_in_now(
    client: TestClient, engine: Engine, form: str
) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "dana")
    [seq, _] = seqs_of(client.get("/inbox", params={"open": task_id}).text, task_id)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    engine.signal(task_id, "cancel", {"reason": "customer withdrew"}, actor="ann")  # while the page was open
    fields = {"approve": {"digest": digest, "comment": "ok"}, "reject": {"reason": "no"}}[form]
    response = client.post(f"/tasks/{task_id}/{form}", data={"csrf": csrf, "seq": seq, **fields})
    shown = flash_of(after_redirect(client, response, f"/tasks/{task_id}")) or ""
    assert "CONCURRENCY_CONFLICT" in shown
    assert "&#39;cancelled&#39;" in shown  # the state it is in now, named in the refusal
    assert [e.trigger for e in engine.history(task_id)][-1] == "cancel" and engine.get(task_id).state == "cancelled"


def test_a_reject_form_left_open_while_another_approver_approved_is_stale(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "erin")
    [_, seq] = seqs_of(client.get(f"/tasks/{task_id}").text, task_id)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    engine.approve(task_id, actor="dana", prepared_digest=digest, expected_seq=int(seq))
    response = client.post(f"/tasks/{task_id}/reject", data={"csrf": csrf, "seq": seq, "reason": "duplicate"})
    shown = flash_of(after_redirect(client, response, f"/tasks/{task_id}")) or ""
    assert "CONCURRENCY_CONFLICT" in shown and "&#39;executing&#39;" in shown
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
    assert "APPROVAL_FORBIDDEN" in (flash_of(after_redirect(client, response, f"/tasks/{task_id}")) or "")
    assert engine.get(task_id).state == "awaiting_approval"


def test_an_auditor_session_cannot_decide(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    csrf = login(client, "audrey")
    assert "read-only" in client.get(f"/tasks/{task_id}").text
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    response = client.post(f"/tasks/{task_id}/approve", data={"csrf": csrf, "digest": digest})
    assert "FORBIDDEN" in (flash_of(after_redirect(client, response, f"/tasks/{task_id}")) or "")
    assert engine.get(task_id).state == "awaiting_approval"


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


def test_logout_ends_the_session_for_every_copy_of_its_cookie(client: TestClient, engine: Engine) -> None:
    csrf = login(client, "dana")
    copied = client.cookies["railyard_session"]
    with TestClient(make_app(engine), follow_redirects=False) as thief:
        thief.cookies.set("railyard_session", copied)
        assert thief.get("/inbox").status_code == 200  # a copy works while the session lasts
        response = client.post("/logout", data={"csrf": csrf})
        assert response.status_code == 303 and response.headers["location"] == "/login"
        assert client.get("/inbox").status_code == 303
        after = thief.get("/inbox")
        assert after.status_code == 303 and after.headers["location"].startswith("/login")
        assert thief.post("/logout", data={"csrf": csrf}).status_code == 303  # no session: to the login page


def test_failed_logins_are_limited_per_account_and_per_address(client: TestClient, engine: Engine) -> None:
    def attempt(token: str, user: str = "", via: TestClient = client) -> int:
        """A login from one address; its status (and the last answer in `answers`)."""
        page = via.get("/login")
        answers.append(via.post("/login", data={"token": token, "user": user, "csrf": csrf_of(page.text)}))
        via.cookies.delete("railyard_session")
        return int(answers[-1].status_code)

    answers: list[Any] = []

    for _ in range(LOGIN_FAILURES_PER_ACCOUNT):
        assert attempt("guess", "Dana") == 401  # the name in any letter case
    assert attempt("tok-dana", "dana") == 429  # the right token, but the account is locked from this address
    assert "LOGIN_THROTTLED" in answers[-1].text and "railyard_session" not in answers[-1].headers.get("set-cookie", "")
    assert 0 < int(answers[-1].headers["Retry-After"]) <= LOGIN_WINDOW_SECONDS
    assert attempt("tok-dana") == 429  # unnamed: the account is known once the token is
    # From anywhere else, dana logs in: whoever typed her name five times cannot lock her out.
    with TestClient(make_app(engine), follow_redirects=False, client=("10.9.9.9", 50000)) as elsewhere:
        assert attempt("tok-dana", "dana", elsewhere) == 303
    assert attempt("tok-erin", "erin") == 303  # another account is not locked
    # One person's typos lock out that person, not the office behind the address: dana's five counted once.
    for _ in range(3 * LOGIN_FAILURES_PER_ADDRESS):
        assert attempt("guess", "bob") in (401, 429)
    assert attempt("tok-bob", "bob") == 429 and attempt("tok-erin", "erin") == 303
    for _ in range(LOGIN_FAILURES_PER_ADDRESS - 3):  # dana's, bob's and one more account's count for the address
        assert attempt("guess") == 401  # unnamed guesses each count
    assert attempt("tok-olga", "olga") == 303
    assert attempt("guess", "olga") == 401  # the twentieth: the address has spent its failures
    assert attempt("tok-erin", "erin") == 429


def test_a_burst_of_logins_sent_at_once_is_counted_one_by_one(engine: Engine) -> None:
    """Sixty wrong tokens from one address at the same moment over a real server: no more than the limit are
    tried; the rest are throttled."""
    with live_server(make_app(engine)) as base:
        forms = []
        for _ in range(60):
            browser = httpx.Client(base_url=base, follow_redirects=False)
            forms.append((browser, csrf_of(browser.get("/login").text)))
        start = threading.Barrier(len(forms))

        def guess(pair: tuple[httpx.Client, str]) -> int:
            browser, csrf = pair
            start.wait()
            return browser.post("/login", data={"token": "guess", "csrf": csrf}).status_code

        with ThreadPoolExecutor(len(forms)) as pool:
            statuses = list(pool.map(guess, forms))
        for browser, _ in forms:
            browser.close()
    assert statuses.count(401) == LOGIN_FAILURES_PER_ADDRESS and statuses.count(429) == 60 - LOGIN_FAILURES_PER_ADDRESS


def test_a_login_replaces_the_browsers_session(client: TestClient) -> None:
    login(client, "dana")
    dana = client.cookies["railyard_session"]
    login(client, "erin")
    with TestClient(client.app, follow_redirects=False, cookies={"railyard_session": dana}) as copy:
        assert copy.get("/inbox").status_code == 303  # dana's earlier session ended when erin logged in here


def test_over_a_real_server_a_copied_cookie_dies_at_logout_and_a_foreign_origin_is_refused(engine: Engine) -> None:
    task_id = to_approval(engine)
    with live_server(make_app(engine)) as base, httpx.Client(base_url=base, follow_redirects=False) as browser:
        page = browser.get("/login")
        logged_in = browser.post("/login", data={"token": "tok-dana", "user": "dana", "csrf": csrf_of(page.text)})
        assert logged_in.status_code == 303
        cookie = browser.cookies["railyard_session"]
        csrf = csrf_of(browser.get("/inbox").text)
        digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
        forged = browser.post(
            f"/tasks/{task_id}/approve",
            data={"csrf": csrf, "digest": digest},
            headers={"Origin": "https://evil.example"},
        )
        assert forged.status_code == 403 and engine.get(task_id).state == "awaiting_approval"
        with httpx.Client(base_url=base, follow_redirects=False, cookies={"railyard_session": cookie}) as copy:
            assert copy.get("/inbox").status_code == 200
            assert browser.post("/logout", data={"csrf": csrf}, headers={"Origin": base}).status_code == 303
            assert copy.get("/inbox").headers["location"] == "/login?next=%2Finbox"


def test_a_task_is_found_by_the_first_8_characters_of_its_id_on_its_page_and_in_the_search(
    client: TestClient, engine: Engine
) -> None:
    waiting, other = to_approval(engine), engine.start("counter", actor="ann")
    login(client, "bob")
    html = client.get(f"/tasks/{waiting[:8]}").text
    assert 'id="task-state">awaiting_approval<' in html and waiting in html
    found = client.get("/tasks", params={"q": waiting[:8]}).text
    assert waiting in found and other not in found
    assert client.get(f"/tasks/{waiting[:7]}").status_code == 404  # shorter than a task id typed short


def test_the_task_page_shows_each_model_turns_rung_and_whether_it_was_a_first_try_answer(
    client: TestClient, engine: Engine
) -> None:
    from engine.providers.scripted import ScriptedModel, call
    from tests.support.api import REFUND

    task_id = engine.start("shop_refund", {"customer": "c1"}, actor="ann")
    lookup, proposal = call("query_order", order_id="O-1"), call("propose_refund", **REFUND)
    no_reason = call("propose_refund", **{**REFUND, "reason": ""})
    model = ScriptedModel([lookup, no_reason, proposal], profile="anthropic")
    assert engine.run(task_id, model=model).state == "awaiting_approval"
    login(client, "dana")
    html = client.get(f"/tasks/{task_id}").text
    steps = re.findall(r'<li class="step[^"]*" id="event-(\d+)">(.*?)</li>', html, flags=re.S)
    tags = {seq: found[0] for seq, step in steps if (found := re.findall(r'<span class="tag turn">(.*?)</span>', step))}
    turns = [e for e in engine.history(task_id) if "turn" in e.data]
    rung = turns[0].data["turn"]["strategy"]
    # The lookup and the refused proposal answered first asks; the accepted proposal answered the repair.
    assert [tags[str(e.seq)] for e in turns] == [
        f"rung {rung} · first-try answer",
        f"rung {rung} · first-try answer",
        f"rung {rung} · answer to a repair",
    ]
    assert len(tags) == len(turns)  # no other event is tagged


def test_the_workflow_page_shows_each_states_quality_figures_of_the_last_seven_days(
    client: TestClient, engine: Engine
) -> None:
    from datetime import UTC, datetime, timedelta

    from engine.api.views import workflow_page
    from engine.providers.scripted import ScriptedModel, call
    from tests.support.api import REFUND

    task_id = engine.start("shop_refund", {"customer": "c1"}, actor="ann")
    lookup, proposal = call("query_order", order_id="O-1"), call("propose_refund", **REFUND)
    no_reason = call("propose_refund", **{**REFUND, "reason": ""})
    assert engine.run(task_id, model=ScriptedModel([lookup, no_reason, proposal], model="m1")).state == (
        "awaiting_approval"
    )
    login(client, "dana")
    assert 'href="/workflows/shop_refund" id="workflow-link"' in client.get(f"/tasks/{task_id}").text
    html = client.get("/workflows/shop_refund").text
    collecting = re.search(r'<section class="state-quality" id="state-collecting".*?</section>', html, flags=re.S)
    assert collecting is not None
    section = collecting.group(0)
    # Two first asks (the lookup, accepted; the proposal without a reason, refused) and the repair's answer.
    assert "scripted:m1" in section and '<td class="first-try">1/2 (50%)</td>' in section
    assert '<td class="fields">reason 1</td>' in section
    assert '<td class="escalations">0</td>' in section  # a schema failure is repaired on the same rung
    assert "Time in collecting" in section and "<td>collecting</td><td>2</td>" in section.replace("\n", "")
    waiting = re.search(r'id="state-awaiting_approval".*?</section>', html, flags=re.S)
    assert waiting is not None and "Nothing in the last 7 days." in waiting.group(0)  # the visit is still open
    # Eight days later the turns are out of the period.
    later = workflow_page(engine, "shop_refund", engine.caller("dana"), datetime.now(UTC) + timedelta(days=8))
    assert all(not s.turns and not s.visits for s in later.states)
    assert client.get("/workflows/nosuch").status_code == 404


def test_every_page_names_a_model_whose_breaker_is_open_until_it_closes(client: TestClient, engine: Engine) -> None:
    """A task slowed by an open breaker shows nothing wrong on its own page: the banner says why, on every page."""
    from engine.core.flow import BreakerSettings
    from engine.store.protocol import FlowStore

    store = engine.store
    assert isinstance(store, FlowStore)
    login(client, "dana")
    assert 'id="paused-models"' not in client.get("/inbox").text
    settings = BreakerSettings(failures=2, cool_down_seconds=600)
    store.breaker_failed("openai:gpt-test", settings)
    assert 'id="paused-models"' not in client.get("/inbox").text  # one failure in a row: still closed
    store.breaker_failed("openai:gpt-test", settings)
    for url in ("/inbox", "/tasks", "/workflows/shop_refund"):
        html = client.get(url).text
        banner = re.search(r'<section class="flash paused" role="status" id="paused-models".*?</section>', html, re.S)
        assert banner is not None, url
        assert "<code>openai:gpt-test</code> are paused after 2 failures in a row" in banner.group(0)
        assert re.search(r"a probe call is let through in (59\d|600) s", banner.group(0))
    store.breaker_closed("openai:gpt-test")
    assert 'id="paused-models"' not in client.get("/inbox").text
