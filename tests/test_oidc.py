"""Sign-in through OpenID Connect without a browser: the app (httpx through TestClient) against the test provider.

The provider (`tests.support.idp`) runs on a real port; the server under test
fetches its discovery document, keys and tokens over HTTP as it would
Keycloak's. The browser's part (following the redirects, keeping the cookies)
is played here by the test client and httpx; `test_api_browser.py` does it in
Chromium.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from joserfc.jwk import KeySet

from engine import Engine
from engine.api import create_app
from engine.api.auth import LOGIN_FAILURES_PER_ADDRESS, OIDC_COOKIE
from engine.api.oidc import (
    Flow,
    GroupMap,
    OidcClient,
    OidcSettings,
    parse_groups,
    settings_from_env,
    validate_id_token,
)
from engine.api.tokens import hash_token, toml_entry
from engine.core.errors import Code, RailyardError, Refused
from engine.core.people import AccessAction, Source
from engine.runtime.people import People
from tests.support.api import csrf_of, free_port, make_api_engine, to_approval, token_table
from tests.support.idp import Client, IdP, new_key, running, s256
from tests.support.sqlite import migrated_sqlite

REPO = Path(__file__).resolve().parent.parent
RAILYARD = Path(sys.executable).parent / "railyard"
CLIENT_ID = "railyard"
SECRET = "s3cret-of-the-client"
CALLBACK = "http://testserver/login/oidc/callback"
GROUPS = """
[groups.refund-approvers]
roles = ["refund_approver", "approver"]

