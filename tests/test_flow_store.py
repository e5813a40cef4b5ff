"""The flow-control contract (`FlowStore`): what every store (memory, SQLite, PostgreSQL) does with the rows that
pace model calls, checked the same way on each. The clock is the store's own, so waits here are real (short)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from engine.core.flow import Amounts, BreakerSettings, Limits, Place, Waiter, place_in, queue
from engine.store import Store
from engine.store.protocol import FlowStore
from tests.support.races import together
from tests.support.stores import BACKENDS, Log, store_for

KEY = "openai:gpt-test"


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FlowStore]:
    with store_for(request, tmp_path) as empty:
        assert isinstance(empty, FlowStore)
        yield empty


def test_a_breaker_opens_after_failures_in_a_row_lets_one_probe_through_after_the_cool_down_and_closes(
    store: FlowStore,
) -> None:
    settings = BreakerSettings(failures=3, cool_down_seconds=0.4)
    assert store.breaker(KEY) is None
    assert store.breaker_failed(KEY, settings).state == "closed"
    assert store.breaker_failed(KEY, settings).state == "closed"
    opened = store.breaker_failed(KEY, settings)
    assert (opened.state, opened.failures) == ("open", 3)
    assert opened.open_until == pytest.approx(opened.at + 0.4, abs=0.05)
    late = store.breaker_failed(KEY, settings)  # a call in flight when it opened: the cool-down does not move
    assert (late.state, late.open_until) == ("open", opened.open_until)
    assert store.breaker_probe(KEY, 60) is False  # still cooling down
    time.sleep(0.45)
    assert together(*[lambda: store.breaker_probe(KEY, 60)] * 4).count(True) == 1  # one probe, however many ask
    row = store.breaker(KEY)
    assert row is not None and row.state == "half_open"
    store.breaker_closed(KEY)
    row = store.breaker(KEY)
    assert row is not None and (row.state, row.failures) == ("closed", 0)


def test_breakers_lists_every_breaker_by_model_as_it_stands_now(store: FlowStore) -> None:
    assert store.breakers() == []
    settings = BreakerSettings(failures=1, cool_down_seconds=60)
    store.breaker_failed("openai:b", settings)
    store.breaker_failed("anthropic:a", BreakerSettings(failures=2, cool_down_seconds=60))
    listed = store.breakers()
    assert [(b.key, b.state, b.failures) for b in listed] == [("anthropic:a", "closed", 1), ("openai:b", "open", 1)]
    assert all(b.at == pytest.approx(store.flow_clock(), abs=1.0) for b in listed)
    as_status_reads = [replace(b, at=0.0) for b in store.flow_rows()[0]]
    assert [replace(b, at=0.0) for b in listed] == as_status_reads  # `railyard status`'s rows, without the queues


def test_a_failed_probe_opens_the_breaker_again_for_a_whole_cool_down(store: FlowStore) -> None:
    settings = BreakerSettings(failures=1, cool_down_seconds=0.2)
    assert store.breaker_failed(KEY, settings).state == "open"
    time.sleep(0.25)
    assert store.breaker_probe(KEY, 60)
    again = store.breaker_failed(KEY, settings)
    assert again.state == "open" and again.open_until == pytest.approx(again.at + 0.2, abs=0.05)


def test_an_answer_between_failures_starts_the_count_again(store: FlowStore) -> None:
    settings = BreakerSettings(failures=2, cool_down_seconds=30)
    store.breaker_failed(KEY, settings)
    store.breaker_closed(KEY)
    assert store.breaker_failed(KEY, settings).state == "closed"


def test_a_bucket_gives_at_most_its_burst_then_refills_at_the_rate(store: FlowStore) -> None:
    # One a second, 5 at once: slow enough that a loaded database (the SQL stores read their own clock) still
    # answers the first 7 takes within the second before one more is refilled, and the 3 after the sleep within
    # half a second of it.
    limits = Limits(requests_per_minute=60, burst_seconds=5)
    results = [store.quota_take(KEY, limits, Amounts(), 30)[0] for _ in range(7)]
    assert results == [True] * 5 + [False] * 2
    time.sleep(2.5)  # 2.5 requests' worth
    assert [store.quota_take(KEY, limits, Amounts(), 30)[0] for _ in range(3)] == [True, True, False]


def test_takes_at_the_same_instant_never_overdraw_the_bucket(store: FlowStore) -> None:
    limits = Limits(requests_per_minute=60, input_tokens_per_minute=6000, burst_seconds=60)  # 60 requests at once
    takes = together(*[lambda: store.quota_take(KEY, limits, Amounts(1, 500, 0), 30)[0]] * 16)
    assert takes.count(True) == 12  # 6,000 input tokens of burst, 500 each


def test_a_refusal_returns_the_bucket_as_it_stands_to_say_how_long_to_wait(store: FlowStore) -> None:
    limits = Limits(input_tokens_per_minute=60_000, burst_seconds=1)  # 1,000 tokens a second, 1,000 at once
    assert store.quota_take(KEY, limits, Amounts(1, 800, 0), 30)[0]
    taken, row = store.quota_take(KEY, limits, Amounts(1, 800, 0), 30)
    assert not taken
    assert row.input_tokens == pytest.approx(200, abs=20)


def test_settling_takes_what_the_call_used_beyond_its_reservation_and_gives_back_the_rest(store: FlowStore) -> None:
    limits = Limits(input_tokens_per_minute=60, output_tokens_per_minute=60, burst_seconds=1000)  # ~1,000 deep
    assert store.quota_take(KEY, limits, Amounts(1, 100, 200), 30)[0]
    store.quota_settle(KEY, 150.0, -180.0)  # used 250 in, 20 out
    _, row = store.quota_take(KEY, limits, Amounts(1, 10_000, 0), 30)  # refused: reads the row
    assert row.input_tokens == pytest.approx(1000 - 250, abs=2)
    assert row.output_tokens == pytest.approx(1000 - 20, abs=2)
    assert row.in_flight == 0


def test_calls_in_flight_are_capped_and_freed_when_settled(store: FlowStore) -> None:
    limits = Limits(concurrent_calls=2)
    assert [store.quota_take(KEY, limits, Amounts(), 30)[0] for _ in range(3)] == [True, True, False]
    store.quota_settle(KEY, 0, 0)
    assert store.quota_take(KEY, limits, Amounts(), 30)[0]


def test_slots_of_calls_whose_deadline_passed_are_free_again(store: FlowStore) -> None:
    """A worker that died mid-call never settles: its slots free when its calls would have timed out."""
    limits = Limits(concurrent_calls=1)
    assert store.quota_take(KEY, limits, Amounts(), 0.2)[0]
    assert not store.quota_take(KEY, limits, Amounts(), 0.2)[0]
    time.sleep(0.25)
    assert store.quota_take(KEY, limits, Amounts(), 0.2)[0]


def test_a_pause_holds_every_take_until_it_ends(store: FlowStore) -> None:
    limits = Limits(requests_per_minute=6000)
    assert store.quota_take(KEY, limits, Amounts(), 30)[0]
    store.quota_pause(KEY, 0.3)
    taken, row = store.quota_take(KEY, limits, Amounts(), 30)
    assert not taken and row.paused_until == pytest.approx(row.at + 0.3, abs=0.05)
    time.sleep(0.35)
    assert store.quota_take(KEY, limits, Amounts(), 30)[0]


def test_what_the_provider_says_is_left_holds_the_bucket_down(store: FlowStore) -> None:
    limits = Limits(requests_per_minute=600, burst_seconds=6)  # 60 deep
    assert store.quota_take(KEY, limits, Amounts(), 30)[0]
    store.quota_adapt(KEY, limits, {"requests": 2, "input_tokens": 5})  # input has no limit here: ignored
    assert [store.quota_take(KEY, limits, Amounts(), 30)[0] for _ in range(3)] == [True, True, False]


def join(store: FlowStore, task_id: str, priorities: dict[str, int] | None = None, wait: float = 10) -> Place:
    """`task_id` in the line of KEY, its place counted as a look counts it (every waiter ahead, any look)."""
    place, _ = store.wait_join(KEY, task_id, wait, priorities or {}, lookahead=math.inf, grace=60.0)
    return place


def line_of(store: FlowStore) -> list[Waiter]:
    return [w for w in store.flow_rows()[2] if w.key == KEY]


def test_the_queue_keeps_each_waiters_priority_and_group_and_its_place(store: FlowStore, tmp_path: Path) -> None:
    logs = cast(Store, store)
    for task_id, tenant, priority in (("a", "acme", None), ("b", None, 5), ("c", "acme", None)):
        log = Log(task_id, workflow="bulk")
        logs.create(replace(log.row(), tenant=tenant, priority=priority), log.first)
    join(store, "a", {"bulk": 1})
    join(store, "b", {"bulk": 1})
    place = join(store, "c", {"bulk": 1})
    assert (place.coming, place.ahead, place.others) == (2, 2, True)  # b (priority 5), then a, before c
    waiters = line_of(store)
    by_task = {w.task_id: (w.priority, w.group) for w in waiters}
    assert by_task == {"a": (1, "tenant:acme"), "b": (5, "workflow:bulk"), "c": (1, "tenant:acme")}
    assert [w.task_id for w in queue(waiters)] == ["b", "a", "c"]
    first_since = next(w.since for w in waiters if w.task_id == "a")
    again = join(store, "a", {}, wait=20)  # looking again keeps its place in the line
    assert again.since == first_since and next(w.since for w in line_of(store) if w.task_id == "a") == first_since
    store.wait_leave(KEY, "a")
    _, _, everyone = store.flow_rows()
    assert sorted(w.task_id for w in everyone) == ["b", "c"]


def test_a_group_served_from_the_line_is_charged_and_a_newcomer_goes_first(store: FlowStore) -> None:
    """Fair share: each call served from the line counts for its group (`wait_leave`), and the line orders the
    groups by what each was served lately, so a tenant arriving beside a served batch is not held to half."""
    logs = cast(Store, store)
    for task_id, tenant in (("b1", "batch"), ("b2", "batch"), ("b3", "batch"), ("b4", "batch"), ("s1", "small")):
        log = Log(task_id, workflow="bulk")
        logs.create(replace(log.row(), tenant=tenant), log.first)
    for served in ("b1", "b2"):
        join(store, served)
        store.wait_leave(KEY, served)
    join(store, "b3")
    join(store, "b4")
    assert join(store, "s1").ahead == 0  # the newcomer is first
    assert join(store, "b4").ahead == 2
    waiters = line_of(store)
    shares = {w.task_id: w.served for w in waiters}
    assert shares["b3"] == shares["b4"] == pytest.approx(2.0, abs=0.1) and shares["s1"] == 0.0
    assert [w.task_id for w in queue(waiters)] == ["s1", "b3", "b4"]
    # Leaving without a place in the line charges nobody.
    store.wait_leave(KEY, "never-waited")
    _, _, rows = store.flow_rows()
    assert {w.task_id: round(w.served) for w in rows} == {"b3": 2, "b4": 2, "s1": 0}
    line, _ = store.waits_of("s1")
    assert [w.task_id for w in queue(line)] == ["s1", "b3", "b4"]


def test_the_rows_read_for_status_hold_every_breaker_bucket_and_waiter(store: FlowStore) -> None:
    store.breaker_failed("anthropic:claude-x", BreakerSettings(failures=1))
    store.quota_take(KEY, Limits(requests_per_minute=60), Amounts(), 30)
    breakers, buckets, waits = store.flow_rows()
    assert [(b.key, b.state) for b in breakers] == [("anthropic:claude-x", "open")]
    assert [(q.key, q.in_flight) for q in buckets] == [(KEY, 1)]
    assert waits == []


def test_the_place_a_store_counts_is_the_place_the_line_gives(store: FlowStore) -> None:
    """A look reads its place, not the line: the store counts it in one statement (the SQL stores in the
    database). Whatever the line (priorities, groups, serves, looks due soon, late or far off), that count is
    what `engine.core.flow.place_in` says of the line the store holds."""
    logs = cast(Store, store)
    pick = random.Random(7)
    ids = [f"t{n:02d}" for n in range(40)]
    for task_id in ids:
        log = Log(task_id, workflow="bulk")
        row = replace(log.row(), tenant=pick.choice(["a", "b", "c", None]), priority=pick.choice([None, None, 0, 5]))
        logs.create(row, log.first)
    for task_id in ids:
        place, _ = store.wait_join(
            KEY, task_id, pick.choice([0.0, 1.0, 30.0, 500.0]), {"bulk": 1}, lookahead=5.0, grace=2.0
        )
        if pick.random() < 0.2:
            store.wait_leave(KEY, task_id)  # served: its group's share grows
    for task_id in pick.sample(ids, 15):
        place, _ = store.wait_join(KEY, task_id, 3.0, {"bulk": 1}, lookahead=5.0, grace=2.0)
        line, at = store.waits_of(task_id)
        expected = place_in(line, task_id, at, lookahead=5.0, grace=2.0)
        # The store's clock moved on between the two reads by a few milliseconds at most.
        assert (place.coming, place.ahead, place.others) == (expected.coming, expected.ahead, expected.others), task_id
        assert place.since == pytest.approx(expected.since)
