"""Approval gates: role, separation of duties, one decision (on the in-memory store), and races between
deciders (on every store: which write wins is the store's concurrency)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from engine import Code, Engine, MemoryStore, RailyardError, Registry, StaticRoles, Store, TaskState
from tests.support.races import together
from tests.support.sample_workflows import ROLES, all_workflows
from tests.support.stores import BACKENDS, store_for

ORDER = {"customer": "c1", "balance": 500}
ROLES_WITH_SECOND_APPROVER = {**ROLES, "erin": {"approver"}}


def engine_on(store: Store) -> Engine:
    return Engine(store=store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES_WITH_SECOND_APPROVER))


@pytest.fixture
def eng() -> Iterator[Engine]:
    with engine_on(MemoryStore()) as engine:
        yield engine


@pytest.fixture(params=BACKENDS)
def raced(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on each store, for commands fired at the same instant."""
    with store_for(request, tmp_path) as store, engine_on(store) as engine:
        yield engine


def awaiting(eng: Engine, starter: str = "ann") -> str:
    task_id = eng.start("refund", ORDER, actor=starter, version=1)
    eng.fire(task_id, "propose", {"amount": 300, "reason": "damaged"}, actor="model")
    assert eng.get(task_id).state == "awaiting_approval"
    return task_id


def refused(call: Callable[[], object]) -> Code:
    with pytest.raises(RailyardError) as caught:
        call()
    return caught.value.code


def decisions(eng: Engine, task_id: str) -> list[str]:
    return [e.trigger for e in eng.history(task_id) if "approval" in e.data]


def test_an_approver_with_the_role_approves_and_the_event_says_who_and_what(eng: Engine) -> None:
    task_id = awaiting(eng)
    task = eng.approve(task_id, actor="dana", prepared_digest=None, comment="receipt checked")
    assert task.state == "executing"
    record = eng.history(task_id)[-1].data["approval"]
    assert record == {
        "actor": "dana",
        "role": "approver",
        "decision": "approve",
        "comment": "receipt checked",
        "digest": None,
    }
    assert eng.history(task_id)[-1].actor == "dana"


def test_refusals_each_with_their_code_and_the_log_unchanged(eng: Engine) -> None:
    task_id = awaiting(eng)
    before = len(eng.history(task_id))
    assert refused(lambda: eng.approve(task_id, actor="bob", prepared_digest=None)) is Code.APPROVAL_FORBIDDEN
    assert refused(lambda: eng.approve(task_id, actor="ann", prepared_digest=None)) is Code.APPROVAL_FORBIDDEN
    assert refused(lambda: eng.approve(task_id, actor="", prepared_digest=None)) is Code.ACTOR_REQUIRED
    assert len(eng.history(task_id)) == before
    eng.approve(task_id, actor="dana", prepared_digest=None)
    assert refused(lambda: eng.approve(task_id, actor="erin", prepared_digest=None)) is Code.TASK_NOT_AWAITING_APPROVAL
    assert decisions(eng, task_id) == ["approve"]


def test_the_starter_may_not_approve_their_own_task(eng: Engine) -> None:
    task_id = awaiting(eng, starter="dana")
    assert refused(lambda: eng.approve(task_id, actor="dana", prepared_digest=None)) is Code.APPROVAL_FORBIDDEN
    # Rejecting your own request is not a conflict of interest.
    assert eng.reject(task_id, actor="dana", reason="withdrawn").state == "rejected"


def test_a_cancelled_task_cannot_be_approved(eng: Engine) -> None:
    task_id = awaiting(eng)
    eng.cancel(task_id, actor="ann", reason="customer withdrew")
    assert refused(lambda: eng.approve(task_id, actor="dana", prepared_digest=None)) is Code.TASK_NOT_AWAITING_APPROVAL
    assert decisions(eng, task_id) == []


