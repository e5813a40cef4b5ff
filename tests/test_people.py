"""People in the database: the `People` service, the interface the OpenID Connect sign-in calls (`sync_external`,
`Sessions.open_person`), and sessions that read their person again on every request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from argon2 import PasswordHasher
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine import Engine
from engine.api.auth import SESSION_COOKIE, Context
from engine.core.errors import Code, RailyardError, Refused
from engine.core.people import AccessAction, Source
from engine.runtime.people import People, sync_external
from engine.store import MemoryStore
from tests.support.api import make_api_engine, make_app, to_approval

#: Cheap hashes for the tests (the parameters are in each hash: verifying reads them from there).
FAST = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
PASSWORD = "correct horse battery"


@pytest.fixture
def people() -> People:
    return People(MemoryStore(), hasher=FAST)


def test_a_person_is_added_with_an_argon2_hash_and_every_change_is_in_the_trail(people: People) -> None:
    added = people.add("dana", ["refund_approver"], password=PASSWORD, by="root")
    assert added.person.password_hash is not None and added.person.password_hash.startswith("$argon2id$")
    assert PASSWORD not in repr(added.person) and "argon2" not in repr(added.person)
    assert people.verify("dana", PASSWORD) == added.person
    assert people.verify("dana", "wrong password!") is None and people.verify("nobody", PASSWORD) is None
    assert people.grant("dana", "auditor", by="olga").person.roles == {"refund_approver", "auditor"}
    assert people.grant("dana", "auditor", by="olga").changes == ()  # held already: nothing recorded
    assert people.revoke("dana", "refund_approver", by="olga").person.roles == {"auditor"}
    assert people.set_tenants("dana", ["acme"], by="olga").person.tenants == frozenset({"acme"})
    assert people.disable("dana", by="olga").person.disabled
    assert people.verify("dana", PASSWORD) is None  # disabled: the same answer as a wrong password
    assert not people.enable("dana", by="olga").person.disabled
    people.set_password("dana", "another long password", by="dana")
    assert people.verify("dana", "another long password") is not None
    trail = people.trail()
    assert [(c.by, c.action, dict(c.details)) for c in trail] == [
        (
            "root",
            AccessAction.PERSON_ADDED,
            {"roles": ["refund_approver"], "tenants": None, "source": "local", "password": True},
        ),
        ("olga", AccessAction.ROLE_GRANTED, {"role": "auditor"}),
        ("olga", AccessAction.ROLE_REVOKED, {"role": "refund_approver"}),
        ("olga", AccessAction.TENANTS_SET, {"tenants": ["acme"], "previous": None}),
        ("olga", AccessAction.PERSON_DISABLED, {}),
        ("olga", AccessAction.PERSON_ENABLED, {}),
        ("dana", AccessAction.PASSWORD_SET, {}),
    ]
    assert all(c.subject == "dana" for c in trail)
    text = repr(trail)
    assert PASSWORD not in text and "another long password" not in text and "argon2" not in text


def test_names_roles_and_passwords_are_checked_and_a_name_is_taken_once(people: People) -> None:
    people.add("dana", by="root")
    for name in ("Dana", "dana"):
        with pytest.raises(Refused) as taken:
            people.add(name, by="root")
        assert taken.value.code is Code.USER_EXISTS
    with pytest.raises(Refused) as missing:
        people.grant("erin", "auditor", by="root")
    assert missing.value.code is Code.USER_NOT_FOUND
    bad: list[dict[str, Any]] = [
        {"name": "with space"},
        {"roles": ["anyone"]},
        {"password": "short"},
        {"tenants": []},
        {"by": ""},
    ]
    for wrong in bad:
        with pytest.raises(RailyardError) as refused:
            people.add(**{"name": "erin", "by": "root", **wrong})
        assert refused.value.code is Code.USAGE_INVALID
    assert [p.name for p in people.everyone()] == ["dana"]


def test_sync_external_makes_the_person_match_the_provider_and_records_each_difference(people: People) -> None:
    made = sync_external(people.store, "erin@example.com", ["support"], None, source="oidc", by="oidc")
    assert made.person.source is Source.OIDC and made.person.password_hash is None
    assert [c.action for c in made.changes] == [AccessAction.PERSON_ADDED]
    assert sync_external(people, "erin@example.com", ["support"], None, by="oidc").changes == ()
    moved = sync_external(people, "erin@example.com", ["auditor"], ["acme"], by="oidc")
    assert (moved.person.roles, moved.person.tenants) == (frozenset({"auditor"}), frozenset({"acme"}))
    assert [(c.action, dict(c.details)) for c in moved.changes] == [
        (AccessAction.ROLE_GRANTED, {"role": "auditor"}),
        (AccessAction.ROLE_REVOKED, {"role": "support"}),
        (AccessAction.TENANTS_SET, {"tenants": ["acme"], "previous": None}),
    ]
    people.disable("erin@example.com", by="root")
    assert sync_external(people, "erin@example.com", ["auditor"], ["acme"], by="oidc").person.disabled
    people.add("dana", by="root")
    with pytest.raises(Refused) as local:
        sync_external(people, "dana", ["support"], None, by="oidc")  # a local person is never taken over
    assert local.value.code is Code.USER_EXISTS
    with pytest.raises(RailyardError) as password:
        people.set_password("erin@example.com", PASSWORD, by="root")
    assert password.value.code is Code.USAGE_INVALID


@pytest.fixture
def engine(db_url: str, tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(db_url, tmp_path) as eng:
        yield eng


def test_a_session_opened_for_a_person_reads_them_again_on_every_request(engine: Engine) -> None:
    """`Sessions.open_person` (what the OpenID Connect sign-in calls once the provider said who this is): the
    session follows the people table, a grant on the next request, a disabled person at once."""
    task_id = to_approval(engine)
    app = make_app(engine)
    people = People(engine.store, hasher=FAST)
    sync_external(people, "pat", ["support"], None, by="oidc")
    with TestClient(app, follow_redirects=False) as client:
        cookie, row = context_of(app).sessions.open_person("pat")
        assert row.credential == "user:pat" and row.actor == "pat"
        client.cookies.set(SESSION_COOKIE, cookie)
        assert client.get("/inbox").status_code == 200
        approve = f'action="/tasks/{task_id}/approve"'
        assert approve not in client.get(f"/tasks/{task_id}").text  # support may not approve
        sync_external(people, "pat", ["refund_approver"], None, by="oidc")
        page = client.get(f"/tasks/{task_id}")
        assert page.status_code == 200 and approve in page.text
        people.disable("pat", by="root")
        assert client.get("/inbox").status_code == 303  # to the login page: the session signs in no more


def context_of(app: FastAPI) -> Context:
    ctx = app.state.railyard
    assert isinstance(ctx, Context)
    return ctx
