"""The store contract, `BackOffice`: lists and counts, the work queue and its claims, people, database tokens
and the access trail, on every store (memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pytest

from engine.core.canonical import now
from engine.core.errors import Code
from engine.core.rows import WorkerReport
from engine.store import Store
from engine.store.protocol import PageSession, QueueQuery, TaskQuery, WorkClaim
from tests.support.races import together
from tests.support.stores import LATER, T0, Log, ended, started


# -- lists and counts ------------------------------------------------------------------------------
def test_lists_of_tasks_for_the_back_office(store: Store) -> None:
    for task_id in ("t-2", "t-1", "t-3"):
        started(store, task_id, status="blocked")
    triage = Log("t-0", workflow="triage", state="review")
    store.create(triage.row(status="blocked"), triage.first)
    t3 = Log("t-3")
    t3.events = store.events("t-3")
    store.append("t-3", 1, [t3.next("escalate", "review")], status="runnable")
    assert store.task_ids() == ["t-0", "t-1", "t-2", "t-3"]  # created at the same instant: by id
    assert store.task_ids(workflow="refund", status="blocked") == ["t-1", "t-2"]
    assert store.blocked_in([("refund", 1, "drafting"), ("triage", 1, "review"), ("refund", 1, "review")]) == [
        "t-0",
        "t-1",
        "t-2",
    ]
    assert store.blocked_in([]) == []
    assert [r.task_id for r in store.recent()] == ["t-3", "t-0", "t-1", "t-2"]  # t-3 changed last
    assert [r.task_id for r in store.recent(workflow="refund", status="blocked", limit=1)] == ["t-1"]
    assert [r.task_id for r in store.recent(state="review")] == ["t-3", "t-0"]
    assert store.recent(workflow="refund")[0] == store.row("t-3")


def test_task_ids_starting_with_a_prefix_are_at_most_two_in_id_order_and_the_prefix_is_literal(store: Store) -> None:
    for task_id in ("b3678ff0-2", "b3678ff0-1", "b3678ff1-0", "a%b_c-0", "a1b1c-0"):
        started(store, task_id)
    assert store.task_ids_starting("b3678ff0") == ["b3678ff0-1", "b3678ff0-2"]
    assert store.task_ids_starting("b3678ff") == ["b3678ff0-1", "b3678ff0-2"]  # two at most
    assert store.task_ids_starting("b3678ff", limit=3) == ["b3678ff0-1", "b3678ff0-2", "b3678ff1-0"]
    assert store.task_ids_starting("b3678ff1") == ["b3678ff1-0"]
    assert store.task_ids_starting("b3678ff0-1") == ["b3678ff0-1"]  # a whole id is its own prefix
    assert store.task_ids_starting("c") == []
    assert store.task_ids_starting("a%b") == ["a%b_c-0"]  # `%` and `_` are characters, not patterns
    assert store.task_ids_starting("a_b") == [] and store.task_ids_starting("a%") == ["a%b_c-0"]
    assert store.task_ids_starting("B3678FF0") == []  # ids are compared as written


def test_a_task_id_typed_short_resolves_to_the_one_task_it_starts_or_is_ambiguous(store: Store) -> None:
    from engine import Refused
    from engine.runtime.task_ids import resolve_task_id

    for task_id in ("abcdefgh-1", "abcdefgh-12", "abcdefgh-2", "c0ffee00-1"):
        started(store, task_id)
    assert resolve_task_id(store, "c0ffee00") == "c0ffee00-1"
    assert resolve_task_id(store, "abcdefgh-1") == "abcdefgh-1"  # a whole id, though it starts another one
    assert resolve_task_id(store, "abcdefgh-2") == "abcdefgh-2"
    with pytest.raises(Refused) as refused:
        resolve_task_id(store, "abcdefgh")
    assert refused.value.code is Code.TASK_ID_AMBIGUOUS and refused.value.details["matches"] == [
        "abcdefgh-1",
        "abcdefgh-12",
    ]
    assert resolve_task_id(store, "c0ffee0") == "c0ffee0"  # 7 characters: as typed (the caller's TASK_NOT_FOUND)
    assert resolve_task_id(store, "ffffffff") == "ffffffff"  # none starts so: as typed


def listed(store: Store, **query: Any) -> list[str]:
    return [t.row.task_id for t in store.list_tasks(TaskQuery(**query))]


def test_task_lists_page_newest_first_with_no_task_twice_and_none_left_out(store: Store) -> None:
    # Four tasks share each creation instant: the id breaks the tie, so the order is total and pages are stable.
    ids = [f"t-{n:02d}" for n in range(22)]
    for n, task_id in enumerate(ids):
        log = Log(task_id)
        store.create(replace(log.row(), created_at=T0 + timedelta(seconds=n // 4)), log.first)
    newest_first = sorted(ids, key=lambda i: (int(i[2:]) // 4, i), reverse=True)
    seen: list[str] = []
    after: str | None = None
    while True:
        page = listed(store, after=after, limit=5)
        seen += page
        if len(page) < 5:
            break
        after = page[-1]
        new = Log(f"u-{len(seen)}")  # a task created meanwhile, newer than all: it shifts no page
        store.create(replace(new.row(), created_at=T0 + timedelta(hours=1)), new.first)
    assert seen == newest_first
    assert listed(store, limit=5) == [*sorted((f"u-{n}" for n in (5, 10, 15, 20)), reverse=True), "t-21"]
    assert listed(store, after=newest_first[-2]) == [newest_first[-1]]
    assert listed(store, limit=0) == []


def test_task_lists_filter_by_workflow_state_status_starter_and_time_and_search_ids_and_fields(
    store: Store,
) -> None:
    def make(task_id: str, *, seconds: int, workflow: str = "refund", status: str = "runnable", by: str = "ann",
             fields: dict[str, str] | None = None) -> None:  # fmt: skip
        log = Log(task_id, workflow=workflow)
        first = replace(log.first, actor=by)
        store.create(replace(log.row(status=status), created_at=T0 + timedelta(seconds=seconds)), first, fields)

    make("a1b2-0001", seconds=0, fields={"customer_id": "C-100", "order_id": "O-1"})
    make("a1b2-0002", seconds=1, status="blocked", by="bob", fields={"customer_id": "C-200"})
    make("c3d4-0003", seconds=2, workflow="triage", fields={"ticket_id": "C-100"})
    make("c3d4-0004", seconds=3, by="bob")
    assert listed(store) == ["c3d4-0004", "c3d4-0003", "a1b2-0002", "a1b2-0001"]
    assert listed(store, workflow="triage") == ["c3d4-0003"]
    assert listed(store, status="blocked") == ["a1b2-0002"]
    assert listed(store, started_by="bob") == ["c3d4-0004", "a1b2-0002"]
    assert listed(store, states=["drafting"]) == listed(store) and listed(store, states=["review"]) == []
    assert listed(store, created_from=T0 + timedelta(seconds=1), created_before=T0 + timedelta(seconds=3)) == [
        "c3d4-0003",
        "a1b2-0002",
    ]
    assert listed(store, id_prefix="a1b2") == ["a1b2-0002", "a1b2-0001"]
    assert listed(store, id_prefix="a1b2-0001") == ["a1b2-0001"] and listed(store, id_prefix="ffff") == []
    assert listed(store, field_value="C-100") == ["c3d4-0003", "a1b2-0001"]  # any searchable field
    assert listed(store, field_value="C-1") == []  # values match whole
    assert listed(store, id_prefix="c3d4", field_value="C-200") == ["c3d4-0004", "c3d4-0003", "a1b2-0002"]
    assert listed(store, field_value="C-100", workflow="refund", started_by="ann") == ["a1b2-0001"]
    [shown] = store.list_tasks(TaskQuery(id_prefix="a1b2-0001"))
    assert (shown.started_by, shown.fields) == ("ann", {"customer_id": "C-100", "order_id": "O-1"})
    assert shown.row == store.row("a1b2-0001")
    assert store.list_tasks(TaskQuery(id_prefix="c3d4-0004"))[0].fields == {}


def test_blocked_tasks_page_oldest_first_after_a_task(store: Store) -> None:
    for n in range(7):
        log = Log(f"b-{n}")
        store.create(replace(log.row(status="blocked"), created_at=T0 + timedelta(seconds=7 - n)), log.first)
    states = [("refund", 1, "drafting")]
    oldest_first = [f"b-{n}" for n in range(6, -1, -1)]
    assert store.blocked_in(states) == oldest_first
    assert store.blocked_in(states, limit=3) == oldest_first[:3]
    assert store.blocked_in(states, after=oldest_first[2], limit=3) == oldest_first[3:6]
    assert store.blocked_in(states, after=oldest_first[-1]) == []


def test_blocked_tasks_page_nearest_deadline_first_then_oldest(store: Store) -> None:
    # b-0 and b-1 have no deadline (oldest first, after the rest); b-2..b-5 are due at 40, 10, 10, 20 s.
    due = {"b-2": 40, "b-3": 10, "b-4": 10, "b-5": 20}
    for n in range(6):
        log = Log(f"b-{n}")
        at = T0 + timedelta(seconds=n)
        seconds = due.get(f"b-{n}")
        deadline = T0 + timedelta(seconds=seconds) if seconds is not None else None
        store.create(replace(log.row(status="blocked"), created_at=at, updated_at=at, next_run_at=deadline), log.first)
    states = [("refund", 1, "drafting")]
    order = ["b-3", "b-4", "b-5", "b-2", "b-0", "b-1"]
    # Waiting since before T0 + 2.5 s: b-0, b-1, b-2 (their last event is that old), in either order.
    assert store.blocked_in(states, waiting_before=T0 + timedelta(seconds=2.5)) == ["b-0", "b-1", "b-2"]
    assert store.blocked_in(states, by_deadline=True, waiting_before=T0 + timedelta(seconds=2.5)) == [
        "b-2",
        "b-0",
        "b-1",
    ]
    assert store.blocked_in(states, by_deadline=True) == order
    pages, after = [], None
    while True:
        page = store.blocked_in(states, by_deadline=True, after=after, limit=2)
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert pages == [order[0:2], order[2:4], order[4:6]]
    assert store.blocked_in(states) == [f"b-{n}" for n in range(6)]  # the default order is untouched


# -- the work queue: pages in any order, counts by aggregate, claims -------------------------------
def _queue(store: Store) -> None:
    """Six blocked refunds and two blocked triage tasks (q-0 .. q-7), created a second apart, q-5 waiting
    longest; deadlines on q-1 (40 s), q-2 and q-3 (10 s); q-6 and q-7 of tenant `acme`; q-4 found by C-9."""
    due = {1: 40, 2: 10, 3: 10}
    for n in range(8):
        log = Log(f"q-{n}", workflow="triage" if n >= 6 else "refund", state="review" if n % 2 else "approve")
        at = T0 + timedelta(seconds=n)
        deadline = T0 + timedelta(seconds=due[n]) if n in due else None
        waited = T0 - timedelta(hours=1) if n == 5 else at
        row = replace(log.row(status="blocked"), created_at=at, updated_at=waited, next_run_at=deadline)
        store.create(replace(row, tenant="acme") if n >= 6 else row, log.first, {"customer_id": f"C-{n + 5}"})
    ended(store, "q-ended")  # not blocked: never listed or counted


PLACES = [("refund", 1, "approve"), ("refund", 1, "review"), ("triage", 1, "approve"), ("triage", 1, "review")]


def queued(store: Store, **asked: Any) -> list[str]:
    return [t.row.task_id for t in store.queue_page(QueueQuery(PLACES, **asked))]


def test_the_queue_counts_the_database_keeps_follow_every_move_into_out_of_and_between_places(store: Store) -> None:
    """The counts kept per place and tenant (migration 0016) equal a count of the tasks themselves (the GROUP BY a
    search uses: `waiting_before` far ahead selects every task) after each of 80 random moves of 24 tasks: into a
    blocked state, between blocked states, out to runnable, to an end, with and without a tenant."""
    rng = random.Random(16)
    places = [("approve", "blocked"), ("review", "blocked"), ("working", "runnable"), ("done", "terminal")]
    logs: dict[str, Log] = {}
    for n in range(24):
        log = logs[f"k-{n}"] = Log(f"k-{n}", workflow="triage" if n % 3 == 0 else "refund", state="approve")
        row = log.row(status="blocked")
        store.create(replace(row, tenant="acme") if n % 4 == 0 else row, log.first)
    ended_ids: set[str] = set()

    def counted(**asked: Any) -> tuple[dict[tuple[str, int, str], int], dict[tuple[str, int, str], int]]:
        kept = store.queue_counts(QueueQuery(PLACES, **asked))
        scanned = store.queue_counts(QueueQuery(PLACES, waiting_before=now() + timedelta(days=3650), **asked))
        return kept, scanned

    for step in range(80):
        task_id = rng.choice(sorted(set(logs) - ended_ids))
        log = logs[task_id]
        [(state, status)] = rng.choices(places, weights=[4, 4, 4, 1])
        store.append(task_id, log.seq, [log.next("move", state)], status=status)
        if status == "terminal":
            ended_ids.add(task_id)
        choices: list[dict[str, Any]] = [{}, {"tenants": ["acme"]}, {"tenants": []}]
        for asked in choices:
            kept, scanned = counted(**asked)
            assert kept == scanned, (step, asked)
    blocked = [t for t, log in logs.items() if log.state in ("approve", "review")]
    assert sum(counted()[0].values()) == len(blocked) > 0


def test_the_work_queue_pages_in_every_order_without_repeats_and_counts_by_place(store: Store) -> None:
    _queue(store)
    assert queued(store) == ["q-2", "q-3", "q-1", "q-0", "q-4", "q-5", "q-6", "q-7"]  # nearest deadline first
    assert queued(store, sort="created", descending=True) == [f"q-{n}" for n in range(7, -1, -1)]
    assert queued(store, sort="waiting")[0] == "q-5"
    assert queued(store, sort="workflow", descending=True)[:2] == ["q-7", "q-6"]
    assert queued(store, sort="state") == ["q-0", "q-2", "q-4", "q-6", "q-1", "q-3", "q-5", "q-7"]
    for sort in ("deadline", "waiting", "created", "workflow", "state"):
        for descending in (False, True):
            whole = queued(store, sort=sort, descending=descending)
            pages, after = [], None
            while page := queued(store, sort=sort, descending=descending, after=after, limit=3):
                pages.append(page)
                after = page[-1]
            assert [t for p in pages for t in p] == whole and len(pages) == 3, (sort, descending)
    assert [t.row.task_id for t in store.queue_page(QueueQuery(PLACES[:1]))] == ["q-2", "q-0", "q-4"]
    assert queued(store, tenants=["acme"]) == ["q-6", "q-7"]
    assert queued(store, field_value="C-9") == ["q-4"] and queued(store, id_prefix="q-7") == ["q-7"]
    assert queued(store, waiting_before=T0) == ["q-5"]
    assert store.queue_counts(QueueQuery(PLACES)) == {
        ("refund", 1, "approve"): 3,
        ("refund", 1, "review"): 3,
        ("triage", 1, "approve"): 1,
        ("triage", 1, "review"): 1,
    }
    assert store.queue_counts(QueueQuery(PLACES, tenants=["acme"], id_prefix="q-6")) == {("triage", 1, "approve"): 1}
    assert store.queue_counts(QueueQuery([])) == {} and store.queue_page(QueueQuery([])) == []
    [row] = store.queue_page(QueueQuery(PLACES, id_prefix="q-4"))
    assert (row.started_by, row.fields, row.claim) == ("ann", {"customer_id": "C-9"}, None)
    assert row.head is not None and row.head == store.events("q-4")[-1]


def test_the_next_page_after_a_cursor_task_that_was_acted_on_still_holds_what_followed_it(store: Store) -> None:
    """A person acts on the last row of a page (longest waiting last), then asks for the next page: that task is no
    longer blocked, so its indexed copies (`place`, `waiting_since`) are NULL; the cursor is read from its row."""
    _queue(store)
    assert queued(store, sort="waiting", descending=True, limit=3) == ["q-7", "q-6", "q-4"]
    acted = Log("q-4", state="approve")
    store.append("q-4", 1, [acted.next("approve", "working")], status="runnable")
    page = queued(store, sort="waiting", descending=True, after="q-4", limit=3)
    assert "q-3" in page and "q-4" not in page, page


def test_a_claim_is_one_persons_until_it_expires_the_task_moves_or_someone_takes_it_over(store: Store) -> None:
    _queue(store)
    until = T0 + timedelta(minutes=30)
    assert store.claim_work("q-0", "dana", at=T0, until=until) == WorkClaim("q-0", "dana", 1, T0, until)
    # erin is answered with dana's claim, and nothing changes; dana claiming again renews hers.
    lost = store.claim_work("q-0", "erin", at=T0 + timedelta(minutes=1), until=until)
    assert lost is not None and lost.actor == "dana"
    [shown] = store.queue_page(QueueQuery(PLACES, id_prefix="q-0", at=T0 + timedelta(minutes=2)))
    assert shown.claim == WorkClaim("q-0", "dana", 1, T0, until)
    # A take-over names its reason and whom it was taken from.
    taken = store.claim_work("q-0", "erin", at=T0 + timedelta(minutes=3), until=until, take_over="dana is out")
    assert taken == WorkClaim("q-0", "erin", 1, T0 + timedelta(minutes=3), until, "dana", "dana is out")
    assert not store.release_work("q-0", "dana") and store.release_work("q-0", "erin")
    assert store.queue_page(QueueQuery(PLACES, id_prefix="q-0", at=T0))[0].claim is None
    # Expired: anyone may claim it; not shown either.
    store.claim_work("q-1", "dana", at=T0, until=T0 + timedelta(minutes=1))
    assert store.queue_page(QueueQuery(PLACES, id_prefix="q-1", at=T0 + timedelta(minutes=2)))[0].claim is None
    taken = store.claim_work("q-1", "erin", at=T0 + timedelta(minutes=2), until=until)
    assert taken is not None and taken.actor == "erin"
    # The task moved (a decision): the claim is over.
    log = Log("q-moves", state="approve")
    store.create(log.row(status="blocked"), log.first)
    store.claim_work("q-moves", "dana", at=T0, until=until)
    store.append("q-moves", 1, [log.next("wait", "approve")], status="blocked")
    assert store.queue_page(QueueQuery(PLACES, id_prefix="q-moves", at=T0))[0].claim is None
    assert store.claim_work("q-moves", "erin", at=T0, until=until) == WorkClaim("q-moves", "erin", 2, T0, until)
    assert store.claim_work("nobody", "dana", at=T0, until=until) is None


def test_a_claim_is_carried_over_a_note_and_left_where_it_was_otherwise(store: Store) -> None:
    """`carry_claim`: a note (a remark) moves the task's seq on without ending whoever is on it; the claim moves
    to the new seq with it, and a carry from a seq the claim is not at changes nothing."""
    until = T0 + timedelta(minutes=30)
    log = Log("c-1", state="approve")
    store.create(log.row(status="blocked"), log.first)
    store.claim_work("c-1", "dana", at=T0, until=until)
    store.append("c-1", 1, [log.next("comment", "approve", text="checking the photo")], status="blocked")
    store.carry_claim("c-1", 1, 2)

    def shown() -> WorkClaim | None:
        return store.queue_page(QueueQuery(PLACES, id_prefix="c-1", at=T0))[0].claim

    assert shown() == WorkClaim("c-1", "dana", 2, T0, until)
    held = store.claim_work("c-1", "erin", at=T0 + timedelta(minutes=1), until=until)
    assert held is not None and held.actor == "dana"  # erin is told who is on it
    store.carry_claim("c-1", 1, 3)  # not where the claim is: left as it is
    assert shown() == WorkClaim("c-1", "dana", 2, T0, until)
    store.append("c-1", 2, [log.next("wait", "approve")], status="blocked")  # a step, not a remark
    store.carry_claim("c-1", 1, 3)
    assert shown() is None


def test_of_two_people_claiming_one_item_at_once_one_wins_and_both_are_told_who(store: Store) -> None:
    _queue(store)
    until = T0 + timedelta(minutes=30)
    for n in range(8):

        def claimer(actor: str, task_id: str = f"q-{n}") -> Callable[[], WorkClaim | None]:
            return lambda: store.claim_work(task_id, actor, at=T0, until=until)

        results = together(claimer("dana"), claimer("erin"))
        holders = {r.actor for r in results if isinstance(r, WorkClaim)}
        assert len(holders) == 1, results  # both answers name the one who won
        [row] = store.queue_page(QueueQuery(PLACES, id_prefix=f"q-{n}", at=T0))
        assert row.claim is not None and {row.claim.actor} == holders


def test_a_page_session_is_read_until_it_expires_or_ends_and_its_flash_is_shown_once(store: Store) -> None:
    def session(id_hash: str, hours: int) -> PageSession:
        return PageSession(id_hash, "h" * 64, "dana", "csrf-" + id_hash, T0, T0 + timedelta(hours=hours))

    store.open_session(session("s1", 8))
    store.open_session(session("s2", 1))
    assert store.page_session("s1", T0) == session("s1", 8)
    assert store.page_session("s2", T0 + timedelta(hours=1)) is None  # expired
    assert store.page_session("nobody", T0) is None
    assert store.take_flash("s1") is None
    store.set_flash("s1", "first")
    store.set_flash("s1", "Your decision (approved) is recorded.")
    assert store.page_session("s1", T0) == replace(session("s1", 8), flash="Your decision (approved) is recorded.")
    assert store.take_flash("s1") == "Your decision (approved) is recorded."
    assert store.page_session("s1", T0) == session("s1", 8)
    assert store.take_flash("s1") is None
    store.end_session("s1")
    assert store.page_session("s1", T0) is None
    store.set_flash("s1", "to nobody")  # an ended session takes no message
    assert store.take_flash("s1") is None
    later = replace(session("s3", 8), created_at=T0 + timedelta(hours=2))
    store.open_session(later)  # opening one forgets those already expired
    assert store.page_session("s2", T0) is None and store.page_session("s3", T0 + timedelta(hours=2)) == later


def test_failed_logins_are_read_per_key_within_the_window_and_forgotten_after_it(store: Store) -> None:
    def at(seconds: int) -> datetime:
        return T0 + timedelta(seconds=seconds)

    store.note_login_failure(["account:dana", "address:10.0.0.1"], at(0), forget_before=at(-60))
    store.note_login_failure(["account:dana"], at(0), forget_before=at(-60))  # the same instant twice: both count
    store.note_login_failure(["address:10.0.0.1"], at(30), forget_before=at(-30))
    assert store.login_failures(["account:dana", "address:10.0.0.1", "account:erin"], at(-1)) == {
        "account:dana": [at(0), at(0)],
        "address:10.0.0.1": [at(0), at(30)],
    }
    assert store.login_failures(["address:10.0.0.1"], at(0)) == {"address:10.0.0.1": [at(30)]}  # strictly after
    assert store.login_failures([], at(-1)) == {}
    store.clear_login_failures("account:dana")
    assert store.login_failures(["account:dana", "address:10.0.0.1"], at(-1)) == {"address:10.0.0.1": [at(0), at(30)]}
    store.note_login_failure([], at(90), forget_before=at(20))  # nothing to note; the old ones are forgotten
    assert store.login_failures(["address:10.0.0.1"], at(-100)) == {"address:10.0.0.1": [at(30)]}


def test_status_counts_per_workflow_and_status(store: Store) -> None:
    for task_id, due in (("a", T0 + timedelta(minutes=2)), ("b", T0), ("c", None)):
        started(store, task_id, next_run_at=due)
    triage = Log("t", workflow="triage")
    store.create(triage.row(status="blocked"), triage.first)
    store.claim("w1", limit=1, lease_seconds=60, at=T0 + timedelta(minutes=5))  # b, until T0 + 6 min
    # The oldest due task no worker holds: b is held (a held task that keeps moving stays due since it first
    # became due, so counting it would report a wait that is service).
    assert store.status_counts(T0 + timedelta(minutes=5, seconds=30)) == [
        {"workflow": "refund", "status": "runnable", "tasks": 3, "leased": 1, "oldest_due": T0 + timedelta(minutes=2)},
        {"workflow": "triage", "status": "blocked", "tasks": 1, "leased": 0, "oldest_due": None},
    ]
    expired = store.status_counts(T0 + timedelta(minutes=7))[0]  # b's lease ran out: it waits for a worker again
    assert (expired["leased"], expired["oldest_due"]) == (0, T0)


def test_ended_tasks_are_counted_per_workflow_as_they_end(store: Store) -> None:
    """The ended tasks' counts come from what the database keeps as rows end (SQL stores: migration 0009), so they
    must follow every way a task ends, and nothing else."""
    for n in range(3):
        ended(store, f"r-{n}")
    ended(store, "t-0", workflow="triage")
    live = started(store, "r-live", next_run_at=T0)
    store.append("r-live", 1, live.take(2), status="blocked")  # not ended: counted with the live ones
    store.append("r-live", 3, live.take(1), status="runnable", next_run_at=T0)
    # A terminal task's row moved again without changing its status (an archive's tombstone) is still counted once.
    store.mark_archived([("r-0", 2)], "archive.jsonl", "a" * 64)
    assert [(c["workflow"], c["status"], c["tasks"], c["leased"], c["oldest_due"]) for c in store.status_counts()] == [
        ("refund", "runnable", 1, 0, T0),
        ("refund", "terminal", 3, 0, None),
        ("triage", "terminal", 1, 0, None),
    ]


def test_ended_tasks_are_counted_exactly_when_many_end_at_once(store: Store) -> None:
    """Workers ending tasks of one workflow at the same instant each count theirs: none is lost, none twice."""
    logs = [Log(f"r-{n:02d}") for n in range(24)]
    for log in logs:
        store.create(log.row(next_run_at=T0), log.first)
    ends = [log.next("finish", "done") for log in logs]
    results = together(
        *(partial(store.append, log.task_id, 1, [end], status="terminal") for log, end in zip(logs, ends, strict=True))
    )
    assert results == [None] * len(logs)
    assert store.status_counts() == [
        {"workflow": "refund", "status": "terminal", "tasks": len(logs), "leased": 0, "oldest_due": None}
    ]


def test_a_worker_report_is_refreshed_in_place_and_stopped_workers_are_not_listed(store: Store) -> None:
    store.report_worker(WorkerReport("w1", "host-a", 11, 4, T0, T0, None, {"claimed": 0}))
    store.report_worker(WorkerReport("w0", "host-b", 12, 1, T0, T0, None, {}))
    store.report_worker(WorkerReport("w1", "elsewhere", 99, 8, LATER, LATER, None, {"claimed": 3, "by": {"x": 1}}))
    assert store.workers(seen_since=T0) == [
        WorkerReport("w0", "host-b", 12, 1, T0, T0, None, {}),
        WorkerReport("w1", "host-a", 11, 8, T0, LATER, None, {"claimed": 3, "by": {"x": 1}}),
    ]
    assert [w.name for w in store.workers(seen_since=T0 + timedelta(seconds=1))] == ["w1"]
    store.report_worker(WorkerReport("w1", "host-a", 11, 8, T0, LATER, LATER, {"claimed": 3}))
    assert [w.name for w in store.workers(seen_since=T0)] == ["w0"]
    # A supervisor sums its processes' last reports, the stopped ones' too.
    assert store.workers(seen_since=T0 + timedelta(seconds=1), stopped=True) == [
        WorkerReport("w1", "host-a", 11, 8, T0, LATER, LATER, {"claimed": 3})
    ]


# -- people, database tokens and the access trail --------------------------------------------------
def test_a_person_is_written_with_their_trail_entry_and_a_stale_revision_writes_nothing(store: Store) -> None:
    from engine.core.people import AccessAction, AccessChange, Person, Source

    dana = Person("dana", frozenset({"approver"}), None, "$argon2id$x", False, Source.LOCAL, T0, T0, 1)
    added = AccessChange(T0, "root", AccessAction.PERSON_ADDED, "dana", {"roles": ["approver"], "tenants": None})
    assert store.write_person(dana, [added], revision=None)
    assert store.person("dana") == dana and store.person("Dana") is None
    assert not store.write_person(dana, [added], revision=None)  # exists already: nothing written
    granted = replace(dana, roles=frozenset({"approver", "auditor"}), tenants=frozenset({"acme"}), revision=2)
    entry = AccessChange(LATER, "root", AccessAction.ROLE_GRANTED, "dana", {"role": "auditor"})
    assert store.write_person(replace(granted, updated_at=LATER), [entry], revision=1)
    assert not store.write_person(replace(granted, disabled=True, revision=3), [entry], revision=1)  # stale
    assert store.person("dana") == replace(granted, updated_at=LATER)
    assert store.people() == [replace(granted, updated_at=LATER)]
    trail = store.access_trail()
    assert [(c.by, c.action, c.subject, dict(c.details)) for c in trail] == [
        ("root", AccessAction.PERSON_ADDED, "dana", {"roles": ["approver"], "tenants": None}),
        ("root", AccessAction.ROLE_GRANTED, "dana", {"role": "auditor"}),
    ]
    assert [c.at for c in trail] == [T0, LATER]
    first = trail[0].id
    assert first is not None and trail[1].id is not None and trail[1].id > first
    assert store.access_trail(after=first) == trail[1:]
    assert store.access_trail(subject="erin") == [] and store.access_trail(limit=1) == trail[:1]


def test_a_database_token_is_kept_revoked_once_and_each_change_is_in_the_trail(store: Store) -> None:
    from engine.core.people import AccessAction, AccessChange, StoredToken

    token = StoredToken("a" * 64, "ci-bot", frozenset({"operator"}), frozenset({"acme"}), LATER, T0, "root")
    added = AccessChange(T0, "root", AccessAction.TOKEN_ADDED, "a" * 64, {"actor": "ci-bot"})
    assert store.add_api_token(token, added)
    assert not store.add_api_token(token, added)
    assert store.api_token("a" * 64) == token and store.api_token("b" * 64) is None
    assert store.api_tokens(actor="ci-bot") == [token] and store.api_tokens(actor="dana") == []
    revoked = AccessChange(LATER, "olga", AccessAction.TOKEN_REVOKED, "a" * 64, {"actor": "ci-bot"})
    assert store.revoke_api_token("a" * 64, LATER, "olga", revoked)
    assert not store.revoke_api_token("a" * 64, LATER, "olga", revoked)  # once
    assert store.api_tokens() == [replace(token, revoked_at=LATER, revoked_by="olga")]
    assert [(c.by, c.action) for c in store.access_trail()] == [
        ("root", AccessAction.TOKEN_ADDED),
        ("olga", AccessAction.TOKEN_REVOKED),
    ]
