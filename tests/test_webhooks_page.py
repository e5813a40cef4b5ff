"""The webhooks page (#32): the person who looks after the webhooks sees the subscriptions (a URL by its host: its
path may hold the hook's secret) and the newest deliveries, and sends chosen ones again; an auditor reads it and
replays nothing; anyone else, and anyone confined to a tenant, is refused it."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from html import unescape

import pytest
from fastapi.testclient import TestClient

from engine import Engine, Registry
from engine.api import TokenTable, create_app
from engine.api.tokens import Principal, hash_token
from engine.runtime.outbox import subscribe
from engine.runtime.roles import StaticRoles
from tests.support.api import login
from tests.support.webhook_workflows import ROLES, WORKFLOWS
from tests.test_api_work import csrf_of_page

SECRET_PATH = "/services/T000/B000/XoXoSeCrEt"
TOKENS = {
    "tok-wanda": ("wanda", {"webhook_admin"}),
    "tok-audrey": ("audrey", {"auditor"}),
    "tok-dana": ("dana", {"approver"}),
}


@pytest.fixture
def eng(db_url: str) -> Iterator[Engine]:
    with Engine(db_url, Registry(WORKFLOWS), authoriser=StaticRoles(ROLES)) as e:
        yield e


def tokens() -> TokenTable:
    confined = Principal("tina", frozenset({"webhook_admin"}), hash_token("tok-tina"), tenants=frozenset({"acme"}))
    table = TokenTable.from_tokens(TOKENS)
    return TokenTable([*table.principals(), confined])


@pytest.fixture
def client(eng: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(eng, tokens(), session_secret="test-secret"), follow_redirects=False) as c:
        yield c


def flash(client: TestClient) -> str:
    found = re.search(r'id="flash">(.*?)</p>', client.get("/webhooks").text, flags=re.S)
    return (
        re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", found.group(1)))).replace(" :", ":").strip()
        if found
        else ""
    )


def test_the_webhook_admin_sees_subscriptions_and_deliveries_and_sends_one_again(
    client: TestClient, eng: Engine
) -> None:
    sub = subscribe(eng.store, f"https://hooks.example.com{SECRET_PATH}", ["task.ended"], "slack", "ops")
    eng.outbox.forget()
    task_id = eng.start("review", {}, actor="dana")
    eng.cancel(task_id, "dana", "not needed")
    [delivery] = eng.store.deliveries()
    csrf = login(client, "wanda")
    assert 'href="/webhooks"' in client.get("/inbox").text  # the page is in wanda's menu
    page = client.get("/webhooks").text
    assert sub.id in page and "https://hooks.example.com/…" in page and "XoXoSeCrEt" not in page
    assert delivery.message.id in page and task_id[:8] in page
    assert client.get("/webhooks", params={"status": "failed"}).text.count('<tr id="delivery-') == 0
    answer = client.post("/webhooks/replay", data={"csrf": csrf, "message": delivery.message.id})
    assert answer.status_code == 303 and answer.headers["location"] == "/webhooks"
    assert flash(client) == "1 delivery to send again."
    # An id that is not a delivery: nothing is sent again, and the page says why with its code.
    client.post("/webhooks/replay", data={"csrf": csrf, "message": [delivery.message.id, "msg_unknown"]})
    assert flash(client).startswith("Refused WEBHOOK_NOT_FOUND")
    assert client.get("/webhooks", params={"status": "lost"}).status_code == 422


def test_an_auditor_reads_the_page_and_sends_nothing_again(client: TestClient, eng: Engine) -> None:
    subscribe(eng.store, "https://hooks.example.com/h", ["task.ended"], "standard", "ops")
    eng.outbox.forget()
    eng.cancel(eng.start("review", {}, actor="dana"), "dana", "not needed")
    [delivery] = eng.store.deliveries()
    login(client, "audrey")
    page = client.get("/webhooks").text
    assert delivery.message.id in page and 'name="message"' not in page and 'id="replay"' not in page
    refused = client.post("/webhooks/replay", data={"csrf": csrf_of_page(page), "message": delivery.message.id})
    assert refused.status_code == 303 and flash(client).startswith("Refused FORBIDDEN")


@pytest.mark.parametrize("who", ["dana", "tina"])
def test_anyone_else_or_a_tenants_admin_is_refused_the_page(client: TestClient, who: str) -> None:
    login(client, who)
    assert 'href="/webhooks"' not in client.get("/inbox").text
    assert client.get("/webhooks").status_code == 403


def test_the_deliveries_listed_download_as_csv_with_the_pages_filters_and_its_refusals(
    client: TestClient, eng: Engine
) -> None:
    subscribe(eng.store, f"https://hooks.example.com{SECRET_PATH}", ["task.ended"], "slack", "ops")
    eng.outbox.forget()
    ended = [eng.start("review", {}, actor="dana") for _ in range(3)]
    for task_id in ended:
        eng.cancel(task_id, "dana", "not needed")
    login(client, "wanda")
    page = client.get("/webhooks").text
    found = re.search(r'<a href="([^"]*)" id="download-csv"', page)
    assert found is not None
    answer = client.get(unescape(found.group(1)))
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    assert [r["id"] for r in rows] == re.findall(r'<tr id="delivery-([^"]+)"', page)
    assert sorted(r["task"] for r in rows) == sorted(ended) and {r["status"] for r in rows} == {"pending"}
    assert SECRET_PATH not in answer.text  # no URL at all, let alone its secret path
    assert list(csv.DictReader(io.StringIO(client.get("/webhooks?status=failed&format=csv").text))) == []
    login(client, "dana")
    assert client.get("/webhooks", params={"format": "csv"}).status_code == 403
