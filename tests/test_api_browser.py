"""The back office in a real browser: Debian's headless Chromium driven by Playwright, against a live uvicorn server.

With RAILYARD_TEST_BROWSER=required (CI sets it) a missing Chromium fails
these tests instead of skipping them. The approver test saves the screenshots
docs/api.md shows (docs/img/inbox.png, docs/img/task.png).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, Worker
from tests.support.api import live_server, make_api_engine, make_app, to_approval

CHROMIUM = os.environ.get("RAILYARD_TEST_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "img"
#: As the machine's notes advise: no sandbox as root, and no background traffic to hosts the network refuses.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def browser_required() -> bool:
    return os.environ.get("RAILYARD_TEST_BROWSER", "").lower() == "required"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if browser_required():
            pytest.fail(f"a browser is required (RAILYARD_TEST_BROWSER=required) but {reason}")
        pytest.skip(f"{reason}; set RAILYARD_TEST_BROWSER=required to fail instead")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'railyard.db'}"
    from engine import migrations

    migrations.upgrade(url)
    with make_api_engine(url, tmp_path) as eng:
        yield eng


@pytest.fixture
def server(engine: Engine) -> Iterator[str]:
    with live_server(make_app(engine)) as url:
        yield url


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    context = browser.new_context(base_url=server, viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    dialogs: list[str] = []

    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", dismissed)
    tab.dialogs = dialogs
    yield tab
    context.close()


def log_in(page: Any, who: str) -> None:
    page.goto("/login")
    page.fill("#token", f"tok-{who}")
    page.click("button:has-text('Log in')")
    page.wait_for_url("**/inbox")
    assert page.text_content("#actor") == who


def test_an_approver_approves_the_prepared_refund_and_the_task_completes(page: Any, engine: Engine) -> None:
    task_id = to_approval(engine, text="The customer sent photos of the crushed box.")
    log_in(page, "dana")
    card = page.locator(f"#approval-{task_id}")
    assert card.is_visible()
    text = card.inner_text()
    assert "refund_payment" in text and "40.00 EUR" in text and "EUR" in text
    assert "damaged parcel" in text and "crushed box" in text  # the model's reason
    assert "Parcel arrived damaged." in text  # the evidence the tool returned
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "inbox.png"), full_page=True)

    card.locator("textarea[name=comment]").fill("Photos match the order; approved.")
    card.locator("button:has-text('Approve')").click()
    page.wait_for_url(f"**/tasks/{task_id}?done=approved")
    assert page.text_content("#task-state") == "executing"

    assert Worker(engine, listen=False, concurrency=1).run_once() == 1  # a worker runs the approved refund
    page.reload()
    assert page.text_content("#task-state") == "completed"
    assert page.text_content("#task-status") == "terminal"
    assert "Photos match the order; approved." in page.inner_text("table.timeline")
    page.screenshot(path=str(SHOTS / "task.png"), full_page=True)
    assert [e.actor for e in engine.history(task_id) if e.trigger == "approve"] == ["dana"]


def test_an_approver_without_the_role_cannot_approve(page: Any, engine: Engine) -> None:
    task_id = to_approval(engine)
    log_in(page, "bob")
    card = page.locator(f"#approval-{task_id}")
    assert "You cannot decide this one" in card.inner_text()
    assert card.locator("button:has-text('Approve')").count() == 0
    # Posting the form anyway (with this session's valid CSRF token): the server refuses.
    csrf = page.locator("form.who input[name=csrf]").get_attribute("value")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    response = page.request.post(f"/tasks/{task_id}/approve", form={"csrf": csrf, "digest": digest})
    assert response.status == 403 and "APPROVAL_FORBIDDEN" in response.text()
    page.goto(f"/tasks/{task_id}")
    assert page.text_content("#task-state") == "awaiting_approval"


def test_a_model_reason_containing_script_renders_as_text(page: Any, engine: Engine) -> None:
    script = "<script>window.pwned = 1; alert('pwned')</script>"
    task_id = to_approval(
        engine,
        {"order_id": "O-1", "amount_cents": 2_500, "currency": "EUR", "reason": script},
        text=f'Because {script} <img src=x onerror="window.pwned=2">',
    )
    log_in(page, "dana")
    card = page.locator(f"#approval-{task_id}")
    assert script in card.inner_text()  # shown, as text
    assert page.locator("script").count() == 0 and page.locator("main img").count() == 0
    assert page.evaluate("typeof window.pwned") == "undefined"
    page.goto(f"/tasks/{task_id}")
    assert script in page.inner_text("main")
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.dialogs == []
