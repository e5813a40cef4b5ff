"""Tenants (issue #28): a task belongs to the tenant of the trusted caller who starts it, and every read, list,
count, command and export is confined to the caller's tenants.

The people: portals and approvers of two tenants (acme, globex), a portal of both, and an operator confined to
none (a single-tenant install's everybody). What a person of one tenant may not see of the other is absent: the
same answer as a task that does not exist, never a refusal that confirms it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict
from sqlalchemy import create_engine, text

from engine import (
    Action,
    Agent,
    Code,
    Engine,
    RailyardError,
    Registry,
    ScriptedModel,
    StaticRoles,
    Terminal,
    Wait,
    Workflow,
)
from engine.api import Principal, TokenTable, create_app
from engine.api.tokens import hash_token
from engine.audit.export import export_lines, verify_export
from engine.core.access import Caller, Scope, start_tenant
from engine.providers.scripted import call
from engine.runtime import queries
from engine.runtime.worker import Worker
from tests.support import reference
from tests.support.reference import DAMAGED, refund

books, eng = reference.books, reference.eng  # the reference workflows' fixtures

ROLES: dict[str, set[str]] = {
    **reference.ROLES,
    "acme_portal": {"customer_portal"},
    "globex_portal": {"customer_portal"},
    "both_portal": {"customer_portal"},
    "aldo": {"refund_approver"},
    "gina": {"refund_approver"},
    "gus": {"refund_operator"},
}
TENANTS: dict[str, set[str]] = {
    "acme_portal": {"acme"},
    "globex_portal": {"globex"},
    "both_portal": {"acme", "globex"},
    "aldo": {"acme"},
    "gina": {"globex"},
    "gus": {"globex"},
}


def refused(action: Any) -> RailyardError:
    with pytest.raises(RailyardError) as caught:
        action()
    return caught.value


@pytest.fixture
def tenanted(eng: Engine) -> Engine:
    """The reference engine's store and workflows, with people confined to tenants."""
    return Engine(store=eng.store, registry=eng.registry, authoriser=StaticRoles(ROLES, TENANTS))


def to_approval(engine: Engine, starter: str = "acme_portal") -> str:
    task_id = engine.start("refund", DAMAGED, actor=starter, version=1)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="damaged"),
            refund(12_999),
        ],
        profile="anthropic",
    )
    assert engine.run(task_id, model=model, max_turns=4).state == "awaiting_approval"
    return task_id


# -- the pure rule ------------------------------------------------------------------------------------------------
def test_the_tenant_of_a_new_task_is_the_callers_never_one_it_does_not_belong_to() -> None:
    one, both, free = (
        Caller("a", tenants=frozenset({"acme"})),
        Caller("b", tenants=frozenset({"acme", "x"})),
        Caller("c"),
    )
    assert start_tenant(one, None) == "acme" and start_tenant(one, "acme") == "acme"
    assert start_tenant(both, "x") == "x"
    assert start_tenant(free, None) is None and start_tenant(free, "globex") == "globex"
    assert refused(lambda: start_tenant(both, None)).code is Code.TENANT_REQUIRED
    assert refused(lambda: start_tenant(one, "globex")).code is Code.FORBIDDEN
    assert refused(lambda: start_tenant(free, "no tenant!")).code is Code.PAYLOAD_INVALID
    acme_only = Scope(None, frozenset({"acme"}))
    assert acme_only.sees("refund", "acme") and not acme_only.sees("refund", "globex")
    assert not acme_only.sees("refund", None)  # a confined caller never sees a task of no tenant
    assert Scope().sees("refund", None) and Scope().sees("refund", "globex")


# -- the engine ---------------------------------------------------------------------------------------------------
def test_a_task_belongs_to_its_starters_tenant_as_its_start_event_says_and_replay_proves(tenanted: Engine) -> None:
    task_id = tenanted.start("refund", DAMAGED, actor="acme_portal", version=1)
    first = tenanted.history(task_id)[0]
    assert first.data["tenant"] == "acme"
    assert tenanted.load(task_id).tenant == "acme" and tenanted.get(task_id).tenant == "acme"
    assert tenanted.store.row(task_id).tenant == "acme"  # type: ignore[union-attr]
    assert tenanted.replay(task_id).findings == ()
    plain = tenanted.start("refund", DAMAGED, actor="ann", version=1)  # a caller of no tenant: none, as before
    assert "tenant" not in tenanted.history(plain)[0].data and tenanted.load(plain).tenant is None