def test_a_task_not_at_an_approval_gate_is_refused(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    assert refused(lambda: eng.approve(task_id, actor="dana", prepared_digest=None)) is Code.TASK_NOT_AWAITING_APPROVAL
    assert refused(lambda: eng.approve("no-such-task", actor="dana", prepared_digest=None)) is Code.TASK_NOT_FOUND


def test_two_approvers_at_once_record_exactly_one_decision(raced: Engine) -> None:
    for _ in range(5):
        task_id = awaiting(raced)
        results = together(
            partial(raced.approve, task_id, actor="dana", prepared_digest=None),
            partial(raced.reject, task_id, actor="erin", reason="no"),
        )
        # The loser read the task before the winner wrote (refused, CONCURRENCY_CONFLICT) or after it (no
        # longer awaiting approval): never retried into a decision on a state its decider did not see.
        losers = [r for r in results if r in (Code.CONCURRENCY_CONFLICT, Code.TASK_NOT_AWAITING_APPROVAL)]
        assert len(losers) == 1
        assert len(decisions(raced, task_id)) == 1


def test_an_approval_racing_a_cancel_leaves_one_consistent_story(raced: Engine) -> None:
    for _ in range(5):
        task_id = awaiting(raced)
        approved, cancelled = together(
            partial(raced.approve, task_id, actor="dana", prepared_digest=None),
            partial(raced.cancel, task_id, actor="ann", reason="stop"),
        )
        triggers = [e.trigger for e in raced.history(task_id)][2:]
        # Each command succeeded on the state it read, or was refused: what it told its caller is what the log
        # holds. Both succeed only when the cancel read the task after the approval (a later command).
        assert (approved not in (Code.CONCURRENCY_CONFLICT, Code.TASK_NOT_AWAITING_APPROVAL)) == ("approve" in triggers)
        assert (cancelled is not Code.CONCURRENCY_CONFLICT) == ("cancel" in triggers)
        assert triggers in (["approve"], ["cancel"], ["approve", "cancel"])


def test_the_inbox_lists_tasks_at_approval_gates_oldest_first_and_loads_no_other_task(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = awaiting(eng), awaiting(eng)
    parked = awaiting(eng)
    eng.transition(eng.load(parked), "expired", actor="system:timer", system=True)  # now waiting in needs_human
    assert eng.get(parked).state == "needs_human"
    escalated = eng.start("triage", {"ticket_id": "T-1"}, actor="ann")
    eng.fire(escalated, "decide", {"ticket_id": "T-1", "decision": "ESCALATE", "reason": "angry"}, actor="model")
    assert eng.get(escalated).state == "escalation_review"

    loaded: list[str] = []
    load = eng.load

    def counted(task_id: str) -> TaskState:
        loaded.append(task_id)
        return load(task_id)

    monkeypatch.setattr(eng, "load", counted)
    assert [p["task_id"] for p in eng.approvals()] == [first, second, escalated]
    assert [p["state"] for p in eng.approvals(role="approver")] == ["awaiting_approval"] * 2 + ["escalation_review"]
    assert eng.approvals(role="operator") == []
    assert parked not in loaded  # blocked elsewhere: never loaded to find out


def test_a_digest_prefix_names_the_call_only_when_it_is_long_enough_and_unique() -> None:
    from engine.core.approvals import DIGEST_PREFIX, full_digest

    current, earlier = "ab" * 32, "ab" * 6 + "cd" * 26
    assert full_digest(current[:DIGEST_PREFIX], current) == current
    assert full_digest(current, current, {earlier}) == current
    assert full_digest("0" * DIGEST_PREFIX, current) == "0" * DIGEST_PREFIX  # not the call: check_decision says stale
    assert full_digest(None, current) is None
    for named, code in ((current[: DIGEST_PREFIX - 1], Code.DIGEST_TOO_SHORT), (current[:4], Code.DIGEST_TOO_SHORT)):
        with pytest.raises(RailyardError) as caught:
            full_digest(named, current)
        assert caught.value.code is code
    both = "ab" * 6  # 12 characters that begin both digests
    assert earlier.startswith(both) and current.startswith(both)
    with pytest.raises(RailyardError) as caught:
        full_digest(both, current, {earlier, current})
    assert caught.value.code is Code.DIGEST_AMBIGUOUS
    assert full_digest("ab" * 7, current, {earlier, current}) == current  # one more character: unique again
