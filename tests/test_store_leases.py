"""The store contract, `Leases`: claims in due order with their fencing epoch, heartbeats, hand-backs, timers,
on every store (memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

from datetime import timedelta

from engine import ConcurrencyConflict, LeaseLost
from engine.core.canonical import now
from engine.core.errors import Code
from engine.core.rows import Claim
from engine.store import Store
from tests.support.stores import LATER, T0, Log, refusal, started


# -- leases ----------------------------------------------------------------------------------------
def test_claims_take_due_unleased_tasks_of_the_named_workflows_longest_due_first(store: Store) -> None:
    for task_id, due in (("late", T0 + timedelta(minutes=3)), ("early", T0), ("middle", T0 + timedelta(minutes=1))):
        started(store, task_id, next_run_at=due)
    started(store, "future", next_run_at=LATER)
    started(store, "parked", next_run_at=None)
    ended = started(store, "ended", next_run_at=T0)
    store.append("ended", 1, ended.take(1), status="terminal", next_run_at=T0)
    other = Log("triage-1", workflow="triage")
    store.create(other.row(next_run_at=T0 + timedelta(seconds=30)), other.first)

    at = T0 + timedelta(minutes=5)
    claims = store.claim("w1", limit=2, lease_seconds=30, workflows=["refund"], at=at)
    assert sorted(claims, key=lambda c: c.due_at) == [
        Claim("early", 1, T0),
        Claim("middle", 1, T0 + timedelta(minutes=1)),
    ]
    # Leased until at + 30 s: nobody else gets them, the next claim takes what is left.
    assert store.claim("w2", limit=10, lease_seconds=30, workflows=["refund"], at=at) == [
        Claim("late", 1, T0 + timedelta(minutes=3))
    ]
    assert store.claim("w2", limit=10, lease_seconds=30, at=at) == [Claim("triage-1", 1, T0 + timedelta(seconds=30))]
    row = store.row("early")
    assert row is not None and (row.lease_owner, row.lease_expires_at, row.lease_epoch) == (
        "w1",
        at + timedelta(seconds=30),
        1,
    )
    # Once the lease expires the task is claimable again, under a new epoch.
    assert [c.task_id for c in store.claim("w3", limit=1, lease_seconds=30, at=at + timedelta(seconds=31))] == ["early"]
    row = store.row("early")
    assert row is not None and (row.lease_owner, row.lease_epoch) == ("w3", 2)


def test_an_append_under_a_lease_that_was_taken_over_is_lease_lost(store: Store) -> None:
    log = started(store, "t-1", next_run_at=T0)
    [first] = store.claim("w1", limit=1, lease_seconds=10, at=T0)
    store.append("t-1", 1, log.take(1), status="runnable", next_run_at=T0, lease_epoch=first.epoch)
    [second] = store.claim("w2", limit=1, lease_seconds=10, at=T0 + timedelta(seconds=11))  # w1's lease expired
    assert second.epoch == first.epoch + 1
    lost = refusal(lambda: store.append("t-1", 2, [log.next()], status="runnable", lease_epoch=first.epoch))
    assert type(lost) is LeaseLost
    assert (lost.code, lost.expected, lost.actual, lost.details["epoch"], lost.details["current_epoch"]) == (
        Code.LEASE_LOST,
        2,
        2,
        first.epoch,
        second.epoch,
    )
    log.forget(1)
    # At a stale seq as well, the seq is what the writer is told about.
    stale = refusal(lambda: store.append("t-1", 1, [Log("t-1").next()], status="runnable", lease_epoch=first.epoch))
    assert type(stale) is ConcurrencyConflict and stale.actual == 2
    store.append("t-1", 2, [log.next()], status="runnable", lease_epoch=second.epoch)
    assert store.events("t-1") == log.events


def test_a_task_that_ends_drops_its_lease_and_its_failed_steps_in_the_same_write(store: Store) -> None:
    """The worker sends no release after an ending append (one round trip a task fewer): the row must already be
    what a release would have left, lease free and the count of failed steps cleared."""
    log = started(store, "t-1", next_run_at=T0)
    [claim] = store.claim("w1", limit=1, lease_seconds=600, at=T0)
    assert store.postpone("t-1", claim.epoch, T0, failed=True) == 1
    store.append("t-1", 1, log.take(1), status="terminal", lease_epoch=claim.epoch)
    row = store.row("t-1")
    assert row is not None
    assert (row.status, row.lease_owner, row.lease_expires_at, row.lease_epoch, row.next_run_at, row.failures) == (
        "terminal",
        None,
        None,
        claim.epoch,
        None,
        0,
    )


def test_a_heartbeat_extends_only_the_leases_its_worker_still_holds(store: Store) -> None:
    for task_id in ("a", "b", "c"):
        started(store, task_id, next_run_at=T0)
    store.claim("w1", limit=2, lease_seconds=10, at=T0)  # a and b (equal due times: either two)
    held = sorted(r.task_id for r in (store.row(t) for t in "abc") if r is not None and r.lease_owner == "w1")
    store.claim("w2", limit=1, lease_seconds=10, at=T0)
    before = now()
    assert store.heartbeat("w1", ["a", "b", "c", "nobody"], lease_seconds=120) == frozenset(held)
    assert store.heartbeat("w1", [], lease_seconds=120) == frozenset()
    for task_id in "abc":
        row = store.row(task_id)
        assert row is not None and row.lease_expires_at is not None
        if task_id in held:
            assert row.lease_expires_at >= before + timedelta(seconds=119)
        else:
            assert (row.lease_owner, row.lease_expires_at) == ("w2", T0 + timedelta(seconds=10))


def test_a_release_frees_the_lease_only_at_its_epoch_and_keeps_the_epoch(store: Store) -> None:
    log = started(store, "t-1", next_run_at=T0)
    [claim] = store.claim("w1", limit=1, lease_seconds=600, at=now())
    assert store.postpone("t-1", claim.epoch, T0, failed=True) == 1
    store.release("t-1", claim.epoch - 1)  # not ours: nothing happens
    row = store.row("t-1")
    assert row is not None and row.lease_owner == "w1"
    store.release("t-1", claim.epoch, step_succeeded=False)
    row = store.row("t-1")
    assert row is not None
    assert (row.lease_owner, row.lease_expires_at, row.lease_epoch, row.failures) == (None, None, claim.epoch, 1)
    # Free at once, not after the lease's 600 s; due from its release (`handed_back`).
    [again] = store.claim("w2", limit=1, lease_seconds=600, at=now() + timedelta(seconds=1))
    assert again.epoch == claim.epoch + 1
    store.release("t-1", again.epoch)  # a step that went through clears the failures
    row = store.row("t-1")
    assert row is not None and row.failures == 0
    lost = refusal(lambda: store.append("t-1", 1, log.take(1), status="runnable", lease_epoch=claim.epoch))
    assert type(lost) is LeaseLost


def test_postpone_moves_the_next_look_and_counts_failures_only_at_its_epoch(store: Store) -> None:
    started(store, "t-1", next_run_at=T0)
    [claim] = store.claim("w1", limit=1, lease_seconds=1, at=T0)
    assert store.postpone("t-1", claim.epoch, LATER) == 0
    assert store.postpone("t-1", claim.epoch, LATER, failed=True) == 1
    assert store.postpone("t-1", claim.epoch, LATER, failed=True) == 2
    assert store.postpone("t-1", claim.epoch + 1, T0, failed=True) == 2  # another epoch: unchanged, still told
    row = store.row("t-1")
    assert row is not None and (row.next_run_at, row.failures) == (LATER, 2)
    assert store.claim("w2", limit=1, lease_seconds=1, at=LATER - timedelta(seconds=1)) == []
    assert [c.task_id for c in store.claim("w2", limit=1, lease_seconds=1, at=LATER)] == ["t-1"]
    assert store.postpone("nobody", 1, LATER, failed=True) == 0


def test_a_wake_makes_a_task_blocked_in_the_named_state_due_and_leaves_every_other_task_alone(store: Store) -> None:
    waiting = started(store, "parent", status="blocked", next_run_at=LATER)
    started(store, "elsewhere", status="blocked", next_run_at=None)
    started(store, "due-sooner", status="blocked", next_run_at=T0 - timedelta(hours=1))
    started(store, "runnable", next_run_at=LATER)
    assert store.wake("parent", waiting.state, T0) is True
    assert store.wake("elsewhere", "another_state", T0) is False
    assert store.wake("due-sooner", waiting.state, T0) is True
    assert store.wake("runnable", waiting.state, T0) is False
    assert store.wake("nobody", waiting.state, T0) is False
    due = {
        task_id: row.next_run_at
        for task_id in ("parent", "elsewhere", "due-sooner", "runnable")
        if (row := store.row(task_id))
    }
    assert due == {
        "parent": T0,
        "elsewhere": None,
        "due-sooner": T0 - timedelta(hours=1),  # a wake never puts a task off
        "runnable": LATER,
    }


def test_a_task_handed_back_while_due_goes_behind_the_tasks_that_became_due_meanwhile(store: Store) -> None:
    """A task keeps its first due time while it moves under its lease (`still_due`); given back still due, it is
    due from then, so the tasks that became due while it ran are claimed first. One put off keeps its time."""
    log = started(store, "long", next_run_at=T0)
    [claim] = store.claim("w1", limit=1, lease_seconds=60, at=T0)
    for seq in range(1, 4):
        store.append("long", seq, log.take(1), status="runnable", next_run_at=now(), lease_epoch=claim.epoch)
    row = store.row("long")
    assert row is not None and row.next_run_at == T0
    started(store, "new", next_run_at=T0 + timedelta(minutes=1))
    before = now()
    store.release("long", claim.epoch)
    row = store.row("long")
    assert row is not None and row.next_run_at is not None and row.next_run_at >= before
    [first] = store.claim("w2", limit=1, lease_seconds=60, at=now() + timedelta(seconds=1))
    assert first.task_id == "new"
    started(store, "put-off", next_run_at=T0)
    [held] = store.claim("w3", limit=1, lease_seconds=60, at=T0)  # `long` is due only from its release now
    assert held.task_id == "put-off"
    later = now() + timedelta(hours=1)
    store.postpone("put-off", held.epoch, later)
    store.release("put-off", held.epoch)
    row = store.row("put-off")
    assert row is not None and row.next_run_at == later