def test_a_caller_of_several_tenants_must_say_which_and_none_may_name_a_tenant_not_theirs(tenanted: Engine) -> None:
    before = tenanted.store.task_ids()
    assert refused(lambda: tenanted.start("refund", DAMAGED, actor="both_portal", version=1)).code is (
        Code.TENANT_REQUIRED
    )
    for actor, tenant in (("both_portal", "initech"), ("acme_portal", "globex")):
        error = refused(lambda a=actor, t=tenant: tenanted.start("refund", DAMAGED, actor=a, version=1, tenant=t))
        assert error.code is Code.FORBIDDEN, (actor, tenant)
    assert tenanted.store.task_ids() == before  # nothing was written
    chosen = tenanted.start("refund", DAMAGED, actor="both_portal", version=1, tenant="globex")
    assert tenanted.load(chosen).tenant == "globex"
    # The input is no way in: the refund's input model has no tenant field, and identity never comes from input.
    error = refused(lambda: tenanted.start("refund", {**DAMAGED, "tenant": "globex"}, actor="acme_portal", version=1))
    assert error.code is Code.PAYLOAD_INVALID


def test_another_tenants_approver_and_operator_find_no_task_and_nothing_is_written(tenanted: Engine) -> None:
    task_id = to_approval(tenanted)
    digest = tenanted.load(task_id).prepared["digest"]  # type: ignore[index]
    before = tenanted.history(task_id)
    attempts = {
        "approve": lambda: tenanted.approve(task_id, "gina", digest),
        "reject": lambda: tenanted.reject(task_id, "gina", "no"),
        "fire": lambda: tenanted.fire(task_id, "approve", {"digest": digest}, actor="gina"),
        "cancel": lambda: tenanted.cancel(task_id, "gus", "stop"),
        "settle": lambda: tenanted.settle(task_id, "gus", "executed", "seen at the bank"),
        "redrive": lambda: tenanted.redrive(task_id, "eligible", actor="gus", reason="again"),
        "fork": lambda: tenanted.fork(task_id, 1, actor="gus", reason="again"),
    }
    for name, attempt in attempts.items():
        error = refused(attempt)
        assert (error.code, error.message) == (Code.TASK_NOT_FOUND, f"no task {task_id!r}"), name
    assert tenanted.history(task_id) == before
    assert tenanted.approve(task_id, "aldo", digest).state == "executing"  # the task's own tenant's approver


def test_each_approver_is_listed_the_approvals_of_their_tenants_only_a_page_at_a_time(tenanted: Engine) -> None:
    """`railyard approvals --as`, GET /api/approvals, its CSV and the inbox all read `queries.approvals`."""
    acme = [to_approval(tenanted, "acme_portal"), to_approval(tenanted, "acme_portal")]
    globex = to_approval(tenanted, "globex_portal")

    def listed(person: str | None, **page: Any) -> tuple[list[str], str | None]:
        caller = tenanted.caller(person) if person is not None else None
        found, last = queries.approvals(tenanted, caller, **page)
        return [a["task_id"] for a in found], last

    assert listed("aldo") == (acme, None) and listed("gina") == ([globex], None)
    assert listed(None) == ([*acme, globex], None)  # the trusted process: every tenant, oldest first
    first, cursor = listed("aldo", limit=1)
    assert first == acme[:1] and cursor == acme[0]
    assert listed("aldo", limit=1, after=cursor) == (acme[1:], None)
    assert listed("gina", role="refund_operator") == ([], None)  # no approval state of that role


def test_a_fork_stays_in_its_sources_tenant(tenanted: Engine) -> None:
    task_id = tenanted.start("refund", DAMAGED, actor="acme_portal", version=1)
    tenanted.cancel(task_id, "olga", "asked to stop")  # an operator of no tenant acts on every tenant's tasks
    fork = tenanted.fork(task_id, 1, actor="olga", reason="start again")
    assert tenanted.load(fork).tenant == "acme" and tenanted.store.row(fork).tenant == "acme"  # type: ignore[union-attr]
    assert tenanted.history(fork)[0].data["carried"]["tenant"] == "acme"
    assert tenanted.replay(fork).findings == ()


