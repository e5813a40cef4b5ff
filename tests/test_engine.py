"""The engine over a real store, on SQLite and PostgreSQL: tasks, transitions, refusals, snapshots."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import text

from engine import (
    Code,
    ConcurrencyConflict,
    Engine,
    RailyardError,
    Registry,
    StaticRoles,
    verify_chain,
)
from tests.support.insider import sql
from tests.support.postgres import libpq as _libpq
from tests.support.sample_workflows import (
    COUNTER,
    REFUND_V1,
    REFUND_V2,
    ROLES,
    edited_refund_v1,
)
from tests.support.stores import sql_store

MakeEngine = Callable[..., Engine]
ORDER = {"customer": "c1", "balance": 500}


def snapshot_of_log(eng: Engine, task_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.hash) for e in eng.history(task_id)]


def test_start_pins_the_newest_version_and_its_digest(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    view = eng.get(task_id)
    assert (view.workflow, view.version, view.digest) == ("refund", 2, REFUND_V2.digest)
    assert (view.state, view.seq, view.status) == ("assessing", 1, "runnable")
    assert view.allowed == ["propose", "give_up", "note", "cancel"]
    first = eng.history(task_id)[0]
    assert (first.seq, first.trigger, first.from_state, first.to_state) == (1, "start", None, "assessing")
    assert first.data["input"] == ORDER


def test_a_task_runs_to_completion_and_its_chain_verifies(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann", version=1)
    eng.fire(task_id, "propose", {"amount": 300, "reason": "damaged"}, actor="model")
    eng.fire(task_id, "approve", {}, actor="dana")
    done = eng.transition(eng.load(task_id), "succeeded", {}, actor="tool-runner", system=True)
    assert (done.state, done.seq, done.terminal) == ("completed", 4, True)
    events = eng.history(task_id)
    assert [e.trigger for e in events] == ["start", "propose", "approve", "succeeded"]
    assert [e.actor for e in events] == ["ann", "model", "dana", "tool-runner"]
    assert verify_chain(events) == []
    assert eng.get(task_id).allowed == []


@pytest.mark.parametrize(
    ("trigger", "payload", "actor", "code"),
    [
        ("approve", {}, "dana", Code.TRIGGER_NOT_ALLOWED),
        ("propose", {"amount": -1, "reason": "x"}, "model", Code.PAYLOAD_INVALID),
        ("propose", {"amount": 10, "reason": "x", "actor": "dana"}, "model", Code.IDENTITY_OVERRIDE),
        ("propose", {"amount": 10_000, "reason": "x"}, "model", Code.DOMAIN_INVALID),
        ("propose", {"amount": 10, "reason": "x"}, "", Code.ACTOR_REQUIRED),
    ],
)
def test_bad_input_is_refused_with_its_code_and_the_log_is_unchanged(
    eng: Engine, trigger: str, payload: dict[str, object], actor: str, code: Code
) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    before = snapshot_of_log(eng, task_id)
    with pytest.raises(RailyardError) as caught:
        eng.fire(task_id, trigger, payload, actor=actor)
    assert caught.value.code is code
    assert snapshot_of_log(eng, task_id) == before
    assert eng.get(task_id).seq == 1


@pytest.mark.parametrize("trigger", ["succeeded", "failed", "unknown", "expired"])
def test_engine_owned_triggers_are_refused_to_callers(eng: Engine, trigger: str) -> None:
    """Tool outcomes and deadlines come from the engine's own components, never from `fire`."""
    task_id = eng.start("refund", ORDER, actor="ann")
    eng.fire(task_id, "propose", {"amount": 300 if trigger == "expired" else 50, "reason": "x"}, actor="model")
    before = snapshot_of_log(eng, task_id)
    with pytest.raises(RailyardError) as caught:
        eng.fire(task_id, trigger, {}, actor="dana")
    assert caught.value.code is Code.FORBIDDEN
    assert snapshot_of_log(eng, task_id) == before