[groups.operators]
roles = ["operator"]
"""
USERS: dict[str, dict[str, Any]] = {
    "petra": {"sub": "u-1001", "preferred_username": "petra", "groups": ["refund-approvers", "staff"]},
    "otto": {"sub": "u-1002", "preferred_username": "otto", "groups": ["operators"]},
    "nora": {"sub": "u-1003", "preferred_username": "nora", "groups": ["marketing"]},
    "sid": {"sub": "u-1004", "groups": ["operators"]},  # no preferred_username: the actor is `sub`
}


@pytest.fixture
def idp() -> Iterator[IdP]:
    users = {name: dict(claims) for name, claims in USERS.items()}  # a test may move its people between groups
    provider = IdP(clients={CLIENT_ID: Client([CALLBACK], SECRET)}, users=users, auto_user="petra")
    with running(provider) as started:
        yield started


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with make_api_engine(migrated_sqlite(tmp_path / "railyard.db"), tmp_path) as eng:
        yield eng


def settings_for(idp: IdP, groups: str = GROUPS, **changes: Any) -> OidcSettings:
    values: dict[str, Any] = {
        "issuer": idp.issuer,
        "client_id": CLIENT_ID,
        "client_secret": SECRET,
        "groups": parse_groups(tomllib.loads(groups)),
        "name": "Test IdP",
        **changes,
    }
    return OidcSettings(**values)


@pytest.fixture
def client(engine: Engine, idp: IdP) -> Iterator[TestClient]:
    app = create_app(engine, token_table(), session_secret="test-secret", oidc=settings_for(idp))
    with TestClient(app, follow_redirects=False) as c:
        yield c


def start(client: TestClient, next_path: str = "") -> tuple[str, dict[str, str]]:
    """GET /login/oidc: the provider's authorization URL and its query."""
    response = client.get("/login/oidc", params={"next": next_path} if next_path else None)
    assert response.status_code == 303, response.text
    url = response.headers["location"]
    return url, {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def authorize(url: str) -> dict[str, str]:
    """The browser at the provider: it signs the person in and sends the browser back; the callback's query."""
    response = httpx.get(url, follow_redirects=False)
    assert response.status_code == 302, response.text
    back = response.headers["location"]
    assert back.startswith(CALLBACK + "?")
    return {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}


def sign_in(client: TestClient, next_path: str = "") -> Any:
    url, _ = start(client, next_path)
    return client.get("/login/oidc/callback", params=authorize(url))


def code_of(page: str) -> str | None:
    for code in (Code.OIDC_REFUSED, Code.OIDC_UNAVAILABLE, Code.LOGIN_THROTTLED):
        if f"({code})" in page:
            return str(code)
    return None


# -- the whole sign-in -----------------------------------------------------------------------------------------
def test_a_sign_in_opens_a_session_with_the_roles_the_groups_map_to(client: TestClient, idp: IdP) -> None:
    page = client.get("/login")
    assert 'id="oidc-sign-in"' in page.text and "Sign in with Test IdP" in page.text
    url, query = start(client, "/tasks?q=C-1")
    assert url.startswith(f"{idp.issuer}/authorize?")
    assert query["response_type"] == "code" and query["client_id"] == CLIENT_ID
    assert query["redirect_uri"] == CALLBACK and "openid" in query["scope"].split()
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["state"] and query["nonce"] and query["state"] != query["nonce"]
    cookie = client.cookies.get(OIDC_COOKIE)
    assert cookie and query["state"] not in cookie.split(".")[-1]  # signed (itsdangerous), not the bare state

    answer = client.get("/login/oidc/callback", params=authorize(url))
    assert answer.status_code == 200, answer.text
    assert '<meta http-equiv="refresh" content="0;url=/tasks?q=C-1">' in answer.text
    assert client.cookies.get(OIDC_COOKIE) is None  # one sign-in, one use
    inbox = client.get("/inbox")
    assert inbox.status_code == 200
    assert '<strong id="actor">petra</strong>' in inbox.text
    assert "approver, refund_approver" in inbox.text  # `staff` is no group the file maps: ignored

    token = idp.requests("token")[-1]  # what the server sent to the token endpoint
    assert token["grant_type"] == "authorization_code" and token["redirect_uri"] == CALLBACK
    assert s256(token["code_verifier"]) == query["code_challenge"]  # PKCE: the verifier behind the challenge
    assert token["authorization"].startswith("Basic ") and "client_secret" not in token  # the secret, in basic


def test_the_approver_signed_in_through_the_provider_sees_the_refund_waiting(
    client: TestClient, engine: Engine
) -> None:
    task_id = to_approval(engine)
    assert sign_in(client).status_code == 200
    inbox = client.get("/inbox").text
    assert f'id="work-{task_id}"' in inbox
    assert client.get(f"/tasks/{task_id}").status_code == 200


def test_a_person_whose_groups_map_to_no_role_signs_in_and_sees_nothing(
    client: TestClient, engine: Engine, idp: IdP
) -> None:
    task_id = to_approval(engine)
    idp.auto_user = "nora"
    assert sign_in(client).status_code == 200
    inbox = client.get("/inbox")
    assert '<strong id="actor">nora</strong>' in inbox.text and 'class="roles"' not in inbox.text
    assert f"work-{task_id}" not in inbox.text  # not theirs to decide
    page = client.get(f"/tasks/{task_id}").text  # the test shop lets anyone operate, so they may read it
    assert "You cannot decide this one" in page and "Approve shop refund" not in page


def test_the_actor_is_sub_when_the_token_names_no_preferred_username(client: TestClient, idp: IdP) -> None:
    idp.auto_user = "sid"
    assert sign_in(client).status_code == 200
    assert '<strong id="actor">u-1004</strong>' in client.get("/inbox").text


def test_a_public_client_sends_no_secret_and_the_verifier_alone_redeems_the_code(engine: Engine, idp: IdP) -> None:
    idp.clients[CLIENT_ID].secret = None
    app = create_app(engine, token_table(), oidc=settings_for(idp, client_secret=None))
    with TestClient(app, follow_redirects=False) as client:
        assert sign_in(client).status_code == 200
    token = idp.requests("token")[-1]
    assert token["client_id"] == CLIENT_ID and not token["authorization"] and "client_secret" not in token


# -- what is refused -----------------------------------------------------------------------------------------
def refused(client: TestClient, response: Any, reason_words: str) -> None:
    assert response.status_code == 401, response.text
    assert code_of(response.text) == "OIDC_REFUSED"
    assert reason_words in response.text, response.text
    assert "railyard_session" not in response.cookies  # no session opened
    assert client.get("/inbox").status_code == 303  # none in force: back to the login page


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        ({"aud": "another-app"}, "another audience (&#39;another-app&#39;)"),
        ({"aud": ["another-app", "and-a-third"]}, "another audience"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "the ID token has expired"),
        ({"nonce": "not-the-one-sent"}, "nonce is not the one"),
        ({"iss": "http://evil.example"}, "issued by"),
    ],
    ids=["audience", "audiences", "expired", "nonce", "issuer"],
)
def test_a_token_that_does_not_hold_is_refused(
    client: TestClient, idp: IdP, tamper: dict[str, Any], words: str
) -> None:
    idp.tamper = tamper
    refused(client, sign_in(client), words)


