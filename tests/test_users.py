"""`railyard users` and database tokens against a running server (issue #28): add, grant, revoke and disable take
effect on the next request without a restart, a wrong password says no more than an unknown name, passwords are
never shown or recorded, a revoked or expired database token stops at once, and every change is in the access
trail that auditors read."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from engine import Code, Engine, RailyardError
from engine.api.auth import LOGIN_FAILURES_PER_ACCOUNT
from engine.api.tokens import hash_token
from engine.core.canonical import now
from engine.core.people import AccessAction
from engine.runtime.people import People
from tests.support.api import bearer, csrf_of, live_server, make_api_engine, make_app, to_approval

PASSWORD = "a long enough secret phrase"
runner = CliRunner()


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


@pytest.fixture
def server(engine: Engine) -> Iterator[str]:
    with live_server(make_app(engine)) as url:
        yield url


def railyard(db_url: str, *argv: str, stdin: str | None = None, code: int = 0) -> str:
    """The CLI as an operator runs it beside the server: its own engine over the same database."""
    done = runner.invoke(_cli(), list(argv), input=stdin, env={"RAILYARD_DATABASE_URL": db_url})
    assert done.exit_code == code, (argv, done.stdout, done.stderr)
    return done.stdout + done.stderr


def _cli() -> Any:
    from engine.cli import app

    return app


def log_in(client: httpx.Client, user: str, password: str) -> httpx.Response:
    form = client.get("/login")
    data = {"user": user, "password": password, "csrf": csrf_of(form.text)}
    return client.post("/login", data=data)


def test_add_grant_revoke_and_disable_take_effect_on_a_running_server_and_each_is_in_the_trail(
    engine: Engine, db_url: str, server: str
) -> None:
    task_id = to_approval(engine)
    railyard(db_url, "users", "add", "pat", "--role", "support", "--password-stdin", "--by", "root", stdin=PASSWORD)
    approve = f'action="/tasks/{task_id}/approve"'
    with httpx.Client(base_url=server, follow_redirects=False) as browser:
        assert log_in(browser, "pat", PASSWORD).status_code == 303
        page = browser.get(f"/tasks/{task_id}")
        assert page.status_code == 200 and 'id="actor">pat<' in page.text and approve not in page.text

        railyard(db_url, "users", "grant", "pat", "refund_approver", "--by", "olga")
        page = browser.get(f"/tasks/{task_id}")  # the very next request, the same session
        assert approve in page.text

        railyard(db_url, "users", "revoke", "pat", "refund_approver", "--by", "olga")
        page = browser.get(f"/tasks/{task_id}")
        assert approve not in page.text
        # A form rendered before the revocation is refused by the engine, which asks the people table too.
        digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
        form = {"csrf": csrf_of(page.text), "digest": digest, "seq": str(engine.load(task_id).seq)}
        sent = browser.post(f"/tasks/{task_id}/approve", data=form, headers={"Origin": server})
        assert sent.status_code == 303
        assert "APPROVAL_FORBIDDEN" in browser.get(sent.headers["location"]).text
        assert engine.load(task_id).state == "awaiting_approval"

        railyard(db_url, "users", "disable", "pat", "--by", "olga")
        gone = browser.get(f"/tasks/{task_id}")
        assert gone.status_code == 303 and gone.headers["location"].startswith("/login")
    with httpx.Client(base_url=server, follow_redirects=False) as again:
        refused = log_in(again, "pat", PASSWORD)
        assert refused.status_code == 401 and "railyard_session" not in refused.headers.get("set-cookie", "")
        railyard(db_url, "users", "enable", "pat", "--by", "olga")
        railyard(db_url, "users", "grant", "pat", "refund_approver", "--by", "olga")
        assert log_in(again, "pat", PASSWORD).status_code == 303
        page = again.get(f"/tasks/{task_id}")
        form = {"csrf": csrf_of(page.text), "digest": digest, "seq": str(engine.load(task_id).seq)}
        assert again.post(f"/tasks/{task_id}/approve", data=form, headers={"Origin": server}).status_code == 303
    last = engine.history(task_id)[-1]
    assert (last.actor, last.trigger) == ("pat", "approve")

    trail = json.loads(railyard(db_url, "users", "trail", "--json", "--name", "pat"))
    assert [(e["by"], e["action"], e["details"].get("role")) for e in trail] == [
        ("root", "person.added", None),
        ("olga", "role.granted", "refund_approver"),
        ("olga", "role.revoked", "refund_approver"),
        ("olga", "person.disabled", None),
        ("olga", "person.enabled", None),
        ("olga", "role.granted", "refund_approver"),
    ]
    assert all(re.match(r"^\d{4}-\d\d-\d\dT", e["at"]) for e in trail)
    # Auditors read the same trail over HTTP; anyone else is refused.
    with httpx.Client(base_url=server) as api:
        page_of = api.get("/api/access/trail", params={"limit": 2}, headers=bearer("audrey")).json()
        assert [e["action"] for e in page_of["entries"]] == ["person.added", "role.granted"]
        rest = api.get("/api/access/trail", params={"after": page_of["next"]}, headers=bearer("audrey")).json()
        assert len(rest["entries"]) == 4 and rest["next"] is None
        assert rest["entries"][-1]["by"] == "olga" and rest["entries"][-1]["subject"] == "pat"
        refused = api.get("/api/access/trail", headers=bearer("dana"))
        assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"


def test_a_wrong_password_and_an_unknown_name_get_the_same_answer_and_count_against_the_login_limit(
    engine: Engine, db_url: str, server: str
) -> None:
    People(engine.store).add("pat", ["support"], password=PASSWORD, by="root")
    with httpx.Client(base_url=server, follow_redirects=False) as browser:
        wrong = log_in(browser, "pat", "not the password at all")
        unknown = log_in(browser, "nobody", PASSWORD)
        assert wrong.status_code == unknown.status_code == 401

        def message(response: httpx.Response) -> str:
            found = re.search(r'id="login-error">(.*?)<', response.text)
            assert found is not None
            return found.group(1)

        assert message(wrong) == message(unknown)
        for _ in range(LOGIN_FAILURES_PER_ACCOUNT - 1):
            log_in(browser, "pat", "not the password at all")
        throttled = log_in(browser, "pat", PASSWORD)  # the right password, past the account's limit
        assert throttled.status_code == 429 and "LOGIN_THROTTLED" in throttled.text
        assert log_in(browser, "someone", "whatever it is here").status_code == 401  # the address is not locked


def test_passwords_are_argon2_hashes_and_never_shown_recorded_or_logged(
    engine: Engine, db_url: str, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shown = railyard(db_url, "users", "add", "pat", "--role", "support", "--password-stdin", stdin=PASSWORD + "\n")
    shown += railyard(db_url, "users", "passwd", "pat", "--password-stdin", stdin="another secret phrase\n")
    shown += railyard(db_url, "users", "list") + railyard(db_url, "users", "list", "--json")
    shown += railyard(db_url, "users", "trail") + railyard(db_url, "users", "trail", "--json")
    with httpx.Client(base_url=server, follow_redirects=False) as browser:
        assert log_in(browser, "pat", PASSWORD).status_code == 401  # changed
        assert log_in(browser, "pat", "another secret phrase").status_code == 303
        shown += browser.get("/inbox").text
    with httpx.Client(base_url=server) as api:
        shown += api.get("/api/access/trail", headers=bearer("audrey")).text
    person = People(engine.store).get("pat")
    assert person is not None and person.password_hash is not None
    assert person.password_hash.startswith("$argon2id$")
    everything = shown + caplog.text
    for secret in (PASSWORD, "another secret phrase", person.password_hash, "$argon2"):
        assert secret not in everything
    assert json.loads(railyard(db_url, "users", "list", "--json"))[0]["password"] is True
    trail = People(engine.store).trail(subject="pat")
    assert [c.action for c in trail] == [AccessAction.PERSON_ADDED, AccessAction.PASSWORD_SET]
    assert trail[1].details == {}


def test_a_database_token_works_until_revoked_or_expired_without_a_restart(
    engine: Engine, db_url: str, server: str
) -> None:
    made = railyard(db_url, "tokens", "new", "--actor", "ci-bot", "--role", "operator", "--save", "--by", "root")
    token = re.search(r"only its hash is kept\): (\S+)", made)
    assert token is not None
    listed = json.loads(railyard(db_url, "tokens", "list", "--json"))
    [row] = [r for r in listed if r["source"] == "database"]
    assert (row["actor"], row["roles"], row["revoked"]) == ("ci-bot", ["operator"], None)
    assert token.group(1) not in json.dumps(listed)
    with httpx.Client(base_url=server, follow_redirects=False) as client:
        me = client.get("/api/me", headers={"Authorization": f"Bearer {token.group(1)}"})
        assert me.status_code == 200 and me.json()["roles"] == ["operator"]
        form = client.get("/login")
        login = client.post("/login", data={"token": token.group(1), "csrf": csrf_of(form.text)})
        assert login.status_code == 303 and client.get("/inbox").status_code == 200
        railyard(db_url, "tokens", "revoke", row["sha256"][:12], "--by", "olga")
        assert client.get("/api/me", headers={"Authorization": f"Bearer {token.group(1)}"}).status_code == 401
        assert client.get("/inbox").status_code == 303  # the session opened with it ends too
    assert "TOKEN_NOT_FOUND" in railyard(db_url, "tokens", "revoke", row["sha256"][:12], code=1)
    revoked = json.loads(railyard(db_url, "tokens", "list", "--json"))[0]
    assert revoked["revoked"] is not None
    assert [(c.by, c.action) for c in People(engine.store).trail(subject=row["sha256"])] == [
        ("root", AccessAction.TOKEN_ADDED),
        ("olga", AccessAction.TOKEN_REVOKED),
    ]

    # An expired one: kept with an expiry about to pass (the CLI refuses to make one in the past).
    soon = now() + timedelta(seconds=3)
    People(engine.store).add_token(hash_token("tok-soon"), "old-bot", ["operator"], None, soon, by="root")
    with httpx.Client(base_url=server) as client:
        assert client.get("/api/me", headers={"Authorization": "Bearer tok-soon"}).status_code == 200
        time.sleep(max(0.0, (soon - now()).total_seconds()) + 0.05)
        assert client.get("/api/me", headers={"Authorization": "Bearer tok-soon"}).status_code == 401


def test_a_token_in_a_persons_name_speaks_for_the_person(engine: Engine, server: str) -> None:
    """A tokens-file entry made before its person was added carries the person's roles, and stops with them."""
    people = People(engine.store)
    people.add("dana", ["auditor"], by="root")
    with httpx.Client(base_url=server) as api:
        assert api.get("/api/me", headers=bearer("dana")).json()["roles"] == ["auditor"]
        people.disable("dana", by="root")
        assert api.get("/api/me", headers=bearer("dana")).status_code == 401