def test_unknown_workflow_version_and_task_are_refused(eng: Engine) -> None:
    refusals: list[tuple[Callable[[], object], Code]] = [
        (lambda: eng.start("nope", {}, actor="ann"), Code.WORKFLOW_UNKNOWN),
        (lambda: eng.start("refund", ORDER, actor="ann", version=7), Code.VERSION_UNKNOWN),
        (lambda: eng.start("refund", {"customer": "c1"}, actor="ann"), Code.PAYLOAD_INVALID),
        (lambda: eng.get("no-such-task"), Code.TASK_NOT_FOUND),
        (lambda: eng.history("no-such-task"), Code.TASK_NOT_FOUND),
        (lambda: eng.fire("no-such-task", "cancel", {"reason": "x"}, actor="ann"), Code.TASK_NOT_FOUND),
    ]
    for call, code in refusals:
        with pytest.raises(RailyardError) as caught:
            call()
        assert caught.value.code is code
    assert eng.store.task_ids() == []


def test_a_trigger_on_a_terminal_task_is_refused(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    eng.cancel(task_id, actor="ann", reason="customer withdrew")
    assert eng.get(task_id).state == "cancelled"
    before = snapshot_of_log(eng, task_id)
    attempts: list[tuple[str, dict[str, object]]] = [
        ("cancel", {"reason": "again"}),
        ("propose", {"amount": 5, "reason": "x"}),
    ]
    for trigger, payload in attempts:
        with pytest.raises(RailyardError) as caught:
            eng.fire(task_id, trigger, payload, actor="ann")
        assert caught.value.code is Code.TASK_TERMINAL
    assert snapshot_of_log(eng, task_id) == before
    assert eng.history(task_id)[-1].data == {"args": {"reason": "customer withdrew"}}


def test_role_is_required_for_approval(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    eng.fire(task_id, "propose", {"amount": 300, "reason": "x"}, actor="model")
    with pytest.raises(RailyardError) as caught:
        eng.fire(task_id, "approve", {}, actor="bob")
    assert caught.value.code is Code.APPROVAL_FORBIDDEN  # fire decides an approval exactly as approve does
    assert eng.get(task_id).state == "awaiting_approval"
    done = eng.fire(task_id, "approve", {"comment": "ok"}, actor="dana")
    assert eng.history(task_id)[-1].data["approval"] == {
        "actor": "dana",
        "role": "approver",
        "decision": "approve",
        "comment": "ok",
        "digest": None,
    }
    assert done.state == eng.get(task_id).state


def test_stale_expected_seq_conflicts_and_writes_nothing(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    eng.fire(task_id, "note", {"note": "first"}, actor="model", expected_seq=1)
    with pytest.raises(ConcurrencyConflict) as caught:
        eng.fire(task_id, "note", {"note": "stale"}, actor="model", expected_seq=1)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert len(eng.history(task_id)) == 2


def test_a_held_task_that_moved_meanwhile_conflicts_at_append(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    held = eng.load(task_id)
    eng.transition(held, "note", {"note": "worker one"}, actor="w1")
    with pytest.raises(ConcurrencyConflict) as caught:
        eng.transition(held, "give_up", {}, actor="w2")
    assert caught.value.code is Code.CONCURRENCY_CONFLICT
    assert [e.trigger for e in eng.history(task_id)] == ["start", "note"]
    assert eng.get(task_id).state == "assessing"


def test_snapshots_are_written_every_n_events_and_used_on_load(make_engine: MakeEngine) -> None:
    eng = make_engine(snapshot_every=10)
    task_id = eng.start("counter", {}, actor="ann")
    task = eng.load(task_id)
    for n in range(34):
        task = eng.transition(task, "tick", {"n": n}, actor="model")
    assert [s.seq for s in eng.store.snapshots(task_id)] == [10, 20, 30]
    loaded = eng.store.load(task_id)
    assert loaded is not None and loaded.snapshot is not None
    assert loaded.snapshot.seq == 30 and [e.seq for e in loaded.events] == [31, 32, 33, 34, 35]
    assert eng.load(task_id) == task


def test_a_corrupted_snapshot_is_not_trusted(make_engine: MakeEngine, db_url: str) -> None:
    eng = make_engine(snapshot_every=5)
    task_id = eng.start("counter", {}, actor="ann")
    task = eng.load(task_id)
    for n in range(7):
        task = eng.transition(task, "tick", {"n": n}, actor="model")
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE snapshots SET doc = :d WHERE task_id = :t"), {"d": '{"task_id": "x"}', "t": task_id})
    assert eng.load(task_id) == task


def test_a_task_row_out_of_step_with_its_log_is_refused(eng: Engine) -> None:
    task_id = eng.start("refund", ORDER, actor="ann")
    eng.fire(task_id, "note", {"note": "x"}, actor="model")
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE tasks SET state = 'completed' WHERE task_id = :t"), {"t": task_id})
    with pytest.raises(RailyardError) as caught:
        eng.load(task_id)
    assert caught.value.code is Code.STATE_MISMATCH


def test_loading_many_tasks_folds_each_as_load_does_and_leaves_out_what_load_refuses(db_url: str) -> None:
    """A worker loads the tasks of a claim together: each must be the state `load` gives, and a task `load`
    would refuse (pinned to a version this process lacks, a row out of step with its log, no such task) is left
    out for `load` to refuse on its own, with its code."""
    with Engine(db_url, Registry([REFUND_V1, COUNTER]), authoriser=StaticRoles(ROLES), snapshot_every=5) as eng:
        counted = eng.load(eng.start("counter", {}, actor="ann"))
        for n in range(7):  # past a snapshot: folded from it
            counted = eng.transition(counted, "tick", {"n": n}, actor="model")
        refund = eng.start("refund", ORDER, actor="ann")
        skewed = eng.start("counter", {}, actor="ann")
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE tasks SET state = 'elsewhere' WHERE task_id = :t"), {"t": skewed})
    with Engine(db_url, Registry([COUNTER]), authoriser=StaticRoles(ROLES), snapshot_every=5) as eng:
        loaded = eng.load_many([refund, counted.task_id, "nobody", skewed])
        assert loaded == {counted.task_id: counted}
        assert loaded[counted.task_id] == eng.load(counted.task_id)
        for task_id, code in ((refund, Code.DEFINITION_MISSING), (skewed, Code.STATE_MISMATCH)):
            with pytest.raises(RailyardError) as caught:
                eng.load(task_id)
            assert caught.value.code is code


def test_loading_a_task_whose_version_is_gone_or_changed_is_refused(db_url: str) -> None:
    with Engine(db_url, Registry([REFUND_V1]), authoriser=StaticRoles(ROLES)) as eng:
        task_id = eng.start("refund", ORDER, actor="ann")
    with Engine(db_url, Registry([COUNTER]), authoriser=StaticRoles(ROLES)) as eng:
        with pytest.raises(RailyardError) as missing:
            eng.get(task_id)
        assert missing.value.code is Code.DEFINITION_MISSING
    changed = edited_refund_v1()
    with Engine(db_url, Registry([changed]), authoriser=StaticRoles(ROLES)) as eng:
        with pytest.raises(RailyardError) as caught:
            eng.fire(task_id, "note", {"note": "x"}, actor="model")
        assert caught.value.code is Code.DEFINITION_CHANGED
        assert len(eng.history(task_id)) == 1


def test_an_unmigrated_database_says_how_to_fix_it(tmp_path: object, registry: Registry) -> None:
    with Engine(f"sqlite:///{tmp_path}/empty.db", registry) as eng, pytest.raises(RailyardError) as caught:
        eng.start("refund", ORDER, actor="ann")
    assert caught.value.code is Code.SCHEMA_MISSING
    assert "railyard db upgrade" in caught.value.message


def test_append_writes_nothing_when_one_event_of_a_batch_is_bad(eng: Engine, db_url: str) -> None:
    """All or nothing: a batch whose second event collides writes neither event nor the row."""
    from dataclasses import replace

    task_id = eng.start("counter", {}, actor="ann")
    task = eng.load(task_id)
    good = eng.transition(task, "tick", {"n": 1}, actor="model")
    history = eng.history(task_id)
    # Re-append seq 2 as part of a batch from seq 1 with a forged row seq: the PK on (task_id, seq) refuses.
    forged = replace(history[1], seq=3)
    with sql_store(eng).engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("UPDATE tasks SET seq = 1 WHERE task_id = :t"), {"t": task_id})
    with pytest.raises(RailyardError):
        eng.store.append(task_id, 1, [history[1], forged], status="runnable")
    with sql_store(eng).engine.connect() as conn:
        seq = conn.execute(text("SELECT seq FROM tasks WHERE task_id = :t"), {"t": task_id}).scalar()
        count = conn.execute(text("SELECT count(*) FROM events WHERE task_id = :t"), {"t": task_id}).scalar()
    assert (seq, count) == (1, 2)
    assert good.seq == 2


def test_postgres_database_is_the_tests_own(pg_database: str) -> None:
    """Tests never write to the server's shared `test` database."""
    assert "railyard_test_" in pg_database
    with psycopg.connect(_libpq(pg_database)) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0].startswith("railyard_test_")  # type: ignore[index]


def test_status_counts_on_both_databases(eng: Engine) -> None:
    eng.start("refund", ORDER, actor="ann")
    done = eng.start("counter", {}, actor="ann")
    eng.cancel(done, actor="ann", reason="x")
    counts = {(c["workflow"], c["status"]): c["tasks"] for c in eng.store.status_counts()}
    assert counts == {("refund", "runnable"): 1, ("counter", "terminal"): 1}
    by_status = {c["status"]: c for c in eng.store.status_counts()}
    assert by_status["runnable"]["oldest_due"].tzinfo is not None  # aware UTC on both databases
    assert by_status["terminal"]["oldest_due"] is None  # an ended task is never due


def test_each_transition_logs_one_structured_line(eng: Engine, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    task_id = eng.start("refund", ORDER, actor="ann")
    with caplog.at_level(logging.INFO, logger="railyard.transitions"):
        eng.fire(task_id, "note", {"note": "secret remark"}, actor="model")
        eng.cancel(task_id, actor="ann", reason="stop")
    lines = [r.getMessage() for r in caplog.records if r.name == "railyard.transitions"]
    assert len(lines) == 2
    assert lines[0].startswith(f"task={task_id} seq=2 actor=model from=assessing trigger=note to=assessing code=-")
    assert "secret remark" not in " ".join(lines)
    assert "trigger=cancel to=cancelled" in lines[1] and "duration_ms=" in lines[1]


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2]", ""])
def test_an_event_whose_data_is_no_longer_json_is_a_coded_refusal(eng: Engine, garbage: str) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    eng.fire(task_id, "tick", {"n": 1}, actor="model")
    with sql(sql_store(eng).url) as conn:
        conn.execute(text("UPDATE events SET data = :d WHERE task_id = :t AND seq = 2"), {"d": garbage, "t": task_id})
    for read in (eng.load, eng.history):
        with pytest.raises(RailyardError) as caught:
            read(task_id)
        assert caught.value.code is Code.HASH_MISMATCH


def test_signal_is_fire_under_the_designs_name(eng: Engine) -> None:
    task_id = eng.start("counter", {}, actor="ann")
    assert eng.signal(task_id, "tick", {"n": 1}, actor="model").seq == 2
    with pytest.raises(RailyardError) as caught:
        eng.signal(task_id, "repair", {}, actor="model")  # engine triggers stay the engine's
    assert caught.value.code is Code.FORBIDDEN
    assert len(eng.history(task_id)) == 2