def test_a_token_signed_by_a_key_the_provider_does_not_publish_is_refused(client: TestClient, idp: IdP) -> None:
    idp.sign_with = new_key("key-1")  # the same key id, another key: the signature does not verify
    refused(client, sign_in(client), "signature does not verify")
    idp.sign_with = new_key("key-stranger")  # a key id never published: fetched again, still not there
    refused(client, sign_in(client), "a key the provider does not publish")


def test_a_callback_for_another_sign_in_is_refused(client: TestClient, idp: IdP) -> None:
    url, _ = start(client)
    params = authorize(url)
    refused(client, client.get("/login/oidc/callback", params={**params, "state": "forged"}), "another sign-in")
    url, _ = start(client)
    params = authorize(url)
    client.cookies.delete(OIDC_COOKIE)  # another browser: it has no sign-in in progress
    refused(client, client.get("/login/oidc/callback", params=params), "no sign-in in progress")


def test_a_code_is_redeemed_once_and_a_wrong_verifier_redeems_none(client: TestClient, idp: IdP) -> None:
    url, _ = start(client)
    params = authorize(url)
    cookie = client.cookies.get(OIDC_COOKIE)
    assert client.get("/login/oidc/callback", params=params).status_code == 200
    client.cookies.clear()
    client.cookies.set(OIDC_COOKIE, str(cookie), path="/login/oidc")  # the same answer, replayed
    refused(client, client.get("/login/oidc/callback", params=params), "would not exchange the code (invalid_grant")
    # A code stolen on its way back, redeemed with another sign-in's verifier: the provider refuses it.
    url, _ = start(client)
    stolen = authorize(url)
    start(client)  # this browser's cookie now holds another verifier
    refused(client, client.get("/login/oidc/callback", params=stolen), "another sign-in")


def test_the_provider_saying_no_is_a_refusal(client: TestClient, idp: IdP) -> None:
    idp.auto_user = "nobody-the-idp-knows"
    refused(client, sign_in(client), "the provider refused: access_denied")


def test_refusals_count_as_failed_logins_and_are_throttled(client: TestClient, idp: IdP) -> None:
    for _ in range(LOGIN_FAILURES_PER_ADDRESS):
        idp.tamper = {"aud": "another-app"}
        assert sign_in(client).status_code == 401
    response = sign_in(client)  # a good token now: the address is throttled all the same
    assert response.status_code == 429 and code_of(response.text) == "LOGIN_THROTTLED"
    assert int(response.headers["retry-after"]) > 0
    assert client.get("/inbox").status_code == 303


def test_a_provider_that_does_not_answer_is_unavailable_not_refused(engine: Engine, tmp_path: Path) -> None:
    with running(IdP(users=USERS)) as gone:
        issuer = gone.issuer
    app = create_app(
        engine, token_table(), oidc=OidcSettings(issuer, CLIENT_ID, parse_groups({"groups": {"g": {"roles": ["r"]}}}))
    )
    with TestClient(app, follow_redirects=False) as client:
        response = client.get("/login/oidc")
        assert response.status_code == 502 and code_of(response.text) == "OIDC_UNAVAILABLE"
        assert "did not answer for its discovery document" in response.text


# -- not configured ------------------------------------------------------------------------------------------
def test_a_server_without_oidc_offers_no_button_and_has_no_such_pages(engine: Engine) -> None:
    with TestClient(create_app(engine, token_table()), follow_redirects=False) as client:
        page = client.get("/login")
        assert page.status_code == 200 and "oidc" not in page.text.lower()
        assert client.get("/login/oidc").status_code == 404
        assert client.get("/login/oidc/callback", params={"code": "x", "state": "y"}).status_code == 404


