"""Links everywhere: the diagrams draw a child state with the workflow it starts, the work queue names a child's
parent, an export of a tree verifies its links, and a child's end wakes a listening worker for its parent.

On SQLite and PostgreSQL (`db_url`); the browser test on SQLite, in Chromium.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine import Child, Engine, Registry, StaticRoles, Worker
from engine.api import TokenTable, create_app
from engine.api.views import workflow_diagram
from engine.audit.export import export_lines, verify_export
from engine.core.errors import Code
from engine.core.lineage import PARENT, chain_of
from engine.store.protocol import TaskQuery
from tests.support import child_workflows
from tests.support.child_workflows import children_of
from tests.support.insider import forge
from tests.test_api_browser import CHROMIUM, FLAGS, browser_required

ORDER = {"order": "O-77", "amount": 40}
REPO = Path(__file__).resolve().parent.parent
RAILYARD = str(Path(sys.executable).with_name("railyard"))
TOKENS = {"tok-audrey": ("audrey", {"auditor"}), "tok-bob": ("bob", set())}


def registry(*, searchable: bool = True) -> Registry:
    """The claim (parent) and payout (child, paid by a person); the claim declares its order searchable or not."""
    claim = child_workflows.claim(deadline=timedelta(hours=1))
    if searchable:
        claim = dataclasses.replace(claim, searchable=("order",))
    return Registry([child_workflows.payout(quick=False), claim])


@pytest.fixture
def family(db_url: str) -> Iterator[Engine]:
    eng = Engine(db_url, registry(), authoriser=StaticRoles({"bob": set(), "audrey": {"auditor"}}))
    yield eng
    eng.close()


def waiting_parent(eng: Engine) -> tuple[str, str]:
    parent_id = eng.start("claim", ORDER, actor="ann")
    eng.run(parent_id)
    [child_id] = children_of(eng, parent_id)
    return parent_id, child_id


def signed_in(client: TestClient, who: str) -> None:
    login = client.get("/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', login)
    assert csrf is not None
    client.post("/login", data={"user": who, "token": f"tok-{who}", "csrf": csrf.group(1)})


# -- the diagram -------------------------------------------------------------------------------------------------
def test_the_diagram_draws_a_child_state_with_its_workflow_and_the_pages_link_to_it(family: Engine) -> None:
    drawn = workflow_diagram(family.registry.get("claim"))
    assert 'state "paying: child payout@newest' in drawn["diagram"]
    assert drawn["children"] == [{"state": "paying", "workflow": "payout", "version": None}]
    pinned = dataclasses.replace(family.registry.get("claim"), name="claim_pinned")
    states = [dataclasses.replace(s, version=1) if isinstance(s, Child) else s for s in pinned.states]
    pinned = dataclasses.replace(pinned, states=states)
    assert 'state "paying: child payout@1' in workflow_diagram(pinned)["diagram"]

    parent_id, _ = waiting_parent(family)
    app = create_app(family, tokens=TokenTable.from_tokens(TOKENS), session_secret="links")
    with TestClient(app) as client:
        body = client.get(f"/api/tasks/{parent_id}/diagram", headers={"Authorization": "Bearer tok-audrey"}).json()
        assert body["children"] == [{"state": "paying", "workflow": "payout", "version": None}]
        assert "paying: child payout@newest" in body["diagram"]
        signed_in(client, "audrey")
        page = client.get(f"/tasks/{parent_id}").text
        assert '<a href="/workflows/payout">payout@newest</a>' in page[page.index('id="diagram-children"') :]
        page = client.get("/workflows/claim").text
        assert '<a href="/workflows/payout">payout@newest</a>' in page[page.index('id="state-paying"') :]


# -- the work queue ----------------------------------------------------------------------------------------------
def test_a_childs_queue_row_names_its_parents_workflow_and_handle(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    [listed] = [t for t in family.store.list_tasks(TaskQuery(field_value=parent_id)) if t.row.task_id == child_id]
    chain = chain_of(listed.fields)
    assert chain is not None and (chain.task_id, chain.workflow, chain.handle) == (parent_id, "claim", "O-77")
    assert str(chain) == "claim O-77"
    app = create_app(family, tokens=TokenTable.from_tokens(TOKENS), session_secret="links")
    with TestClient(app) as client:
        signed_in(client, "bob")
        html = client.get("/inbox").text
        row = html[html.index(f'id="pick-{child_id}"') :]
        row = row[: row.index("</tr>")]
        assert f'for <a href="/tasks/{parent_id}">claim O-77</a>' in row
        assert PARENT not in row  # the chain's fields are not shown as the task's own


def test_a_parent_that_declares_no_searchable_field_is_named_by_its_short_id(db_url: str) -> None:
    with Engine(db_url, registry(searchable=False), authoriser=StaticRoles({"bob": set()})) as eng:
        parent_id, child_id = waiting_parent(eng)
        [listed] = [t for t in eng.store.list_tasks(TaskQuery(field_value=parent_id)) if t.row.task_id == child_id]
        chain = chain_of(listed.fields)
        assert chain is not None and str(chain) == f"claim {parent_id[:8]}"


def test_the_queue_reads_no_log_for_the_chain(family: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _, child_id = waiting_parent(family)
    app = create_app(family, tokens=TokenTable.from_tokens(TOKENS), session_secret="links")
    loaded: list[str] = []
    for name in ("load", "events"):
        original = getattr(family.store, name)

        def counting(task_id: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            loaded.append(task_id)
            return _original(task_id, *args, **kwargs)

        monkeypatch.setattr(family.store, name, counting)
    with TestClient(app) as client:
        signed_in(client, "bob")
        assert f'id="pick-{child_id}"' in client.get("/inbox").text
    assert loaded == []


# -- export and verification of a tree -----------------------------------------------------------------------------
def tree_lines(eng: Engine, root: str) -> list[bytes]:
    items = eng.audit.logs(eng.audit.tree(root))
    return [line.encode() for line in export_lines(items, tree=root)]


def findings(eng: Engine, lines: list[bytes], *, tree: bool = False) -> list[tuple[Code, str]]:
    found: list[tuple[Code, str]] = []
    for report in verify_export(lines, eng.registry.find, tree=tree):
        found.extend((f.code, f.message) for f in report.findings)
    return found


def test_an_export_of_a_tree_holds_its_descendants_and_verifies_its_links(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    family.fire(child_id, "pay", {"paid": 40}, actor="bob")
    Worker(family, listen=False).drain()
    assert family.audit.tree(parent_id) == [parent_id, child_id]
    lines = tree_lines(family, parent_id)
    assert sorted(json.loads(x)["task_id"] for x in lines if json.loads(x)["kind"] == "task") == sorted(
        [parent_id, child_id]
    )  # in task id order, as every export
    assert json.loads(lines[-1])["tree"] == parent_id
    assert findings(family, lines, tree=True) == []

    # The child left out of the export: the parent's links name a task the file lacks.
    without = [x for x in lines if json.loads(x).get("task_id") != child_id]
    end = json.loads(without[-1])
    without[-1] = json.dumps(
        {**end, "tasks": end["tasks"] - 1, "events": sum(json.loads(x)["kind"] == "event" for x in without)},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    assert {code for code, _ in findings(family, without)} == {Code.CHILD_MISSING}
    # The root's mark taken off to hide it: a verifier that asks for a tree is not fooled.
    unmarked = [*without[:-1], without[-1].replace(f',"tree":"{parent_id}"'.encode(), b"")]
    assert findings(family, unmarked) == []
    assert (Code.CHILD_MISSING, "the export is not of a tree: its end line names no root") in findings(
        family, unmarked, tree=True
    )
    # The child alone, claimed as the tree of its parent: the root is missing.
    alone = [line.encode() for line in export_lines(family.audit.logs([child_id]), tree=parent_id)]
    assert {code for code, _ in findings(family, alone)} == {Code.CHILD_MISSING, Code.CHILD_LINK_MISMATCH}


def test_a_link_forged_inside_an_exported_tree_is_found(family: Engine) -> None:
    parent_id, child_id = waiting_parent(family)
    family.fire(child_id, "pay", {"paid": 40}, actor="bob")
    child = family.history(child_id)[-1]
    record = family.load(parent_id).visit["child"]
    forge(  # an insider records a result the child never gave, hashes and all: the chain holds, the link does not
        family,
        parent_id,
        trigger="child_paid",
        to_state="closed",
        status="terminal",
        data={
            "child": {
                "task_id": child_id,
                "action_id": record["action_id"],
                "state": "paid",
                "seq": child.seq,
                "hash": child.hash,
                "result": {"state": "paid", "paid": 4000},
            }
        },
    )
    found = findings(family, tree_lines(family, parent_id), tree=True)
    assert [code for code, _ in found] == [Code.CHILD_RESULT_MISMATCH]
    assert found[0][1].startswith(f"task {parent_id}: ")


def ended_tree(eng: Engine) -> tuple[str, str]:
    """A claim whose quick payout (`child_workflows.WORKFLOWS`, what the CLI serves) paid itself, both ended."""
    parent_id = eng.start("claim", ORDER, actor="ann")
    eng.run(parent_id)
    [child_id] = children_of(eng, parent_id)
    deadline = time.monotonic() + 20
    while eng.load(parent_id).state != "closed" and time.monotonic() < deadline:
        Worker(eng, listen=False).drain()  # the quick payout pays itself once its deadline passed
        time.sleep(0.05)
    assert eng.load(parent_id).state == "closed"
    return parent_id, child_id


def test_the_cli_exports_a_tree_and_verify_export_checks_it(db_url: str, tmp_path: Path) -> None:
    with Engine(db_url, Registry(child_workflows.WORKFLOWS)) as eng:
        parent_id, child_id = ended_tree(eng)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RAILYARD_DATABASE_URL": db_url,
        "RAILYARD_WORKFLOWS": "tests.support.child_workflows",
    }
    done = subprocess.run(
        [RAILYARD, "export", parent_id, "--tree"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    tasks = [json.loads(x)["task_id"] for x in done.stdout.splitlines() if json.loads(x)["kind"] == "task"]
    assert sorted(tasks) == sorted([parent_id, child_id])
    path = tmp_path / "tree.jsonl"
    path.write_text(done.stdout, encoding="utf-8")
    done = subprocess.run(
        [RAILYARD, "verify-export", str(path), "--tree"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "no findings" in done.stdout, done.stdout + done.stderr
    single = subprocess.run([RAILYARD, "export", parent_id], env=env, capture_output=True, text=True, timeout=120)
    path.write_text(single.stdout, encoding="utf-8")
    done = subprocess.run(
        [RAILYARD, "verify-export", str(path), "--tree"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3 and "CHILD_MISSING" in done.stdout, done.stdout + done.stderr


# -- a child's end wakes a listening worker for its parent ---------------------------------------------------------
def test_a_childs_end_notifies_a_listening_worker_and_the_parent_resumes_at_once(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite sends no notifications: its workers poll")
    with Engine(db_url, registry(), authoriser=StaticRoles({"bob": set()})) as eng:
        parent_id, child_id = waiting_parent(eng)
        worker = Worker(eng, name="listening", poll_seconds=60, concurrency=1)
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            assert worker.listen
            time.sleep(1.5)  # the worker listens, and its first look found nothing due: it waits 60 s, or a note
            started = time.monotonic()
            eng.fire(child_id, "pay", {"paid": 40}, actor="bob")
            deadline = started + 30
            while eng.load(parent_id).state != "closed" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert eng.load(parent_id).state == "closed"
            assert time.monotonic() - started < 5  # far below the 60 s poll: the child's end woke it
        finally:
            worker.stop()
            runner.join(timeout=30)
        assert not runner.is_alive()


# -- the tree in a browser ------------------------------------------------------------------------------------------
@pytest.fixture
def chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if browser_required():
            pytest.fail(f"a browser is required (RAILYARD_TEST_BROWSER=required) but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def test_the_task_page_shows_the_tree_in_chromium(chromium: Any, tmp_path: Path) -> None:
    from engine import migrations
    from tests.support.api import live_server

    url = f"sqlite:///{tmp_path / 'tree.db'}"
    migrations.upgrade(url)
    with Engine(url, registry(), authoriser=TokenTable.from_tokens(TOKENS)) as eng:
        parent_id, child_id = waiting_parent(eng)
        app = create_app(eng, tokens=TokenTable.from_tokens(TOKENS), session_secret="links")
        with live_server(app) as server:
            context = chromium.new_context(base_url=server, viewport={"width": 1280, "height": 900})
            try:
                page = context.new_page()
                page.goto("/login")
                page.fill("#token", "tok-bob")
                page.click("button:has-text('Log in')")
                page.wait_for_url("**/inbox")
                # The queue names the chain; its link leads to the parent's page.
                row = page.locator(f"tr:has(#pick-{child_id})")
                assert "for claim O-77" in row.inner_text()
                row.get_by_role("link", name="claim O-77").click()
                page.wait_for_url(f"**/tasks/{parent_id}")
                children = page.locator("#task-children")
                assert "payout@1" in children.inner_text() and "pending" in children.inner_text()
                assert "payout@newest" in page.inner_text("#diagram-children")
                children.locator(f'a[href="/tasks/{child_id}"]').click()
                page.wait_for_url(f"**/tasks/{child_id}")
                assert "claim@1" in page.inner_text("#task-parent")
                eng.fire(child_id, "pay", {"paid": 40}, actor="bob")
                Worker(eng, listen=False).drain()
                page.locator(f'#task-parent a[href="/tasks/{parent_id}"]').click()
                page.wait_for_url(f"**/tasks/{parent_id}")
                assert "ended paid" in page.inner_text("#task-children")
                assert page.text_content("#task-state") == "closed"
            finally:
                context.close()


def test_a_checkpoint_covers_every_task_of_a_tree_and_an_exported_tree_proves_each_head(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints are of the whole database (a Merkle tree over every task's head): a tree's tasks are all in
    it, and an export of the tree carries a proof line for each, verified offline against the signed root."""
    from typer.testing import CliRunner

    from engine.audit.checkpoint import keygen
    from engine.cli import app

    key = tmp_path / "signing.key"
    public = keygen(key)
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.child_workflows")
    with Engine(db_url, Registry(child_workflows.WORKFLOWS)) as eng:
        parent_id, child_id = ended_tree(eng)
        _, checkpoint, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        _, judged = eng.audit.judge_checkpoint(checkpoint, public)
        assert [r for r in judged if not r.ok] == []
    runner = CliRunner()
    result = runner.invoke(app, ["export", parent_id, "--tree", "--checkpoint", str(checkpoint)])
    assert result.exit_code == 0, result.output
    values = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(v["task_id"] for v in values if v["kind"] == "proof") == sorted([parent_id, child_id])
    exported = tmp_path / "tree.jsonl"
    exported.write_text(result.stdout, encoding="utf-8")
    verify = ["verify-export", str(exported), "--checkpoint", str(checkpoint), "--public-key", public]
    done = runner.invoke(app, [*verify, "--partial", "--tree"])
    assert done.exit_code == 0, done.output
    # Without --partial the checkpoint's other tasks would be missing: a tree is a part of the database.
    assert runner.invoke(app, [*verify, "--tree"]).exit_code == 0  # here the tree is the whole database


def test_show_and_history_print_the_tree(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from engine.cli import app

    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.child_workflows")
    with Engine(db_url, Registry(child_workflows.WORKFLOWS)) as eng:
        parent_id, child_id = ended_tree(eng)
    runner = CliRunner()
    shown = runner.invoke(app, ["show", parent_id])
    assert shown.exit_code == 0 and child_id in shown.stdout and "paid" in shown.stdout, shown.output
    told = runner.invoke(app, ["history", parent_id])
    assert told.exit_code == 0, told.output
    assert f"started {child_id} (payout@1, from paying): paid, ended paid" in told.stdout
    told = runner.invoke(app, ["history", child_id])
    assert f"started by {parent_id} (claim@1, in paying, intent at seq 2)" in told.stdout, told.stdout
    assert [e["trigger"] for e in json.loads(runner.invoke(app, ["history", parent_id, "--json"]).stdout)][:2] == [
        "start",
        "spawn",
    ]