def test_replay_finds_a_task_moved_to_another_tenant_behind_the_log(tenanted: Engine, db_url: str) -> None:
    task_id = tenanted.start("refund", DAMAGED, actor="acme_portal", version=1)
    raw = create_engine(db_url)
    with raw.begin() as conn:
        conn.execute(text("UPDATE tasks SET tenant = 'globex' WHERE task_id = :t"), {"t": task_id})
    raw.dispose()
    findings = tenanted.replay(task_id).findings
    assert [f.code for f in findings] == [Code.STATE_MISMATCH]
    assert "tenant globex" in findings[0].message and "tenant acme" in findings[0].message


def test_an_export_of_a_tenant_holds_only_its_tasks_and_verifies(tenanted: Engine) -> None:
    acme = tenanted.start("refund", DAMAGED, actor="acme_portal", version=1)
    globex = tenanted.start("refund", DAMAGED, actor="globex_portal", version=1)
    plain = tenanted.start("refund", DAMAGED, actor="ann", version=1)
    lines = list(export_lines(tenanted.audit.logs(tenant="acme")))
    rows = [json.loads(line) for line in lines if json.loads(line)["kind"] == "task"]
    assert [(r["task_id"], r["tenant"]) for r in rows] == [(acme, "acme")]
    every = [json.loads(line) for line in export_lines(tenanted.audit.logs()) if '"kind":"task"' in line]
    assert {r["task_id"]: r.get("tenant") for r in every} == {acme: "acme", globex: "globex", plain: None}
    reports = list(verify_export((line.encode() for line in lines), tenanted.registry.find))
    assert all(not r.findings for r in reports), reports
    # The task line moved to another tenant, the events left as they were: the fold disagrees with the line.
    moved = [
        line.replace('"tenant":"acme"', '"tenant":"globex"') if '"kind":"task"' in line else line for line in lines
    ]
    findings = [f for r in verify_export((m.encode() for m in moved), tenanted.registry.find) for f in r.findings]
    assert [f.code for f in findings] == [Code.STATE_MISMATCH]


# -- the API: a person of one tenant sees nothing of the other -------------------------------------------------------
def tokens() -> TokenTable:
    return TokenTable(
        Principal(
            p, frozenset(ROLES[p]), hash_token(f"tok-{p}"), tenants=frozenset(TENANTS[p]) if p in TENANTS else None
        )
        for p in ("acme_portal", "globex_portal", "both_portal", "aldo", "gina", "dana", "audrey")
    )