def test_users_refusals_have_stable_codes_and_exit_statuses(db_url: str) -> None:
    assert "USER_NOT_FOUND" in railyard(db_url, "users", "grant", "nobody", "auditor", code=1)
    railyard(db_url, "users", "add", "pat")
    assert "USER_EXISTS" in railyard(db_url, "users", "add", "Pat", code=1)
    assert "USAGE_INVALID" in railyard(db_url, "users", "add", "two words", code=2)
    assert "USAGE_INVALID" in railyard(db_url, "users", "passwd", "pat", "--password-stdin", stdin="short\n", code=2)
    assert "USAGE_INVALID" in railyard(db_url, "tokens", "revoke", "abc", code=2)
    assert "USER_EXISTS" in railyard(db_url, "tokens", "new", "--actor", "pat", "--save", code=1)


def test_the_trusted_process_takes_a_persons_roles_from_the_people_table_too(engine: Engine, db_url: str) -> None:
    """An engine given no authoriser (the CLI's, whose `--as` names the actor; a worker's; the Python API's) asks
    the people table first, then the roles file: a role revoked or a person disabled there holds at the command
    line as on the server, and a role granted there needs no roles file."""
    task_id = to_approval(engine)
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]

    def trusted() -> Engine:  # what `railyard approve --as pia` opens (a new process reads the person afresh)
        return Engine(store=engine.store, registry=engine.registry)

    def refusal() -> Code:
        with pytest.raises(RailyardError) as refused:
            trusted().approve(task_id, actor="pia", prepared_digest=digest)
        return refused.value.code

    railyard(db_url, "users", "add", "pia", "--role", "support", "--by", "root")
    assert refusal() is Code.APPROVAL_FORBIDDEN  # no roles file names her, and the people table gives no approver
    railyard(db_url, "users", "disable", "pia", "--by", "root")
    assert refusal() is Code.TASK_NOT_FOUND  # a disabled person reads nothing: the task is absent to her
    assert engine.load(task_id).state == "awaiting_approval"
    railyard(db_url, "users", "enable", "pia", "--by", "root")
    railyard(db_url, "users", "grant", "pia", "refund_approver", "--by", "root")
    assert trusted().authoriser.roles_of("pia") == {"support", "refund_approver"}
    assert trusted().authoriser.roles_of("nobody") == set()
    trusted().approve(task_id, actor="pia", prepared_digest=digest)
    last = engine.history(task_id)[-1]
    assert (last.actor, last.trigger) == ("pia", "approve")
