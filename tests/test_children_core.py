"""Child states in the pure core: the definition's checks, the ids, the events' meaning, the routes (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine import ANYONE, Child, DefinitionError, Status, Terminal, Wait, Workflow
from engine.core.access import Caller
from engine.core.children import child_task_id, ended, intent, next_look
from engine.core.commands import settle, start, start_child
from engine.core.decide import decide
from engine.core.errors import Code, Refused
from engine.core.events import seal
from engine.core.fold import apply
from engine.core.task import TaskState
from tests.support.child_workflows import ParentInput, child_input, claim, payout

AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def started(definition: Workflow, input: dict[str, object], actor: str = "ann") -> TaskState:
    return start(definition, input, caller=Caller(actor, frozenset()), task_id="parent-1", at=AT).task


def step(
    definition: Workflow, task: TaskState, trigger: str, data: dict[str, object], payload: dict[str, str] | None = None
) -> TaskState:
    decision = decide(definition, task, trigger, payload, actor="olga", roles=frozenset({ANYONE}), system=True)
    event = seal(
        task_id=task.task_id,
        seq=task.seq + 1,
        at=AT,
        actor="system:children",
        from_state=decision.from_state,
        trigger=decision.trigger,
        to_state=decision.to_state,
        data={**decision.data, **data},  # type: ignore[typeddict-item]
        prev_hash=task.last_hash,
    )
    return apply(definition, task, event)


def test_a_child_state_that_misses_its_parts_is_refused_with_every_problem_at_once() -> None:
    with pytest.raises(DefinitionError) as caught:
        Workflow(
            name="broken",
            version=1,
            operator_role=ANYONE,
            states=[
                Child("starting", workflow="Not A Name", on={"unrouted": "done", "paid": "nowhere"}),
                Terminal("done"),
            ],
        )
    problems = "\n".join(caught.value.details["problems"])
    assert "workflow 'Not A Name' must match" in problems
    assert "no input builder" in problems
    assert "no otherwise target" in problems
    assert "route 'unrouted' must name a terminal state of the child" in problems
    assert "targets unknown state 'nowhere'" in problems


def test_a_child_state_declares_no_actions_and_its_deadline_goes_with_on_expired() -> None:
    with pytest.raises(DefinitionError) as caught:
        Workflow(
            name="broken",
            version=1,
            operator_role=ANYONE,
            states=[
                Child(
                    "starting",
                    workflow="payout",
                    input=child_input,
                    otherwise="done",
                    deadline=timedelta(hours=1),
                    actions=[],
                ),
                Terminal("done"),
            ],
        )
    assert "deadline and on_expired go together" in "\n".join(caught.value.details["problems"])


def test_the_child_id_is_the_same_for_every_worker_and_differs_per_intent() -> None:
    first = child_task_id("parent-1", "a" * 32)
    assert first == child_task_id("parent-1", "a" * 32)
    assert first != child_task_id("parent-1", "b" * 32)
    assert first != child_task_id("parent-2", "a" * 32)


@pytest.mark.parametrize("policy", ["cancel", "wait", "abandon"])
def test_the_start_is_an_open_effect_so_a_cancel_waits_for_it_and_a_held_child_for_its_end(policy: str) -> None:
    parent, child = claim(on_parent_end=policy), payout()
    state = parent.state("paying")
    assert isinstance(state, Child)
    task = started(parent, {"order": "O-1", "amount": 5})
    assert task.state == "paying" and str(task.status) == "blocked"
    data = intent(task, child, {"order": "O-1", "amount": 5}, AT, holds=state.holds_child)
    task = step(parent, task, "spawn", dict(data))
    assert task.unsettled is not None and task.unsettled["child"] == task.visit["child"]["task_id"]
    waiting = decide(parent, task, "cancel", {"reason": "withdrawn"}, actor="olga", roles=frozenset({ANYONE}))
    assert (waiting.trigger, waiting.to_state) == ("cancel_requested", "paying")
    with pytest.raises(Refused) as caught:  # there is nothing to settle: the child exists under its id or it does not
        settle(parent, task, caller=Caller("olga", frozenset({ANYONE})), outcome="executed", evidence="x", running=None)
    assert caught.value.code is Code.TRIGGER_NOT_ALLOWED
    record = task.visit["child"]
    task = step(parent, task, "spawned", {"child": {"task_id": record["task_id"], "action_id": record["action_id"]}})
    cancelled = decide(parent, task, "cancel", {"reason": "withdrawn"}, actor="olga", roles=frozenset({ANYONE}))
    if policy == "abandon":  # the parent ends at once; its child runs on
        assert task.unsettled is None and cancelled.to_state == "cancelled"
        return
    assert task.unsettled is not None and task.unsettled["status"] == "running"
    assert (cancelled.trigger, cancelled.to_state) == ("cancel_requested", "paying")
    task = step(parent, task, "cancel", {}, {"reason": "withdrawn"})  # recorded as cancel_requested
    # The child's end, recorded with the cancel waiting: the same event ends the parent in `cancelled`.
    end = decide(parent, task, "child_paid", None, actor="system:children", system=True)
    assert end.to_state == "cancelled"
    after = step(parent, task, "child_paid", {"child": {**record, "state": "paid"}})
    assert after.state == "cancelled" and after.unsettled is None and after.cancel_requested is None


def test_the_childs_end_routes_the_parent_and_its_typed_result_lands_in_the_facts() -> None:
    parent, child_def = claim(), payout()
    task = started(parent, {"order": "O-1", "amount": 5})
    task = step(parent, task, "spawn", dict(intent(task, child_def, {"order": "O-1", "amount": 5}, AT)))
    record = task.visit["child"]
    task = step(parent, task, "spawned", {"child": {"task_id": record["task_id"], "action_id": record["action_id"]}})
    link = {"task_id": task.task_id, "seq": 2, "action_id": record["action_id"], "workflow": "claim@1", "state": "x"}
    made = start_child(child_def, task, record, link, at=AT)  # type: ignore[arg-type]
    assert made.first.data["parent"]["task_id"] == "parent-1" and made.row.task_id == record["task_id"]
    assert made.first.actor == "ann"  # started by whoever started the parent: separation of duties holds down the chain
    child = made.task
    for trigger, to_state in (("pay", "paid"),):
        event = seal(
            task_id=child.task_id,
            seq=2,
            at=AT,
            actor="bob",
            from_state="pending",
            trigger=trigger,
            to_state=to_state,
            data={"args": {"paid": 4}},
            prev_hash=child.last_hash,
        )
        child = apply(child_def, child, event)
    state = parent.state("paying")
    assert isinstance(state, Child)
    trigger, data = ended(state, record, child)
    assert trigger == "child_paid"
    assert data["child"]["result"] == {"state": "paid", "paid": 4}
    assert (data["child"]["seq"], data["child"]["hash"]) == (child.seq, child.last_hash)
    after = step(parent, task, trigger, dict(data))
    assert after.state == "closed"
    assert after.facts["child:paying"] == {
        "task_id": child.task_id,
        "state": "paid",
        "result": {"state": "paid", "paid": 4},
    }


def test_an_end_the_state_does_not_name_goes_otherwise_and_an_unreadable_result_says_so() -> None:
    state = claim().state("paying")
    assert isinstance(state, Child)
    assert state.route_of("cancelled") == "child_unrouted"
    record = {"task_id": "c", "action_id": "a" * 32}
    broken = TaskState("c", "payout", 1, "d", "paid", "terminal", 2, "h", {"amount": 5})  # type: ignore[arg-type]
    unreadable = Child(
        "paying",
        workflow="payout",
        input=child_input,
        on={"paid": "closed"},
        otherwise="review",
        result=ParentInput,  # needs `order`, which the child's final state does not give
    )
    trigger, data = ended(unreadable, record, broken)  # type: ignore[arg-type]
    assert trigger == "child_unrouted"
    assert data["child"]["code"] == "CHILD_RESULT_INVALID" and data["child"]["result"] is None


def test_a_waiting_parent_is_looked_at_again_by_its_timer_and_never_after_its_deadline() -> None:
    state = claim(deadline=timedelta(seconds=30)).state("paying")
    assert isinstance(state, Child)
    task = TaskState(
        "p",
        "claim",
        1,
        "d",
        "paying",
        Status.BLOCKED,
        3,
        "h",
        {},
        visit={"spawned_at": "2026-01-05T09:00:00Z"},
    )
    assert next_look(state, task, AT, timedelta(minutes=5)) == AT + timedelta(seconds=30)
    assert next_look(state, task, AT, timedelta(seconds=10)) == AT + timedelta(seconds=10)
    never = claim().state("paying")
    assert isinstance(never, Child)
    assert next_look(never, task, AT, timedelta(minutes=5)) == AT + timedelta(minutes=5)


def test_what_a_child_state_starts_and_how_it_routes_is_in_the_digest() -> None:
    base = claim()
    assert base.digest == claim().digest
    assert base.digest != claim(deadline=timedelta(minutes=5)).digest
    other = Workflow(
        name="claim",
        version=1,
        input=ParentInput,
        operator_role=ANYONE,
        states=[
            Child("paying", workflow="payout", version=1, input=child_input, on={"paid": "closed"}, otherwise="review"),
            Wait("review", actions=[]),
            Terminal("closed"),
        ],
    )
    assert other.digest != base.digest
    assert other.status_of("paying") == "blocked"  # it holds no lease while its child runs