# -- the ID token's checks, alone ----------------------------------------------------------------------------
def test_validate_id_token_names_each_reason(idp: IdP) -> None:
    keys = KeySet.import_key_set(idp.jwks())  # type: ignore[arg-type]
    common: dict[str, Any] = {"keys": keys, "issuer": idp.issuer, "client_id": CLIENT_ID, "nonce": "n-1"}
    good = idp.id_token("petra", aud=CLIENT_ID, nonce="n-1")
    assert validate_id_token(good, **common)["preferred_username"] == "petra"

    def reason(token: str, **changes: Any) -> str:
        with pytest.raises(Refused) as caught:
            validate_id_token(token, **{**common, **changes})
        assert caught.value.code is Code.OIDC_REFUSED
        return str(caught.value.details["reason"])

    assert reason(idp.id_token("petra", aud="other", nonce="n-1")) == "audience"
    assert reason(idp.id_token("petra", aud=[CLIENT_ID, "other"], nonce="n-1")) == "audience"  # no azp
    assert reason(idp.id_token("petra", aud=CLIENT_ID, nonce="n-1", exp=int(time.time()) - 61)) == "expired"
    assert reason(idp.id_token("petra", aud=CLIENT_ID, nonce="n-2")) == "nonce"
    assert reason(idp.id_token("petra", aud=CLIENT_ID, nonce=None)) == "nonce"
    assert reason(good, issuer="http://other.example") == "issuer"
    assert reason(good, nonce="n-other") == "nonce"
    assert reason(good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")) == "signature"
    assert reason(idp.id_token("petra", aud=CLIENT_ID, nonce="n-1", key=new_key("k-2"))) == "key"
    assert reason("not.a.jwt") == "malformed"
    assert reason(good, algorithms=["ES256"]) == "algorithm"
    # Within the leeway, a clock a little behind the provider's is not a refusal.
    assert validate_id_token(idp.id_token("petra", aud=CLIENT_ID, nonce="n-1", exp=int(time.time()) - 30), **common)
    # An audience list with this client and `azp` naming it is the token's intended party.
    both = idp.id_token("petra", aud=[CLIENT_ID, "other"], nonce="n-1", azp=CLIENT_ID)
    assert validate_id_token(both, **common)["azp"] == CLIENT_ID
    assert reason(idp.id_token("petra", aud=CLIENT_ID, nonce="n-1", azp="other")) == "audience"


def test_the_flow_cookie_round_trips_and_a_bad_one_is_none() -> None:
    flow = Flow("s", "n", "v", CALLBACK, "/inbox")
    assert Flow.from_cookie(flow.to_cookie()) == flow
    assert Flow.from_cookie(None) is None
    assert Flow.from_cookie({"s": "s", "n": 1}) is None


def test_finish_without_the_browsers_flow_is_refused(idp: IdP) -> None:
    client = OidcClient(settings_for(idp))
    with pytest.raises(Refused) as caught:
        client.finish(None, {"code": "c", "state": "s"})
    assert caught.value.details["reason"] == "state"


# -- groups to roles and tenants -----------------------------------------------------------------------------
def test_groups_map_to_the_union_of_their_roles_and_tenants() -> None:
    groups = parse_groups(
        {
            "groups": {
                "approvers": {"roles": ["refund_approver"]},
                "operators": {"roles": ["refund_operator"]},
                "acme": {"tenants": ["acme"]},
                "globex-ops": {"roles": ["refund_operator"], "tenants": ["globex"]},
                "auditors": {"roles": ["auditor"], "tenants": ["*"]},
            }
        }
    )
    assert groups.confines
    both = groups.access(["approvers", "acme", "globex-ops", "unknown"])
    assert both.roles == {"refund_approver", "refund_operator"} and both.tenants == frozenset({"acme", "globex"})
    assert both.matched == ("approvers", "acme", "globex-ops")
    assert groups.access(["approvers"]).tenants == frozenset()  # tenants in use: in none of them, sees none
    assert groups.access(["auditors", "acme"]).tenants is None  # "*": every tenant
    assert groups.access([]).roles == frozenset()

    single = parse_groups({"groups": {"approvers": {"roles": ["refund_approver"]}}})
    assert not single.confines and single.access(["approvers"]).tenants is None  # no tenants anywhere: unconfined


def test_a_sign_in_confines_the_person_to_their_groups_tenants(engine: Engine, idp: IdP) -> None:
    groups = GROUPS + '\n[groups.staff]\ntenants = ["acme"]\n'
    app = create_app(engine, token_table(), oidc=settings_for(idp, groups=groups))
    with TestClient(app, follow_redirects=False) as client:
        assert sign_in(client).status_code == 200
        petra = People(engine.store).require("petra")
        assert petra.tenants == frozenset({"acme"}) and "refund_approver" in petra.roles
        client.cookies.clear()  # another browser
        idp.auto_user = "otto"  # an operator in no tenant's group, where tenants are in use: refused
        refused(client, sign_in(client), "give them no tenant here")
        assert People(engine.store).get("otto") is None  # and not made a person


# -- the people table ----------------------------------------------------------------------------------------
def test_a_sign_in_makes_the_person_and_keeps_them_in_step_with_their_groups(
    client: TestClient, engine: Engine, idp: IdP
) -> None:
    people = People(engine.store)
    by = f"oidc:{urlsplit(idp.issuer).netloc}"
    assert sign_in(client).status_code == 200
    petra = people.require("petra")
    assert petra.source is Source.OIDC and petra.roles == {"refund_approver", "approver"} and petra.tenants is None
    assert petra.password_hash is None
    added = people.trail(subject="petra")
    assert [(c.action, c.by) for c in added] == [(AccessAction.PERSON_ADDED, by)]

    assert sign_in(client).status_code == 200  # nothing changed at the provider: nothing written
    assert len(people.trail(subject="petra")) == 1

    idp.users["petra"] = {**USERS["petra"], "groups": ["operators"]}  # moved to another group
    assert sign_in(client).status_code == 200
    assert people.require("petra").roles == {"operator"}
    changes = [(str(c.action), dict(c.details)) for c in people.trail(subject="petra")[1:]]
    assert changes == [
        ("role.granted", {"role": "operator"}),
        ("role.revoked", {"role": "approver"}),
        ("role.revoked", {"role": "refund_approver"}),
    ]
    assert all(c.by == by for c in people.trail(subject="petra"))


def test_the_session_reads_the_person_again_on_every_request(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    assert sign_in(client).status_code == 200
    assert f'id="work-{task_id}"' in client.get("/inbox").text
    people = People(engine.store)
    people.revoke("petra", "refund_approver", by="admin")
    people.revoke("petra", "approver", by="admin")
    assert f'id="work-{task_id}"' not in client.get("/inbox").text  # the open session lost the roles
    people.disable("petra", by="admin")
    assert client.get("/inbox").status_code == 303  # and a disabled person has no session at all
    refused(client, sign_in(client), "is disabled here")  # which the provider's word does not change


def test_the_approver_signed_in_through_the_provider_approves(client: TestClient, engine: Engine) -> None:
    task_id = to_approval(engine)
    assert sign_in(client).status_code == 200
    page = client.get(f"/tasks/{task_id}").text
    form = {"csrf": csrf_of(page), "digest": engine.load(task_id).prepared["digest"]}  # type: ignore[index]
    answer = client.post(f"/tasks/{task_id}/approve", data=form, headers={"Origin": "http://testserver"})
    assert answer.status_code == 303
    assert "Your decision (approved) is recorded." in client.get(answer.headers["location"]).text
    assert engine.get(task_id).state == "executing"
    assert [e.actor for e in engine.history(task_id) if e.trigger == "approve"] == ["petra"]


def test_a_local_person_of_the_same_name_is_not_taken_over(client: TestClient, engine: Engine) -> None:
    People(engine.store).add("petra", ["support"], password="a long local password", by="admin")
    refused(client, sign_in(client), "does not sign in through Test IdP")
    local = People(engine.store).require("petra")
    assert local.source is Source.LOCAL and local.roles == {"support"}


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({}, "no group is mapped"),
        ({"groups": {"g": {"roles": "refund_approver"}}}, "roles must be a list"),
        ({"groups": {"g": {"roles": ["r"], "tenants": ["bad tenant"]}}}, "tenants must be a list"),
        ({"groups": {"g": {"roles": ["r"], "tenant": ["acme"]}}}, "unknown keys ['tenant']"),
        ({"groups": {"g": {}}}, "gives nothing"),
        ({"groups": {"g": {"roles": ["anyone"]}}}, "'anyone' is every signed-in person"),
        ({"groups": {"g": {"roles": ["refund approver"]}}}, "is not a role name"),
        ({"group": {"g": {"roles": ["r"]}}}, "unknown key 'group'"),
    ],
)
def test_a_bad_groups_file_is_config_invalid(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(RailyardError) as caught:
        parse_groups(doc)
    assert caught.value.code is Code.CONFIG_INVALID and words in caught.value.message


# -- settings ------------------------------------------------------------------------------------------------
def test_settings_from_the_environment(tmp_path: Path) -> None:
    groups = tmp_path / "groups.toml"
    groups.write_text(GROUPS)
    assert settings_from_env({}) is None
    found = settings_from_env(
        {
            "RAILYARD_OIDC_ISSUER": "https://sso.example.com/realms/backoffice",
            "RAILYARD_OIDC_CLIENT_ID": "railyard",
            "RAILYARD_OIDC_CLIENT_SECRET": "s3cret-value",
            "RAILYARD_OIDC_GROUPS_FILE": str(groups),
            "RAILYARD_OIDC_NAME": "Keycloak",
        }
    )
    assert found is not None and found.client_secret == "s3cret-value" and found.display_name == "Keycloak"
    assert found.groups_claim == "groups" and found.actor_claim == "preferred_username"
    assert found.by == "oidc:sso.example.com" and "s3cret" not in repr(found)
    assert isinstance(found.groups, GroupMap)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"RAILYARD_OIDC_CLIENT_ID": "railyard"}, "RAILYARD_OIDC_CLIENT_ID set but RAILYARD_OIDC_ISSUER is not"),
        ({"RAILYARD_OIDC_ISSUER": "http://sso.example.com"}, "must be https"),
        ({"RAILYARD_OIDC_ISSUER": "sso.example.com"}, "must be an https URL"),
        ({"RAILYARD_OIDC_ISSUER": "https://sso.example.com"}, "RAILYARD_OIDC_CLIENT_ID is required"),
        ({"RAILYARD_OIDC_ISSUER": "https://sso.example.com"}, "RAILYARD_OIDC_GROUPS_FILE is required"),
        ({"RAILYARD_OIDC_GROUPS_FILE": "/nonexistent/groups.toml"}, "cannot read the OIDC groups file"),
        ({"RAILYARD_OIDC_SCOPES": "profile email"}, "must include openid"),
        ({"RAILYARD_OIDC_REDIRECT_URI": "https://railyard.example.com/cb"}, "must end in /login/oidc/callback"),
    ],
)
def test_bad_settings_are_config_invalid(env: dict[str, str], words: str, tmp_path: Path) -> None:
    groups = tmp_path / "groups.toml"
    groups.write_text(GROUPS)
    base = (
        {
            "RAILYARD_OIDC_ISSUER": "https://sso.example.com",
            "RAILYARD_OIDC_CLIENT_ID": "railyard",
            "RAILYARD_OIDC_GROUPS_FILE": str(groups),
        }
        if "RAILYARD_OIDC_ISSUER" not in env and "RAILYARD_OIDC_CLIENT_ID" not in env
        else {}
    )
    with pytest.raises(RailyardError) as caught:
        settings_from_env({**base, **env})
    assert caught.value.code is Code.CONFIG_INVALID and words in caught.value.message, caught.value.message


