"""A task starts a child task, waits for it holding nothing, and is routed by its end: on SQLite and PostgreSQL.

Each crash point of the protocol is played here by stopping the protocol where a dead worker would have stopped
it (the events it wrote, the child it made); `tests/test_children_crash.py` kills real worker processes there.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from engine import Child, Engine, Registry, State, StaticRoles, Worker, Workflow
from engine.core import commands
from engine.core.canonical import now
from engine.core.children import child_task_id, intent, parent_link
from engine.core.errors import Code, RailyardError
from engine.core.summary import summarise
from engine.core.task import TaskState
from engine.runtime.children import ChildRunner
from tests.support import child_workflows
from tests.support.child_workflows import children_of
from tests.support.races import together
from tests.support.reference import expire_leases

ORDER = {"order": "O-77", "amount": 40}


@pytest.fixture
def family(db_url: str) -> Iterator[Engine]:
    registry = Registry([child_workflows.payout(quick=False), child_workflows.claim(deadline=timedelta(hours=1))])
    eng = Engine(db_url, registry, authoriser=StaticRoles({"bob": set(), "olga": set()}))
    yield eng
    eng.close()


def spawned_intent(eng: Engine, task: TaskState) -> TaskState:
    """The intent, as a worker records it before it dies."""
    definition = eng.registry.get("payout")
    return eng.commit_system(task, "spawn", intent(task, definition, ORDER, now()), actor="system:children")


def make_child(eng: Engine, task: TaskState) -> str:
    """The child, as a worker makes it after the intent, before it dies."""
    record = task.visit["child"]
    definition = eng.registry.get("payout")
    created = commands.start_child(definition, task, record, parent_link(task, record, task.seq), at=now())
    return eng.create(definition, created)


def test_a_parent_starts_one_child_waits_and_answers_from_its_end(family: Engine) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    waiting = family.run(parent_id)
    assert (waiting.state, str(waiting.status)) == ("paying", "blocked")
    [child_id] = children_of(family, parent_id)
    first = family.history(child_id)[0]
    spawn = family.history(parent_id)[1]
    # The child's first event names the parent, the intent's seq and its action id; the parent's events name the child.
    assert first.data["parent"] == {
        "task_id": parent_id,
        "seq": spawn.seq,
        "action_id": spawn.data["child"]["action_id"],
        "workflow": "claim@1",
        "state": "paying",
    }
    assert first.data["input"] == ORDER and first.actor == "ann"
    assert spawn.data["child"]["task_id"] == child_id == child_task_id(parent_id, spawn.data["child"]["action_id"])
    assert [e.trigger for e in family.history(parent_id)] == ["start", "spawn", "spawned"]
    row = family.store.row(parent_id)
    assert row is not None and row.lease_owner is None  # it holds no lease while the child runs

    family.fire(child_id, "pay", {"paid": 38}, actor="bob")
    row = family.store.row(parent_id)
    assert row is not None and row.next_run_at is not None and row.next_run_at <= now()  # the child's end woke it
    assert Worker(family, name="w", listen=False).drain() == 1
    parent = family.load(parent_id)
    assert parent.state == "closed"
    end = family.history(parent_id)[-1]
    assert end.trigger == "child_paid"
    assert end.data["child"]["result"] == {"state": "paid", "paid": 38}
    assert parent.facts["child:paying"]["result"] == {"state": "paid", "paid": 38}
    assert family.replay(parent_id).ok and family.replay(child_id).ok


def test_a_declined_child_routes_the_parent_elsewhere(family: Engine) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    family.run(parent_id)
    [child_id] = children_of(family, parent_id)
    family.fire(child_id, "decline", actor="bob")
    assert family.run(parent_id).state == "refused"


@pytest.mark.parametrize("crashed", ["after_the_intent", "after_the_child_was_made"])
def test_a_worker_that_resumes_a_start_finds_the_child_by_its_action_id(family: Engine, crashed: str) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    task = spawned_intent(family, family.load(parent_id))
    made = make_child(family, task) if crashed == "after_the_child_was_made" else None
    expire_leases(family)
    assert Worker(family, name="heir", listen=False).drain() >= 1
    [child_id] = children_of(family, parent_id)
    assert made in (None, child_id)
    assert child_id == task.visit["child"]["task_id"]
    assert family.load(parent_id).visit.get("spawned") is True
    assert family.replay(parent_id).ok


def test_workers_racing_on_one_intent_make_one_child(family: Engine) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    task = spawned_intent(family, family.load(parent_id))
    results = together(*[lambda: ChildRunner(family).step(task)] * 4)
    finished = [r for r in results if isinstance(r, TaskState)]
    assert finished and all(r is Code.CONCURRENCY_CONFLICT for r in results if not isinstance(r, TaskState))
    assert len(children_of(family, parent_id)) == 1
    assert [e.trigger for e in family.history(parent_id)] == ["start", "spawn", "spawned"]


def test_a_child_that_ends_before_the_parent_records_it_exists_still_resumes_the_parent(family: Engine) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    task = spawned_intent(family, family.load(parent_id))
    child_id = make_child(family, task)
    family.fire(child_id, "pay", {"paid": 40}, actor="bob")  # its wake-up finds the parent not waiting yet
    expire_leases(family)
    Worker(family, name="heir", listen=False).drain()
    assert family.load(parent_id).state == "closed"
    assert [e.trigger for e in family.history(parent_id)][-2:] == ["spawned", "child_paid"]


def test_a_lost_wake_up_costs_the_parent_time_not_its_end(family: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    worker = Worker(family, name="w", listen=False)
    worker.drain()  # starts the child; the parent waits, its next look put off
    [child_id] = children_of(family, parent_id)
    row = family.store.row(parent_id)
    assert row is not None and row.next_run_at is not None and row.next_run_at > now() + timedelta(minutes=1)
    monkeypatch.setattr(Engine, "_wake_parent", lambda self, parent: None)  # the process died before the wake-up
    family.fire(child_id, "pay", {"paid": 40}, actor="bob")
    assert worker.drain() == 0  # nothing is due: the parent waits for its timer
    family.store.postpone(parent_id, row.lease_epoch, now())  # its timer comes (RAILYARD_CHILD_RECHECK_SECONDS)
    assert worker.drain() == 1
    assert family.load(parent_id).state == "closed"


def test_the_deadline_of_a_child_state_expires_like_any_other(db_url: str) -> None:
    registry = Registry([child_workflows.payout(quick=False), child_workflows.claim(deadline=timedelta(seconds=1))])
    with Engine(db_url, registry) as eng:
        parent_id = eng.start("claim", ORDER, actor="ann")
        worker = Worker(eng, name="w", listen=False)
        worker.drain()
        row = eng.store.row(parent_id)
        assert row is not None and row.next_run_at is not None and row.next_run_at <= now() + timedelta(seconds=1)
        time.sleep(1.2)
        assert worker.drain() == 1
        assert eng.load(parent_id).state == "review"
        assert eng.history(parent_id)[-1].trigger == "expired"


@pytest.mark.parametrize("inline", [True, False])
def test_a_cancel_while_the_child_is_being_started_is_passed_on_to_the_child_once_it_exists(
    family: Engine, inline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent_id = family.start("claim", ORDER, actor="ann")
    task = spawned_intent(family, family.load(parent_id))
    if not inline:  # the process that recorded the cancel died before passing it on: a worker does
        monkeypatch.setattr(Engine, "_propagate_cancel", lambda self, task: task)
    during = family.cancel(parent_id, actor="olga", reason="The customer withdrew.")
    if not inline:
        assert during.state == "paying" and during.cancel_requested is not None
        expire_leases(family)
        Worker(family, name="heir", listen=False).drain()
    assert family.load(parent_id).state == "cancelled"
    assert [e.trigger for e in family.history(parent_id)][-3:] == ["cancel_requested", "spawned", "child_unrouted"]
    assert family.history(parent_id)[-1].data["child"]["state"] == "cancelled"  # the child's end, in the parent's log
    [child_id] = children_of(family, parent_id)
    assert child_id == task.visit["child"]["task_id"]
    child_events = family.history(child_id)
    assert (child_events[-1].trigger, child_events[-1].actor) == ("cancel", "system:children")
    assert parent_id in child_events[-1].data["args"]["reason"]
    assert family.replay(parent_id).ok and family.replay(child_id).ok


@pytest.mark.parametrize(("policy", "child_ends"), [("cancel", "cancelled"), ("wait", None), ("abandon", None)])
def test_cancelling_a_waiting_parent_follows_its_policy_for_the_child(
    db_url: str, policy: str, child_ends: str | None
) -> None:
    registry = Registry([child_workflows.payout(quick=False), child_workflows.claim(on_parent_end=policy)])
    with Engine(db_url, registry, authoriser=StaticRoles({"bob": set(), "olga": set()})) as eng:
        parent_id = eng.start("claim", ORDER, actor="ann")
        eng.run(parent_id)
        [child_id] = children_of(eng, parent_id)
        after = eng.cancel(parent_id, actor="olga", reason="Withdrawn.")
        child = eng.load(child_id)
        if policy == "cancel":  # the child is cancelled, and its end ends the parent in the same step
            assert (after.state, child.state) == ("cancelled", "cancelled")
        elif policy == "abandon":  # the parent ends at once; the child runs on, still naming its parent
            assert (after.state, child.state) == ("cancelled", "pending")
            assert [e.trigger for e in eng.history(parent_id)][-1] == "cancel"
        else:  # the parent's cancel waits for the child to end by itself
            assert (after.state, child.state) == ("paying", "pending") and after.cancel_requested is not None
            eng.fire(child_id, "pay", {"paid": 40}, actor="bob")
            Worker(eng, name="w", listen=False).drain()
            end = eng.history(parent_id)[-1]
            assert (eng.load(parent_id).state, end.trigger) == ("cancelled", "child_paid")
            assert end.data["child"]["result"] == {
                "state": "paid",
                "paid": 40,
            }  # the child's effect, in the parent's log
        assert eng.replay(parent_id).ok and eng.replay(child_id).ok
        del child_ends


def test_an_input_the_child_refuses_starts_nothing_and_writes_nothing(db_url: str) -> None:
    def bad_input(task: TaskState) -> dict[str, object]:
        return {"order": task.input["order"], "amount": 0}  # the child's model wants >= 1

    bad = child_workflows.claim()
    registry = Registry([child_workflows.payout(), _with_input(bad, bad_input)])
    with Engine(db_url, registry) as eng:
        parent_id = eng.start("claim", ORDER, actor="ann")
        with pytest.raises(RailyardError) as caught:
            eng.run(parent_id)
        assert caught.value.code is Code.CHILD_INPUT_INVALID
        assert [e.trigger for e in eng.history(parent_id)] == ["start"]
        assert eng.store.task_ids(workflow="payout") == []


def _with_input(definition: Workflow, builder: Callable[[TaskState], dict[str, object]]) -> Workflow:
    states: list[State] = [
        replace(s, input=builder) if isinstance(s, Child) else s for s in definition.states if s.name != "cancelled"
    ]
    return Workflow(
        name=definition.name,
        version=definition.version,
        input=definition.input,
        operator_role=definition.operator_role,
        states=states,
    )


def test_many_parents_under_two_workers_each_get_exactly_one_child(db_url: str) -> None:
    registry = Registry(child_workflows.WORKFLOWS)
    with Engine(db_url, registry) as eng:
        parents = [eng.start("claim", {"order": f"O-{i}", "amount": 5}, actor="ann") for i in range(12)]
        stop = threading.Event()
        workers = [Worker(eng, name=f"w{i}", listen=False, poll_seconds=0.05, concurrency=3) for i in range(2)]
        threads = [threading.Thread(target=w.run, args=(stop,)) for w in workers]
        for thread in threads:
            thread.start()
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and any(not eng.load(p).terminal for p in parents):
                time.sleep(0.1)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        for parent_id in parents:
            assert eng.load(parent_id).state == "closed"
            assert len(children_of(eng, parent_id)) == 1
            assert eng.replay(parent_id).ok


def test_show_and_the_api_show_the_tree_parent_children_and_their_states(family: Engine) -> None:
    from fastapi.testclient import TestClient

    from engine.api import TokenTable, create_app

    parent_id = family.start("claim", ORDER, actor="ann")
    family.run(parent_id)
    [child_id] = children_of(family, parent_id)
    view = family.get(parent_id)
    assert [(c["task_id"], c["workflow"], c["state"], c["ended"]) for c in view.children] == [
        (child_id, "payout@1", "pending", None)
    ]
    assert family.get(child_id).parent == family.history(child_id)[0].data["parent"]
    family.fire(child_id, "pay", {"paid": 40}, actor="bob")
    Worker(family, listen=False).drain()
    [child] = family.get(parent_id).children
    assert (child["state"], child["ended"]) == ("paid", {"state": "paid", "result": {"state": "paid", "paid": 40}})
    steps = [summarise(e) for e in family.history(parent_id)]
    assert steps[1].startswith(f"starting child {child_id} on payout@1")
    assert steps[-1] == f'child {child_id} ended paid, result {{"paid": 40, "state": "paid"}}'

    app = create_app(
        family, tokens=TokenTable.from_tokens({"tok-audrey": ("audrey", {"auditor"})}), session_secret="family"
    )
    with TestClient(app) as client:
        body = client.get(f"/api/tasks/{parent_id}", headers={"Authorization": "Bearer tok-audrey"}).json()
        assert [c["task_id"] for c in body["children"]] == [child_id] and body["parent"] is None
        body = client.get(f"/api/tasks/{child_id}", headers={"Authorization": "Bearer tok-audrey"}).json()
        assert body["parent"]["task_id"] == parent_id and body["children"] == []
        # The task page: the parent lists the tasks it started, each a link; the child links back to its parent.
        login = client.get("/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', login)
        assert csrf is not None
        client.post("/login", data={"user": "audrey", "token": "tok-audrey", "csrf": csrf.group(1)})
        page = client.get(f"/tasks/{parent_id}").text
        children = page[page.index('id="task-children"') :]
        assert f'href="/tasks/{child_id}"' in children and "ended paid" in children
        page = client.get(f"/tasks/{child_id}").text
        assert f'id="task-parent"><a href="/tasks/{parent_id}"' in page
