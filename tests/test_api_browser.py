"""The back office in a real browser: Debian's headless Chromium driven by Playwright, against a live uvicorn server.

With RAILYARD_TEST_BROWSER=required (CI sets it) a missing Chromium fails
these tests instead of skipping them. The screenshots docs/api.md shows
(docs/img/*.png: the reference refund's decision card, the inbox and a
refund's timeline, at 1280 and 390 px) are taken by
`test_the_back_office_as_docs_api_md_shows_it`, from the reference workflows; they are
written to docs/img only with RAILYARD_UPDATE_SCREENSHOTS=1 (a test run leaves the
checkout as it found it), and otherwise to the test's own folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, Worker
from engine.api import create_app
from engine.api.oidc import OidcSettings, parse_groups
from engine.core.people import Source
from engine.runtime.people import People
from tests.support.api import live_server, make_api_engine, make_app, to_approval, token_table
from tests.support.idp import Client, IdP, running

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
    page.locator(f"#work-{task_id} a.open-link").click()  # the queue's row opens its card in place
    card = page.locator(f"#approval-{task_id}")
    assert card.is_visible()
    text = card.inner_text()
    assert "refund_payment" in text and "40.00 EUR" in text and "EUR" in text
    assert "damaged parcel" in text and "crushed box" in text  # the model's reason
    assert "Parcel arrived damaged." in text  # the evidence the tool returned

    card.locator("textarea[name=comment]").fill("Photos match the order; approved.")
    approve = page.get_by_role("button", name=f"Approve shop refund of 40.00 EUR for task {task_id[:8]}…")
    assert approve.count() == 0  # it moves money: first the confirmation, restating the amount
    card.locator("summary:has-text('Approve')").click()
    assert "This runs refund_payment for 40.00 EUR." in card.inner_text()
    assert approve.count() == 1  # its accessible name says what it decides
    approve.click()
    page.wait_for_url("**/inbox*")  # back to the queue, at the next item (there is none)
    assert page.text_content("#flash") == "Your decision (approved) is recorded."
    page.goto(f"/tasks/{task_id}")
    assert page.text_content("#task-state") == "executing"

    assert Worker(engine, listen=False, concurrency=1).run_once() == 1  # a worker runs the approved refund
    page.reload()  # a reload is a GET: nothing is sent again, and the banner was shown once
    assert page.locator("#flash").count() == 0
    assert page.text_content("#task-state") == "completed"
    assert page.text_content("#task-status") == "terminal"
    assert "Photos match the order; approved." in page.inner_text("ol.timeline")
    assert [e.actor for e in engine.history(task_id) if e.trigger == "approve"] == ["dana"]


def test_an_approver_without_the_role_cannot_approve(page: Any, engine: Engine) -> None:
    task_id = to_approval(engine)
    log_in(page, "bob")
    assert page.locator(f"#approval-{task_id}").count() == 0  # not drawn in the inbox: counted
    assert "1 more wait on roles which you do not hold" in page.inner_text("#others")
    page.goto(f"/tasks/{task_id}")
    card = page.locator(f"#approval-{task_id}")
    assert "You cannot decide this one" in card.inner_text()
    assert card.locator("button:has-text('Approve')").count() == 0
    # Posting the form anyway (with this session's valid CSRF token): the server refuses.
    csrf = page.locator("form.who input[name=csrf]").get_attribute("value")
    digest = engine.load(task_id).prepared["digest"]  # type: ignore[index]
    response = page.request.post(f"/tasks/{task_id}/approve", form={"csrf": csrf, "digest": digest})
    assert response.status == 200 and response.url.endswith(f"/tasks/{task_id}")  # redirected to the task
    assert "APPROVAL_FORBIDDEN" in response.text()
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
    page.goto(f"/inbox?open={task_id}")
    card = page.locator(f"#approval-{task_id}")
    assert script in card.inner_text()  # shown, as text
    # No script but the project's own two (the queue's keys, local times), and no image.
    sources = page.locator("script").evaluate_all("scripts => scripts.map(s => s.getAttribute('src'))")
    assert sorted(sources) == ["/static/queue.js", "/static/times.js"]
    assert page.locator("main img").count() == 0
    assert page.evaluate("typeof window.pwned") == "undefined"
    page.goto(f"/tasks/{task_id}")
    assert script in page.inner_text("main")
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.dialogs == []


def test_an_operator_pages_through_three_hundred_tasks(page: Any, engine: Engine) -> None:
    started = {engine.start("counter", actor="ann") for _ in range(300)}
    log_in(page, "olga")
    page.click("nav >> text=Tasks")
    page.wait_for_url("**/tasks")
    assert page.text_content("#page-size").startswith("Newest first, 50 per page. Download CSV")
    seen: list[str] = []
    pages = 0
    while True:
        pages += 1
        links = page.locator("table.tasks tbody a")
        seen += [str(links.nth(i).get_attribute("href")).removeprefix("/tasks/") for i in range(links.count())]
        if page.locator("#next-page").count() == 0:
            break
        page.click("#next-page")
        page.wait_for_load_state()
    assert pages == 6 and len(seen) == len(set(seen)) == 300 and set(seen) == started
    assert page.locator("#last-page").is_visible() and page.locator("#first-page").is_visible()
    assert all(page.locator("#state option").nth(i).inner_text().count("~") == 0 for i in range(5))


def test_an_operator_searches_by_customer_id_and_returns_there_after_logging_in(page: Any, engine: Engine) -> None:
    wanted = [engine.start("shop_refund", {"customer": "C-4711"}, actor="ann") for _ in range(3)]
    for n in range(20):
        engine.start("shop_refund", {"customer": f"C-{n:04d}"}, actor="ann")
    page.goto("/tasks?q=C-4711")  # not logged in yet: the login brings the browser back here
    page.wait_for_url("**/login?next=*")
    page.fill("#user", "olga")
    page.fill("#token", "tok-olga")
    page.click("button:has-text('Log in')")
    page.wait_for_url("**/tasks?q=C-4711")
    assert page.input_value("#q") == "C-4711"
    rows = page.locator("table.tasks tbody tr")
    assert rows.count() == 3 and all("customer C-4711" in rows.nth(i).inner_text() for i in range(3))
    shown = [str(page.locator("table.tasks tbody a").nth(i).get_attribute("href")) for i in range(3)]
    assert shown == [f"/tasks/{t}" for t in wanted[::-1]]  # newest first
    page.fill("#q", wanted[0][:8])  # a task id prefix finds the task too
    page.click("button:has-text('Filter')")
    page.wait_for_url("**/tasks?q=*")
    assert page.locator("table.tasks tbody a").get_attribute("href") == f"/tasks/{wanted[0]}"
    assert "ann" in page.inner_text("table.tasks tbody") and "UTC" in page.inner_text("table.tasks tbody")


def test_at_390_px_log_out_is_on_screen_and_nothing_scrolls_sideways(
    browser: Any, server: str, engine: Engine, tmp_path: Path
) -> None:
    approval = to_approval(engine)
    for n in range(60):
        engine.start("shop_refund", {"customer": f"C-{n:04d}"}, actor="ann")
    context = browser.new_context(base_url=server, viewport={"width": 390, "height": 844})
    phone = context.new_page()
    try:
        phone.goto("/login")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        phone.fill("#token", "tok-dana")
        phone.click("button:has-text('Log in')")
        phone.wait_for_url("**/inbox")
        for url in ("/inbox", "/tasks", "/tasks?q=C-0001", f"/tasks/{approval}", "/tasks/no-such-task"):
            phone.goto(url)
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (url, width)
            logout = phone.locator("#logout")
            box = logout.bounding_box()
            assert logout.is_visible() and box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, url
        phone.goto("/tasks")
        phone.screenshot(path=str(tmp_path / "tasks-390.png"), full_page=True)  # to look at when it fails
        phone.click("#logout")
        phone.wait_for_url("**/login")
    finally:
        context.close()


def test_focus_is_visible_on_the_controls(page: Any, engine: Engine) -> None:
    log_in(page, "olga")
    page.goto("/tasks")
    page.focus("#q")
    page.keyboard.press("Tab")  # keyboard focus: :focus-visible applies
    style = page.evaluate(
        "(() => { const s = getComputedStyle(document.activeElement); return [s.outlineStyle, s.outlineWidth]; })()"
    )
    assert style[0] != "none" and style[1] not in ("0px", ""), style


#: Contrast and names of what a page draws, computed in the page (WCAG 2.2 relative luminance): every text run
#: against the background it sits on (4.5:1; 3:1 for large text), every control's border against the background
#: around it (3:1) unless its own fill is what stands out, and the name each control is announced by.
AUDIT = """(() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = ([r, g, b]) => 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length === 3 || c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const shown = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 1 && r.height > 1 && getComputedStyle(el).visibility !== 'hidden';
  };
  const problems = [];
  for (const el of document.querySelectorAll('body *')) {
    if (!shown(el)) continue;
    const s = getComputedStyle(el);
    const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (text) {
      const size = parseFloat(s.fontSize);
      const large = size >= 24 || (size >= 18.66 && Number(s.fontWeight) >= 700);
      const r = ratio(rgb(s.color), background(el));
      const what = el.textContent.trim().slice(0, 30);
      if (r < (large ? 3 : 4.5)) problems.push(`text ${el.tagName} "${what}": ${r.toFixed(2)}`);
    }
    if (el.matches('input:not([type=hidden]), select, textarea, button')) {
      const around = background(el.parentElement);
      const fill = rgb(s.backgroundColor);
      const edge = Math.max(ratio(rgb(s.borderTopColor), around), ratio(fill, around));
      if (edge < 3) problems.push(`control ${el.tagName}#${el.id}: ${edge.toFixed(2)}`);
      const labelled = el.labels && el.labels.length ? el.labels[0].textContent.trim() : '';
      const name = labelled || el.getAttribute('aria-label') || el.textContent.trim();
      if (!name) problems.push(`control ${el.tagName}#${el.id} has no name`);
    }
  }
  return problems;
})()"""


def test_each_page_passes_the_contrast_and_name_checks(browser: Any, server: str, engine: Engine) -> None:
    task_id = to_approval(engine)
    engine.start("shop_refund", {"customer": "C-0042"}, actor="ann")
    context = browser.new_context(base_url=server, viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    try:
        tab.goto("/login")
        assert tab.evaluate(AUDIT) == []
        tab.fill("#token", "tok-dana")
        tab.click("button:has-text('Log in')")
        tab.wait_for_url("**/inbox")
        for url in ("/inbox", "/tasks", "/tasks?q=C-0042", f"/tasks/{task_id}", "/tasks/no-such-task"):
            tab.goto(url)
            assert tab.evaluate(AUDIT) == [], url
        tab.goto(f"/inbox?open={task_id}")
        tab.locator(f"#approval-{task_id} summary.ok").click()
        assert tab.evaluate(AUDIT) == []  # the confirmation, open
        tab.locator(f"#approval-{task_id} button.ok").click()  # the banner after a decision, too
        tab.wait_for_url("**/inbox*")
        assert tab.locator("#flash").is_visible() and tab.evaluate(AUDIT) == []
        # The checks can fail: the borders this page had before (1.37:1) and grey labels are found.
        tab.goto("/tasks")
        tab.evaluate(
            "document.querySelectorAll('input, select').forEach((e) => { e.style.borderColor = '#d8dde2'; });"
            "document.querySelectorAll('label').forEach((e) => { e.style.color = '#aaa'; });"
        )
        found = tab.evaluate(AUDIT)
        assert any(p.startswith("control INPUT#q") for p in found) and any(p.startswith("text LABEL") for p in found)
    finally:
        context.close()


def test_an_approver_and_an_operator_work_the_queue_in_the_reference_workflows(browser: Any, tmp_path: Path) -> None:
    """Decide from the inbox, retry a failed payment, resolve a queued ticket, cancel from a task page."""
    from engine import Registry, migrations
    from engine.api import TokenTable, create_app
    from tests.support.reference import fake_systems
    from tests.test_api_work import TOKENS, expense_in_review, refund_failed, ticket_queued
    from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE

    url = f"sqlite:///{tmp_path / 'reference.db'}"
    migrations.upgrade(url)
    tokens = TokenTable.from_tokens(TOKENS)
    with (
        fake_systems(url) as books,
        Engine(url, Registry([REFUND_V1, TICKET_TRIAGE, EXPENSE]), authoriser=tokens) as eng,
    ):
        failed, ticket, expense = refund_failed(eng, books), ticket_queued(eng), expense_in_review(eng)
        with live_server(create_app(eng, tokens, session_secret="test-secret")) as base:
            context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
            tab = context.new_page()
            try:
                log_in(tab, "dana")
                assert tab.evaluate(AUDIT) == []  # names, labels and contrast of the generated forms
                for path in ("/inbox", f"/tasks/{failed}", f"/tasks/{ticket}"):
                    tab.goto(path)
                    assert tab.evaluate("document.documentElement.scrollWidth") <= 1280, path
                    assert tab.evaluate(AUDIT) == [], path
                tab.goto(f"/inbox?open={expense}")
                assert tab.locator(f"#approval-{expense}").is_visible()
                assert tab.locator(f"#work-{failed}").count() == 0  # an operator's: retrying is not the approver's
                assert tab.locator(f"#work-{ticket}").count() == 0
                card = tab.locator(f"#approval-{expense}")
                assert "123.45 EUR" in card.inner_text()
                assert card.locator("form.trigger-reject").count() == 0  # the workflow has no reject
                card.locator("textarea[name=comment]").fill("Receipt matches.")
                card.get_by_role(
                    "button", name=f"Approve the claim expense of 123.45 EUR for task {expense[:8]}…"
                ).click()
                tab.wait_for_url("**/inbox*")
                assert eng.get(expense).state == "paid"
                tab.click("#logout")
                log_in(tab, "olga")
                tab.goto(f"/inbox?open={failed}")
                work = tab.locator(f"article#work-{failed}")
                work.locator("summary:has-text('Retry the payment')").click()
                assert "runs payments_refund for 129.99 EUR" in work.inner_text()
                work.locator("button:has-text('Confirm: retry the payment')").click()
                tab.wait_for_url("**/inbox*")
                assert tab.text_content("#flash") == "Done: retry refund is recorded."
                assert eng.get(failed).state == "executing"
                tab.click("#logout")
                second = ticket_queued(eng)
                log_in(tab, "sam")  # support agents run the ticket queue: they cancel, resolve, retry
                tab.goto(f"/tasks/{ticket}")
                tab.fill(f"#cancel-reason-{ticket}", "Duplicate of another ticket")
                # Cancel is set apart from the decisions and asks on its own before it stops the task.
                tab.locator(f"#danger-{ticket} summary:has-text('Cancel the ticket')").click()
                tab.get_by_role("button", name=f"Cancel the ticket ticket_triage@1 task {ticket[:8]}…").click()
                tab.wait_for_url(f"**/tasks/{ticket}")
                assert tab.text_content("#task-state") == "cancelled"
                tab.goto(f"/inbox?open={second}")
                queued = tab.locator(f"article#work-{second}")
                queued.locator("textarea[name='arg.note']").first.fill("Refunded the double charge.")
                queued.get_by_role("button", name=f"Resolve ticket_triage@1 task {second[:8]}…").click()
                tab.wait_for_url("**/inbox*")
                assert eng.get(second).state == "resolved"
                assert [e.actor for e in eng.history(second)][-1] == "sam"
                tab.set_viewport_size({"width": 390, "height": 844})
                for path in ("/inbox", f"/tasks/{second}"):
                    tab.goto(path)
                    assert tab.evaluate("document.documentElement.scrollWidth") <= 390, path
            finally:
                context.close()


def test_the_back_office_as_docs_api_md_shows_it(browser: Any, tmp_path: Path) -> None:
    """The screenshots of docs/api.md, from the reference workflows: the refund's declared decision card, the
    inbox around it, and the timeline of a refund that was repaired, approved and recovered by reconciliation,
    each at 1280 and 390 px, none scrolling sideways."""
    from engine import Registry, ScriptedModel, migrations
    from engine.api import TokenTable, create_app
    from engine.providers.scripted import call
    from tests.support.reference import DAMAGED, fake_systems, refund
    from tests.test_api_work import TOKENS, expense_in_review, refund_at_approval, refund_failed, ticket_queued
    from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE

    url = f"sqlite:///{tmp_path / 'reference.db'}"
    migrations.upgrade(url)
    tokens = TokenTable.from_tokens(TOKENS)
    with (
        fake_systems(url) as books,
        Engine(url, Registry([REFUND_V1, TICKET_TRIAGE, EXPENSE]), authoriser=tokens) as eng,
    ):
        waiting = refund_at_approval(eng)  # before the refund that pays: the order's balance is whole
        refund_failed(eng, books)
        expense_in_review(eng)
        ticket_queued(eng)
        done = eng.start("refund", DAMAGED, actor="ann")
        model = ScriptedModel(
            [
                call("query_order", order_id="O-1001"),
                call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
                refund(15_000),  # over the balance: refused, fed back, repaired
                refund(12_999),
            ],
            profile="anthropic",
        )
        assert eng.run(done, model=model).state == "awaiting_approval"
        digest = eng.load(done).prepared["digest"]  # type: ignore[index]
        eng.approve(done, actor="dana", prepared_digest=digest, comment="Photo EV-1 checked against the order.")
        books.arm("payments.refund", "lost_reply")  # the provider paid; its answer never came back
        assert eng.run(done).state == "retryable_failure"
        eng.fire(done, "retry_refund", actor="olga")
        assert eng.run(done).state == "completed"  # reconciled: recovered, not paid twice
        shots = SHOTS if os.environ.get("RAILYARD_UPDATE_SCREENSHOTS") == "1" else tmp_path
        shots.mkdir(parents=True, exist_ok=True)
        with live_server(create_app(eng, tokens, session_secret="test-secret")) as base:
            context = browser.new_context(base_url=base, viewport={"width": 1280, "height": 900})
            tab = context.new_page()
            try:
                log_in(tab, "dana")
                for width in (1280, 390):
                    tab.set_viewport_size({"width": width, "height": 900 if width > 400 else 844})
                    tab.goto(f"/inbox?open={waiting}")
                    assert tab.evaluate("document.documentElement.scrollWidth") <= width
                    assert tab.evaluate(AUDIT) == []
                    card = tab.locator(f"#approval-{waiting}")
                    text = card.inner_text()
                    assert "Refund 129.99 EUR to C-100 for order O-1001" in text  # the card refund declares
                    assert "My laptop arrived with a cracked screen." in text and "12999" not in text
                    tab.screenshot(path=str(shots / f"inbox-{width}.png"), full_page=True)
                    card.screenshot(path=str(shots / f"card-{width}.png"))
                    tab.goto(f"/tasks/{done}")
                    assert tab.evaluate("document.documentElement.scrollWidth") <= width
                    # The route is drawn at its own size on a phone (scrolling in its frame), at most the column's
                    # width on a wide screen: its labels stay readable.
                    shown, drawn = tab.evaluate(
                        "(() => { const s = document.querySelector('svg.route');"
                        " return [s.getBoundingClientRect().width, s.width.baseVal.value]; })()"
                    )
                    assert shown == pytest.approx(drawn, abs=1) if width < 600 else shown <= drawn + 1
                    timeline = tab.inner_text("ol.timeline")
                    assert "refused with DOMAIN_INVALID" in timeline and "approve by dana" in timeline
                    assert "recovered by reconciliation" in timeline
                    # The failure by the state's label and the code's meaning, the outcome as the tool reported it.
                    assert "unknown → Payment failed" in timeline
                    assert "TOOL_REMOTE_ERROR The tool's remote system failed" in timeline
                    assert "payments_refund: unknown" in timeline
                    tab.screenshot(path=str(shots / f"task-{width}.png"), full_page=True)
            finally:
                context.close()


def test_a_person_signs_in_through_the_openid_provider_and_sees_what_their_groups_allow(
    browser: Any, engine: Engine
) -> None:
    """The whole sign-in in Chromium: the login page's button, the provider's own page (at localhost: another site
    than the server at 127.0.0.1, as a real provider is), the code's exchange, and the session that follows."""
    task_id = to_approval(engine)
    users = {"petra": {"sub": "u-1001", "preferred_username": "petra", "groups": ["refund-approvers"]}}
    groups = parse_groups({"groups": {"refund-approvers": {"roles": ["refund_approver", "approver"]}}})
    with running(IdP(users=users)) as idp:
        settings = OidcSettings(idp.issuer, "railyard", groups, client_secret="s3cret", name="Test IdP")
        app = create_app(engine, token_table(), session_secret="test-secret", oidc=settings)
        with live_server(app) as server:
            idp.clients["railyard"] = Client([f"{server}/login/oidc/callback"], "s3cret")
            context = browser.new_context(base_url=server, viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(f"/tasks/{task_id}")  # not signed in: the login page, which offers the provider
            page.wait_for_url("**/login?next=*")
            page.click("text=Sign in with Test IdP")
            page.wait_for_url(f"{idp.issuer}/authorize?*")
            page.fill("#username", "petra")
            page.click("button:has-text('Sign in')")
            page.wait_for_url(f"**/tasks/{task_id}")  # back where they were going, signed in
            assert page.text_content("#actor") == "petra"
            assert "refund_approver" in page.inner_text(".roles")
            page.goto(f"/inbox?open={task_id}")
            card = page.locator(f"#approval-{task_id}")
            assert card.is_visible()  # their groups let them decide it
            card.locator("summary:has-text('Approve')").click()
            page.get_by_role("button", name=f"Approve shop refund of 40.00 EUR for task {task_id[:8]}…").click()
            page.wait_for_url("**/inbox*")
            assert page.text_content("#flash") == "Your decision (approved) is recorded."
            assert engine.get(task_id).state == "executing"
            token = idp.requests("token")[-1]
            assert token["code_verifier"] and idp.requests("authorize")[-1]["code_challenge_method"] == "S256"
            context.close()
    assert [e.actor for e in engine.history(task_id) if e.trigger == "approve"] == ["petra"]
    petra = People(engine.store).require("petra")
    assert petra.source is Source.OIDC and petra.roles == {"refund_approver", "approver"}


def test_an_approvers_day_sort_search_claim_decide_and_next_by_keyboard_then_a_bulk_approval(
    page: Any, engine: Engine
) -> None:
    """#32: the queue as a table, worked from the keyboard: j/k move, o opens, c claims, a approves (after the
    confirmation, as ever), and the next item opens; then ten rows approved at once, one of them stale."""
    first, second = to_approval(engine), to_approval(engine)
    log_in(page, "dana")
    assert page.locator("#queue tbody tr[data-task]").count() == 2
    page.click("#queue thead a:has-text('task')")  # sort by creation: oldest first
    page.wait_for_url("**sort=created*")
    page.click("#queue thead a:has-text('task')")  # and again: newest first
    page.wait_for_url("**order=desc*")
    assert page.locator("#queue tbody tr[data-task]").first.get_attribute("data-task") == second
    page.keyboard.press("/")
    page.keyboard.type(first[:13])
    page.keyboard.press("Enter")  # the search box's form
    page.wait_for_url("**q=*")
    assert page.locator("#queue tbody tr[data-task]").count() == 1
    page.goto("/inbox")
    page.keyboard.press("j")
    page.keyboard.press("o")
    page.wait_for_url(f"**open={first}*")
    page.keyboard.press("c")
    page.keyboard.press("Enter")  # the claim button has the focus
    page.wait_for_url(f"**open={first}*")
    assert "You are on it" in page.inner_text("#claim-box")
    assert "you are on it" in page.inner_text(f"#work-{first} td.claim")
    page.wait_for_load_state()  # the claim's page, its keys (a deferred script) in place: the URL was the same
    page.keyboard.press("a")  # opens the confirmation of a write and focuses its button
    page.locator(f"#approval-{first} details.confirm[open]").wait_for()
    assert "This runs refund_payment for 40.00 EUR." in page.inner_text(f"#approval-{first}")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**open={second}*")  # decided, and the next item is open
    assert page.text_content("#flash") == "Your decision (approved) is recorded."
    assert engine.get(first).state == "executing" and page.locator(f"#approval-{second}").is_visible()

    batch = [to_approval(engine) for _ in range(10)]
    page.goto("/inbox?sort=created&order=desc")
    for task_id in batch:
        page.check(f"#pick-{task_id}")
    engine.signal(batch[4], "cancel", {"reason": "withdrawn"}, actor="ann")  # moves while the page is open
    page.select_option("#bulk-decision", "approve")
    page.fill("#bulk-reason", "Batch checked against the orders.")
    page.click("#bulk-submit")
    page.wait_for_url("**/inbox/bulk")
    assert page.text_content("h1") == "Approve: 9 of 10 done"
    assert page.get_attribute(f"#result-{batch[4]}", "data-done") == "no"
    assert "CONCURRENCY_CONFLICT" in page.inner_text(f"#result-{batch[4]}")
    assert [engine.get(t).state for t in batch].count("executing") == 9 and engine.get(batch[4]).state == "cancelled"
    assert page.dialogs == []


def test_two_browsers_claim_the_same_item_one_wins_and_the_other_sees_who_has_it(
    browser: Any, server: str, engine: Engine
) -> None:
    task_id = to_approval(engine)
    tabs = []
    for who in ("dana", "erin"):
        context = browser.new_context(base_url=server, viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        log_in(tab, who)
        tab.goto(f"/inbox?open={task_id}")
        tabs.append(tab)
    try:
        dana, erin = tabs  # both see nobody on it, both press Claim
        dana.click("#claim-box button")
        erin.click("#claim-box button")
        dana.wait_for_load_state()
        erin.wait_for_load_state()
        assert "You are on it" in dana.inner_text("#claim-box")
        assert "WORK_CLAIMED" in erin.inner_text("#flash") and "dana is on task" in erin.inner_text("#flash")
        assert "dana is on it" in erin.inner_text("#claim-box")
        assert "dana is on it" in erin.inner_text(f"#work-{task_id}")
    finally:
        for tab in tabs:
            tab.context.close()


def test_from_a_task_to_its_workflows_quality_figures_in_chromium(browser: Any, server: str, engine: Engine) -> None:
    """The task page tags each model turn with its rung and first try; its workflow's link opens the figures of the
    last 7 days, readable at 1280 and at 390 pixels, with the contrast and names the other pages keep."""
    task_id = to_approval(engine)
    for width in (1280, 390):
        context = browser.new_context(base_url=server, viewport={"width": width, "height": 900})
        tab = context.new_page()
        try:
            tab.goto("/login")
            tab.fill("#token", "tok-dana")
            tab.click("button:has-text('Log in')")
            tab.wait_for_url("**/inbox")
            tab.goto(f"/tasks/{task_id}")
            tags = [t for t in tab.locator("ol.timeline .tag.turn").all_inner_texts() if t]  # those on screen
            assert len(tags) == 2 and all(t.endswith("· first-try answer") for t in tags), tags
            tab.click("#workflow-link")
            tab.wait_for_url("**/workflows/shop_refund")
            section = tab.locator("#state-collecting")
            assert section.locator("td.first-try").inner_text() == "2/2 (100%)"
            assert "Nothing in the last 7 days." in tab.locator("#state-awaiting_approval").inner_text()
            assert tab.evaluate(AUDIT) == []
            assert tab.evaluate("document.documentElement.scrollWidth") <= width
        finally:
            context.close()


def test_a_note_in_the_timeline_labels_local_times_and_a_conflict_that_names_who_in_chromium(
    browser: Any, tmp_path: Path
) -> None:
    """#32: a note added on the page shows in the timeline; a note by someone else does not make an open approval
    stale, a cancel does and the refusal names who; states show their labels and times are the viewer's."""
    from engine import Registry, migrations
    from engine.api import TokenTable, create_app
    from tests.support.reference import fake_systems
    from tests.test_api_work import TOKENS, expense_in_review
    from workflows import EXPENSE, REFUND_V1, TICKET_TRIAGE

    url = f"sqlite:///{tmp_path / 'reference.db'}"
    migrations.upgrade(url)
    tokens = TokenTable.from_tokens(TOKENS)
    with (
        fake_systems(url),
        Engine(url, Registry([REFUND_V1, TICKET_TRIAGE, EXPENSE]), authoriser=tokens) as eng,
    ):
        noted, cancelled = expense_in_review(eng, "eve"), expense_in_review(eng, "fay")
        with live_server(create_app(eng, tokens, session_secret="test-secret")) as base:
            context = browser.new_context(
                base_url=base, viewport={"width": 1280, "height": 900}, timezone_id="Asia/Tokyo"
            )
            tab = context.new_page()
            try:
                log_in(tab, "erin")
                tab.goto(f"/tasks/{noted}")
                assert tab.text_content("#task-state") == "review"
                assert tab.text_content("#task-state-label") == "(Waiting for approval)"
                timeline = tab.locator("ol.timeline").last  # the page's (the approval card folds its own away)
                assert "In Drafting the claim" in timeline.inner_text()
                first = timeline.locator("time").first
                assert first.get_attribute("title").endswith(" UTC")  # UTC on hover, the viewer's zone in the text
                assert "GMT+9" in first.inner_text() or "JST" in first.inner_text()
                tab.fill("#note-text", "Receipt checked against the card statement.")
                tab.click("#note-form button")
                tab.wait_for_url(f"**/tasks/{noted}")
                assert tab.text_content("#flash") == "Your note is recorded."
                note = tab.locator("ol.timeline").last.locator("li.step.note").last
                assert "Receipt checked against the card statement." in note.inner_text()
                assert "erin" in note.inner_text()
                tab.click("#logout")
                log_in(tab, "dana")
                tab.goto(f"/inbox?open={cancelled}")
                cancelled_card = tab.locator(f"#approval-{cancelled}")
                eng.cancel(cancelled, "olga", "Sent twice.")  # meanwhile, an operator cancels the claim dana sees
                cancelled_card.locator("textarea[name=comment]").fill("Looks right.")
                cancelled_card.get_by_role(
                    "button", name=f"Approve the claim expense of 123.45 EUR for task {cancelled[:8]}…"
                ).click()
                tab.wait_for_url(f"**/tasks/{cancelled}")
                flash = tab.inner_text("#flash")
                assert "CONCURRENCY_CONFLICT" in flash and "olga changed it meanwhile" in flash, flash
                tab.goto(f"/inbox?open={noted}")
                card = tab.locator(f"#approval-{noted}")
                eng.note(
                    noted, "erin", "One more thing: the taxi receipt is attached."
                )  # a note is no reason to refuse
                card.locator("textarea[name=comment]").fill("Receipt matches.")
                card.get_by_role(
                    "button", name=f"Approve the claim expense of 123.45 EUR for task {noted[:8]}…"
                ).click()
                tab.wait_for_url("**/inbox*")
                assert eng.get(noted).state == "paid", tab.inner_text("#flash")
            finally:
                context.close()