def test_a_discovery_document_that_contradicts_the_settings_is_config_invalid(idp: IdP) -> None:
    idp.discovery_extra = {"issuer": "http://elsewhere.example", "code_challenge_methods_supported": ["plain"]}
    with pytest.raises(RailyardError) as caught:
        OidcClient(settings_for(idp)).check()
    assert caught.value.code is Code.CONFIG_INVALID
    assert "its issuer is 'http://elsewhere.example'" in caught.value.message
    assert "does not offer PKCE with S256" in caught.value.message


# -- railyard serve ------------------------------------------------------------------------------------------
def serve(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(toml_entry("dana", ["refund_approver"], hash_token("serve-token")), encoding="utf-8")
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_OIDC_")},
        "RAILYARD_TOKENS_FILE": str(tokens),
        **env,
    }
    return subprocess.run(
        [str(RAILYARD), "serve", "--port", str(free_port())],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_serve_with_bad_oidc_settings_refuses_to_start_before_it_opens_anything(tmp_path: Path) -> None:
    done = serve(
        tmp_path,
        {
            "RAILYARD_OIDC_ISSUER": "http://sso.example.com/realms/backoffice",
            "RAILYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'never.db'}",
        },
    )
    assert done.returncode == 2 and "CONFIG_INVALID" in done.stderr, done.stderr
    assert "RAILYARD_OIDC_ISSUER must be https" in done.stderr
    assert (
        "RAILYARD_OIDC_CLIENT_ID is required" in done.stderr and "RAILYARD_OIDC_GROUPS_FILE is required" in done.stderr
    )
    assert not (tmp_path / "never.db").exists()


def test_serve_refuses_a_provider_whose_discovery_contradicts_the_settings(tmp_path: Path, idp: IdP) -> None:
    groups = tmp_path / "groups.toml"
    groups.write_text(GROUPS)
    idp.discovery_extra = {"code_challenge_methods_supported": ["plain"]}
    done = serve(
        tmp_path,
        {
            "RAILYARD_OIDC_ISSUER": idp.issuer,
            "RAILYARD_OIDC_CLIENT_ID": CLIENT_ID,
            "RAILYARD_OIDC_GROUPS_FILE": str(groups),
            "RAILYARD_DATABASE_URL": migrated_sqlite(tmp_path / "railyard.db"),
        },
    )
    assert done.returncode == 2 and "CONFIG_INVALID" in done.stderr and "PKCE with S256" in done.stderr, done.stderr