def bearer(person: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{person}"}


def test_over_the_api_a_task_starts_in_the_tokens_tenant_and_the_other_tenant_sees_no_trace(eng: Engine) -> None:
    table = tokens()
    engine = Engine(store=eng.store, registry=eng.registry, authoriser=table)
    client = TestClient(create_app(engine, table, session_secret="test"))
    started = client.post("/api/tasks", json={"workflow": "refund", "input": DAMAGED}, headers=bearer("acme_portal"))
    assert started.status_code == 201 and started.json()["tenant"] == "acme"
    task_id = started.json()["task_id"]
    ambiguous = client.post("/api/tasks", json={"workflow": "refund", "input": DAMAGED}, headers=bearer("both_portal"))
    assert (ambiguous.status_code, ambiguous.json()["code"]) == (422, "TENANT_REQUIRED")
    foreign = client.post(
        "/api/tasks", json={"workflow": "refund", "input": DAMAGED, "tenant": "globex"}, headers=bearer("acme_portal")
    )
    assert (foreign.status_code, foreign.json()["code"]) == (403, "FORBIDDEN")
    assert client.get("/api/me", headers=bearer("aldo")).json()["tenants"] == ["acme"]
    for person, sees in (("aldo", True), ("dana", True), ("audrey", True), ("gina", False), ("globex_portal", False)):
        got = client.get(f"/api/tasks/{task_id}", headers=bearer(person))
        assert (got.status_code == 200) is sees, person
        if not sees:
            assert got.json() == {
                "code": "TASK_NOT_FOUND",
                "message": f"no task {task_id!r}",
                "details": {"task_id": task_id},
            }
            short = client.get(f"/api/tasks/{task_id[:8]}", headers=bearer(person))
            assert short.json()["code"] == "TASK_NOT_FOUND", person  # a prefix names nothing of the other tenant
        listed = {t["task_id"] for t in client.get("/api/tasks", headers=bearer(person)).json()["tasks"]}
        assert (task_id in listed) is sees, person
    cursor_of_theirs = client.get("/api/tasks", params={"cursor": _cursor(task_id)}, headers=bearer("gina"))
    assert (cursor_of_theirs.status_code, cursor_of_theirs.json()["code"]) == (422, "PAYLOAD_INVALID")


def _cursor(task_id: str) -> str:
    from engine.api.views import encode_cursor

    return encode_cursor(task_id)


# -- under load: two tenants, workers, lists, counts and exports at once -------------------------------------------
class Intake(BaseModel):
    model_config = ConfigDict(extra="forbid")
    customer: str


#: The model sorts each request, then it waits for a clerk: one model turn, then a blocked task the queue counts.
INTAKE = Workflow(
    name="intake",
    version=1,
    input=Intake,
    states=[
        Agent("sorting", actions=[Action("route", "review")]),
        Wait("review", actions=[Action("close", "done", role="clerk")]),
        Terminal("done"),
    ],
    operator_role="ops",
    model_override_role="ops",
)
PER_TENANT = 500


def test_two_tenants_under_load_never_see_each_others_tasks(pg_database: str) -> None:
    """2 tenants x 500 tasks, started while two workers run them and each tenant's clerk lists, counts and
    exports at once: no read, list, count or export of one tenant ever holds a task of the other."""
    from tests.support.postgres import truncate

    truncate(pg_database)
    people = {
        "portal_a": ({"portal"}, {"acme"}),
        "portal_g": ({"portal"}, {"globex"}),
        "clerk_a": ({"clerk"}, {"acme"}),
        "clerk_g": ({"clerk"}, {"globex"}),
    }
    table = TokenTable(
        Principal(p, frozenset(r), hash_token(f"tok-{p}"), tenants=frozenset(t)) for p, (r, t) in people.items()
    )
    engine = Engine(pg_database, Registry([INTAKE]), authoriser=table)
    client = TestClient(create_app(engine, table, session_secret="test"))
    started: dict[str, set[str]] = {"acme": set(), "globex": set()}
    seen: dict[str, set[str]] = {"acme": set(), "globex": set()}
    stop = threading.Event()
    problems: list[str] = []
    model = ScriptedModel([call("route")] * (2 * PER_TENANT), profile="anthropic")
    workers = [Worker(engine, name=f"w{i}", model=model, concurrency=8, poll_seconds=0.05) for i in range(2)]

    def start(portal: str, tenant: str) -> None:
        for i in range(PER_TENANT):
            started[tenant].add(engine.start("intake", {"customer": f"{tenant}-{i}"}, actor=portal))

    def read(clerk: str, path: str, limit: int) -> dict[str, Any]:
        got = client.get(path, params={"limit": limit}, headers=bearer(clerk))
        assert got.status_code == 200, (clerk, path, got.text)
        body: dict[str, Any] = got.json()
        return body

    rounds = {"acme": 0, "globex": 0}

    def watch(clerk: str, tenant: str) -> None:
        while not stop.is_set():
            try:
                listed = read(clerk, "/api/tasks", 500)["tasks"]
                work = read(clerk, "/api/work", 100)
                exported = [json.loads(line) for line in export_lines(engine.audit.logs(tenant=tenant))]
            except BaseException as error:  # a failed read is a finding too, not a hang
                problems.append(f"{clerk}: {error!r}")
                return
            rounds[tenant] += 1
            seen[tenant].update(t["task_id"] for t in listed)
            seen[tenant].update(i["task_id"] for i in work["items"])
            seen[tenant].update(r["task_id"] for r in exported if r["kind"] == "task")
            if any(r["kind"] == "task" and r.get("tenant") != tenant for r in exported):
                problems.append(f"{clerk}'s export holds another tenant's task")
            total = work["total"]["yours"] + work["total"]["others"]
            if total > PER_TENANT:
                problems.append(f"{clerk} counts {total} tasks waiting: more than its tenant has")

    threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
    threads += [
        threading.Thread(target=watch, args=("clerk_a", "acme")),
        threading.Thread(target=watch, args=("clerk_g", "globex")),
    ]
    starters = [
        threading.Thread(target=start, args=("portal_a", "acme")),
        threading.Thread(target=start, args=("portal_g", "globex")),
    ]
    for thread in threads + starters:
        thread.start()
    try:
        for thread in starters:
            thread.join()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            counts = {
                c: client.get("/api/work", headers=bearer(c)).json()["total"]["yours"] for c in ("clerk_a", "clerk_g")
            }
            if counts == {"clerk_a": PER_TENANT, "clerk_g": PER_TENANT}:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the workers did not bring every task to review: {counts}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        engine.close()
    assert problems == []
    assert rounds["acme"] >= 2 and rounds["globex"] >= 2, rounds  # the reads ran while the tasks were worked
    assert len(started["acme"]) == len(started["globex"]) == PER_TENANT
    assert seen["acme"] and seen["acme"] <= started["acme"]
    assert seen["globex"] and seen["globex"] <= started["globex"]


# -- checkpoints: the signature binds each task's tenant -----------------------------------------------------------
def test_a_checkpoint_signs_each_tasks_tenant_and_one_tenants_export_is_complete_against_it(
    tenanted: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's export verifies against the full checkpoint as that tenant's (`--tenant`): every head signed as
    theirs is in it and nothing else; a task moved to another tenant behind the log is found in the database and
    in the file."""
    from typer.testing import CliRunner

    from engine.audit.checkpoint import keygen
    from engine.cli import app

    key = tmp_path / "signing.key"
    public = keygen(key)
    acme = [tenanted.start("refund", DAMAGED, actor="acme_portal", version=1) for _ in range(2)]
    globex = tenanted.start("refund", DAMAGED, actor="globex_portal", version=1)
    plain = tenanted.start("refund", DAMAGED, actor="ann", version=1)
    _, checkpoint, _ = tenanted.audit.checkpoint(key, tmp_path / "cp")
    heads = [json.loads(line) for line in checkpoint.read_text(encoding="utf-8").splitlines()[1:]]
    assert {h[0]: h[3:] for h in heads} == {acme[0]: ["acme"], acme[1]: ["acme"], globex: ["globex"], plain: []}

    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows")
    runner = CliRunner()
    exported = runner.invoke(app, ["export", "--all", "--tenant", "acme", "--checkpoint", str(checkpoint)])
    assert exported.exit_code == 0, exported.output
    export = tmp_path / "acme.jsonl"
    export.write_text(exported.stdout, encoding="utf-8")
    verify = ["verify-export", str(export), "--checkpoint", str(checkpoint), "--public-key", public, "--json"]

    def findings(*extra: str) -> set[tuple[str, str]]:
        got = runner.invoke(app, [*verify, *extra])
        assert got.exit_code in (0, 3), got.output
        return {(r["task_id"], f["code"]) for r in json.loads(got.stdout)["reports"] for f in r["findings"]}

    assert findings("--tenant", "acme") == set()
    assert findings() == {(globex, "TASK_MISSING"), (plain, "TASK_MISSING")}  # held to every tenant's heads
    assert findings("--tenant", "globex") == {
        (acme[0], "STATE_MISMATCH"),
        (acme[1], "STATE_MISMATCH"),
        (globex, "TASK_MISSING"),
    }
    moved = [
        line.replace('"tenant":"acme"', '"tenant":"globex"') if acme[0] in line and '"kind":"task"' in line else line
        for line in export.read_text(encoding="utf-8").splitlines(keepends=True)
    ]
    export.write_text("".join(moved), encoding="utf-8")
    assert (acme[0], "HEAD_REWRITTEN") in findings("--tenant", "acme")  # the signed leaf names acme

    raw = create_engine(db_url)
    with raw.begin() as conn:
        conn.execute(text("UPDATE tasks SET tenant = 'globex' WHERE task_id = :t"), {"t": acme[1]})
    raw.dispose()
    _, reports = tenanted.audit.judge_checkpoint(checkpoint, public)
    assert {(r.task_id, f.code) for r in reports for f in r.findings} == {(acme[1], Code.STATE_MISMATCH)}
