"""Fork and redrive: a new task from a point of another's log, and a stopped task sent back to a state it visited.

On SQLite and PostgreSQL, with the reference refund workflow and its fake payment provider: each test counts
the provider's payments, because the promise both operations keep is that no write runs twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from engine import (
    Action,
    Agent,
    Budgets,
    Code,
    Engine,
    RailyardError,
    Registry,
    ScriptedModel,
    StaticRoles,
    Terminal,
    Worker,
    Workflow,
)
from engine.api import create_app
from engine.cli import EXIT_AUDIT, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, app
from engine.core.canonical import canonical_json, now
from engine.core.events import Event, seal
from engine.core.payloads import as_event_data
from engine.providers.scripted import call
from engine.store import TaskRow
from tests.support import reference
from tests.support.api import bearer, live_server, token_table
from tests.support.insider import tamper
from tests.support.payloads import undeclared
from tests.support.reference import DAMAGED, refund
from workflows import REFUND_V1, REFUND_V2, fakes

books, eng = reference.books, reference.eng  # the reference workflows' fixtures


def refused(action: Any) -> RailyardError:
    with pytest.raises(RailyardError) as caught:
        action()
    return caught.value


def heads(engine: Engine) -> list[tuple[str, int, str]]:
    """Every task's (id, seq, last hash): what must not change when a command is refused."""
    rows = engine.store.audit_stream(with_snapshots=False)
    return sorted((r.task_id, r.seq, r.last_hash) for r in rows if isinstance(r, TaskRow))


def paid(eng: Engine, task_id: str) -> str:
    """A refund the model took to approval, approved by dana, paid by the provider: returns its action id."""
    to_approval(eng, task_id)
    action_id = approve(eng, task_id)
    assert eng.run(task_id).state == "completed"
    return action_id


def to_approval(eng: Engine, task_id: str) -> None:
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            refund(12_999),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "awaiting_approval"


def approve(eng: Engine, task_id: str) -> str:
    prepared = eng.load(task_id).prepared
    assert prepared is not None
    eng.approve(task_id, actor="dana", prepared_digest=prepared["digest"], comment="photo checked")
    return str(prepared["action_id"])


def ended(eng: Engine, task_id: str) -> None:
    """Stop a fork that is not needed any more, so its source may be forked again (two forks never run at once)."""
    if not eng.load(task_id).terminal:
        eng.cancel(task_id, actor="olga", reason="this re-run is done")


def seq_of(eng: Engine, task_id: str, trigger: str) -> int:
    return next(e.seq for e in eng.history(task_id) if e.trigger == trigger)


def rejected_by_the_model(eng: Engine) -> str:
    """A refund the model looked up, assessed and then rejected: no write anywhere in its log."""
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    model = ScriptedModel(
        [
            call("query_order", order_id="O-1001"),
            call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
            call("reject", reason="Looks like wear, not transit damage."),
        ],
        profile="anthropic",
    )
    assert eng.run(task_id, model=model).state == "rejected"
    return task_id


# -- fork ---------------------------------------------------------------------------------------------------


def test_a_fork_at_several_seqs_carries_the_state_there_and_both_tasks_replay_clean(
    eng: Engine, books: fakes.Systems
) -> None:
    source = rejected_by_the_model(eng)
    before = eng.history(source)
    for seq in range(1, len(before)):  # every seq but the last, terminal one
        as_of = eng.audit.as_of(source, seq=seq)
        fork = eng.fork(source, seq, actor="olga", reason="re-run with the new model", version=1)
        first = eng.history(fork)[0]
        assert (first.seq, first.trigger, first.from_state, first.to_state, first.actor) == (
            1,
            "fork",
            None,
            as_of.state,
            "olga",
        )
        assert first.data["forked_from"] == {
            "task_id": source,
            "seq": seq,
            "hash": before[seq - 1].hash,
            "workflow": "refund@1",
            "digest": as_of.digest,
        }
        task = eng.load(fork)
        assert (task.state, task.facts, task.visit, task.prepared, task.effect) == (
            as_of.state,
            as_of.facts,
            as_of.visit,
            as_of.prepared,
            as_of.effect,
        )
        assert task.started_by == "ann" and task.input == as_of.input
        assert {k: v for k, v in task.usage.items() if k != "started_at"} == {
            k: v for k, v in as_of.usage.items() if k != "started_at"
        }
        assert undeclared([first]) == []
        if task.state == "looking_up_order":  # the carried lookup runs in the fork, with the carried call
            assert eng.run(fork, max_turns=1).state == "collecting_information"
            assert eng.load(fork).facts["tool:query_order"]["order_id"] == "O-1001"
        assert eng.replay(fork).ok, eng.replay(fork).findings
        ended(eng, fork)
    assert eng.history(source) == before  # the source is only read
    assert all(report.ok for report in eng.audit.replay_all()), [r.findings for r in eng.audit.replay_all() if not r.ok]
    assert books.payments.requests() == []


def test_a_fork_goes_on_to_its_own_end_and_a_fork_of_a_fork_replays_clean(eng: Engine, books: fakes.Systems) -> None:
    source = rejected_by_the_model(eng)
    at = seq_of(eng, source, "assess_eligibility")  # in `eligible`, where the model rejected
    fork = eng.fork(source, at, actor="olga", reason="the rejection was wrong", version=1)
    # While the fork runs, neither it nor its source may be forked: two re-runs could each make their own refund.
    running = refused(lambda: eng.fork(fork, 1, actor="olga", reason="and once more", version=1))
    assert running.code is Code.FORK_INVALID and "still running" in running.message
    sibling = refused(lambda: eng.fork(source, at, actor="olga", reason="a second re-run", version=1))
    assert sibling.code is Code.WRITE_WOULD_REPEAT and fork in sibling.message
    model = ScriptedModel([refund(12_999)], profile="anthropic")
    assert eng.run(fork, model=model).state == "awaiting_approval"
    ended(eng, fork)  # cancelled before anyone approved: nothing was paid
    again = eng.fork(fork, 1, actor="olga", reason="and once more", version=1)
    assert eng.history(again)[0].data["forked_from"]["task_id"] == fork
    assert eng.get(again).state == "eligible"
    for task_id in (source, fork, again):
        assert eng.replay(task_id).ok, eng.replay(task_id).findings
    assert all(r.ok for r in eng.audit.replay_all(jobs=2))
    assert books.payments.requests() == []


def test_a_fork_runs_on_the_newest_version_unless_it_names_one(eng: Engine) -> None:
    source = rejected_by_the_model(eng)
    at = seq_of(eng, source, "assess_eligibility")
    newest = eng.fork(source, at, actor="olga", reason="on v2")
    assert (eng.get(newest).version, eng.get(newest).state) == (2, "eligible")
    assert eng.history(newest)[0].data["workflow"] == "refund@2"
    assert eng.history(newest)[0].data["forked_from"]["workflow"] == "refund@1"
    assert eng.replay(newest).ok, eng.replay(newest).findings
    ended(eng, newest)
    assert eng.get(eng.fork(source, at, actor="olga", reason="on v1", version=1)).version == 1


def test_a_refund_cannot_be_forked_before_its_payment_and_can_after_its_outcome_is_on_record(
    eng: Engine, books: fakes.Systems
) -> None:
    # Awaiting approval, the source is running: it may still pay, and a fork would too.
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    to_approval(eng, task_id)
    waiting = eng.get(task_id).seq
    error = refused(lambda: eng.fork(task_id, waiting, actor="olga", reason="try again"))
    assert error.code is Code.FORK_INVALID and "still running" in error.message
    action_id = eng.load(task_id).prepared["action_id"]  # type: ignore[index]

    # The provider pays, and the answer is lost: the outcome is unknown. An approver verifies with the provider
    # that it paid, and the source ends with the payment on record.
    approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    assert eng.run(task_id).state == "retryable_failure"
    assert books.payments.executions() == {action_id: 1}
    unknown = eng.get(task_id).seq
    eng.settle(task_id, actor="olga", outcome="executed", evidence="provider dashboard, refund R-1")
    settled = eng.get(task_id).seq
    eng.fire(task_id, "retry_refund", actor="olga")
    assert eng.run(task_id).state == "completed"
    before = heads(eng)
    for seq in range(1, unknown + 1):  # before the payment, or at its open outcome: refused
        error = refused(lambda seq=seq: eng.fork(task_id, seq, actor="olga", reason="try again"))
        assert error.code is Code.WRITE_WOULD_REPEAT, (seq, error)
        assert action_id in error.message
    assert "is unknown at seq" in refused(lambda: eng.fork(task_id, unknown, actor="olga", reason="x")).message
    assert heads(eng) == before  # nothing was created, the source did not move

    # From the seq the outcome was put on record, a fork carries it, and its retry records the payment without
    # sending it again.
    fork = eng.fork(task_id, settled, actor="olga", reason="finish it in a fresh task")
    assert eng.load(fork).effect["status"] == "executed"  # type: ignore[index]
    eng.fire(fork, "retry_refund", actor="otto")
    assert eng.run(fork).state == "completed"
    last = eng.history(fork)[-1]
    assert (last.trigger, last.data.get("asserted", {}).get("by")) == ("succeeded", "olga")
    assert books.payments.executions() == {action_id: 1}  # paid once, by the source, never by the fork
    assert eng.replay(fork).ok and eng.replay(task_id).ok


def test_a_completed_refund_cannot_be_forked_anywhere_before_its_payment(eng: Engine, books: fakes.Systems) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    action_id = paid(eng, task_id)
    last = eng.get(task_id).seq
    for seq in range(1, last):
        error = refused(lambda seq=seq: eng.fork(task_id, seq, actor="olga", reason="again"))
        assert error.code is Code.WRITE_WOULD_REPEAT and action_id in error.message, seq
    assert refused(lambda: eng.fork(task_id, last, actor="olga", reason="again")).code is Code.FORK_INVALID  # ended
    assert books.payments.executions() == {action_id: 1}


def test_a_bad_fork_is_refused_with_its_code_and_nothing_is_written(eng: Engine) -> None:
    source = rejected_by_the_model(eng)
    before = heads(eng)
    assert refused(lambda: eng.fork("no-such-task", 1, actor="olga", reason="x")).code is Code.TASK_NOT_FOUND
    for seq in (0, -1, 99):
        assert refused(lambda seq=seq: eng.fork(source, seq, actor="olga", reason="x")).code is Code.FORK_INVALID
    assert refused(lambda: eng.fork(source, 1, actor="olga", reason=" ")).code is Code.FORK_INVALID
    assert refused(lambda: eng.fork(source, 1, actor="", reason="x")).code is Code.ACTOR_REQUIRED
    assert refused(lambda: eng.fork(source, 1, actor="olga", reason="x", version=9)).code is Code.VERSION_UNKNOWN
    assert heads(eng) == before


# -- a small workflow with budgets and a state that a later version drops -------------------------------------------


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, max_length=100)


def _flow(version: int, working: str) -> Workflow:
    return Workflow(
        name="flow",
        version=version,
        budgets=Budgets(model_turns=2),
        cancel_role="operator",
        states=[
            Agent(working, actions=[Action("finish", "done", Note)], max_repairs=5),
            Terminal("done"),
        ],
    )


FLOW_V1, FLOW_V2 = _flow(1, "working"), _flow(2, "doing")


@pytest.fixture
def flow(db_url: str) -> Iterator[Engine]:
    roles = StaticRoles({"olga": {"operator"}})
    with Engine(db_url, Registry([FLOW_V1, FLOW_V2]), authoriser=roles) as engine:
        yield engine


def limited(flow: Engine) -> str:
    """A flow task whose model answered nothing twice: its model-turn budget ran out."""
    task_id = flow.start("flow", actor="ann", version=1)
    model = ScriptedModel([{"text": "thinking"}, {"text": "still thinking"}], profile="anthropic")
    assert flow.run(task_id, model=model).state == "limit_exceeded"
    return task_id


def test_a_fork_to_a_version_without_the_state_is_refused_as_migrate_would_be(flow: Engine) -> None:
    task_id = flow.start("flow", actor="ann", version=1)
    flow.cancel(task_id, actor="olga", reason="start again on a new version")
    error = refused(lambda: flow.fork(task_id, 1, actor="olga", reason="onto v2"))
    assert error.code is Code.FORK_INVALID and "flow@2 does not have: working" in error.message
    assert flow.get(flow.fork(task_id, 1, actor="olga", reason="onto v1", version=1)).state == "working"


# -- redrive ------------------------------------------------------------------------------------------------


def test_a_task_the_limit_stopped_is_redriven_to_its_agent_state_and_completes(flow: Engine) -> None:
    task_id = limited(flow)
    stopped = flow.load(task_id)
    assert stopped.usage["turns"] == 2
    after = flow.redrive(task_id, "working", actor="olga", reason="the provider had an outage")
    event = flow.history(task_id)[-1]
    assert (event.trigger, event.actor, event.from_state, event.to_state) == (
        "redrive",
        "olga",
        "limit_exceeded",
        "working",
    )
    assert event.data["reset"] == {"turns": 2, "calls": 0, "repeats": {}, "started_at": stopped.usage["started_at"]}
    assert event.data["redrive_from_seq"] == 1 and event.data["reason"] == "the provider had an outage"
    assert undeclared([event]) == []
    assert (after.state, after.usage["turns"], after.usage["calls"]) == ("working", 0, 0)
    # The task is runnable again: a worker claims it and the model finishes it.
    worker = Worker(flow, name="w1", model=ScriptedModel([call("finish", text="all done")], profile="anthropic"))
    assert worker.run_once() == 1
    assert flow.get(task_id).state == "done"
    assert flow.replay(task_id).ok, flow.replay(task_id).findings


def test_redrive_is_refused_without_the_role_from_a_wrong_state_and_to_a_wrong_state(flow: Engine) -> None:
    task_id = limited(flow)
    running = flow.start("flow", actor="ann", version=1)
    before = heads(flow)
    error = refused(lambda: flow.redrive(task_id, "working", actor="bob", reason="x"))
    assert error.code is Code.FORBIDDEN and "operator" in error.message
    error = refused(lambda: flow.redrive(running, "working", actor="olga", reason="x"))
    assert error.code is Code.REDRIVE_INVALID and "not a hand-off or limit state" in error.message
    for target in ("done", "limit_exceeded", "nowhere", "working~force"):
        error = refused(lambda target=target: flow.redrive(task_id, target, actor="olga", reason="x"))
        assert error.code is Code.REDRIVE_INVALID, target
    assert refused(lambda: flow.redrive(task_id, "working", actor="olga", reason="")).code is Code.REDRIVE_INVALID
    assert (
        refused(lambda: flow.redrive(task_id, "working", actor="olga", reason="x", expected_seq=1)).code
        is Code.CONCURRENCY_CONFLICT
    )
    assert heads(flow) == before


def test_a_handed_off_refund_is_redriven_to_the_state_it_was_in_and_never_to_one_it_was_not(
    eng: Engine, books: fakes.Systems
) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    # The model never proposes anything usable: after the repairs, the task is handed to a person.
    assert eng.run(task_id, model=ScriptedModel([{"text": "hmm"}] * 4, profile="anthropic")).state == "needs_human"
    assert refused(lambda: eng.redrive(task_id, "eligible", actor="olga", reason="x")).code is Code.REDRIVE_INVALID
    assert refused(lambda: eng.redrive(task_id, "executing", actor="olga", reason="x")).code is Code.REDRIVE_INVALID
    error = refused(lambda: eng.redrive(task_id, "collecting_information", actor="bob", reason="x"))
    assert error.code is Code.FORBIDDEN and "refund_operator" in error.message  # the workflow's operator_role
    eng.redrive(task_id, "collecting_information", actor="olga", reason="model fixed")
    to_approval(eng, task_id)
    assert eng.replay(task_id).ok, eng.replay(task_id).findings
    assert books.payments.requests() == []


def test_a_refund_whose_payment_happened_is_never_redriven_to_pay_it_again(eng: Engine, books: fakes.Systems) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    to_approval(eng, task_id)
    action_id = approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    assert eng.run(task_id).state == "retryable_failure"
    eng.fire(task_id, "give_up", actor="olga")  # to needs_human, the outcome still unknown
    before = heads(eng)
    for target in ("collecting_information", "executing"):
        error = refused(lambda target=target: eng.redrive(task_id, target, actor="olga", reason="x"))
        assert error.code is Code.WRITE_WOULD_REPEAT and action_id in error.message, target
    eng.settle(task_id, actor="olga", outcome="executed", evidence="provider dashboard")
    before = heads(eng)
    for target in ("collecting_information", "executing"):
        error = refused(lambda target=target: eng.redrive(task_id, target, actor="olga", reason="x"))
        assert error.code is Code.WRITE_WOULD_REPEAT and "executed" in error.message, target
    assert heads(eng) == before
    assert books.payments.executions() == {action_id: 1}


def test_a_refund_the_provider_declined_is_redriven_to_its_payment_and_paid_once(
    eng: Engine, books: fakes.Systems
) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    to_approval(eng, task_id)
    action_id = approve(eng, task_id)
    books.arm("payments.refund", "remote_error")
    assert eng.run(task_id).state == "retryable_failure"
    eng.fire(task_id, "give_up", actor="olga")
    eng.redrive(task_id, "executing", actor="olga", reason="the provider fixed its outage")
    assert eng.run(task_id).state == "completed"
    assert books.payments.executions() == {action_id: 1}
    assert eng.replay(task_id).ok, eng.replay(task_id).findings


# -- replay of forks and redrives ---------------------------------------------------------------------------


def rewrite_first(db_url: str, first: Event, data: dict[str, Any]) -> None:
    """An insider rewrites a fork's first event with `data` and recomputes its hash (and the row's head)."""
    event = seal(
        task_id=first.task_id,
        seq=1,
        at=first.at,
        actor=first.actor,
        from_state=None,
        trigger=first.trigger,
        to_state=first.to_state,
        data=as_event_data(data),
        prev_hash=first.prev_hash,
    )
    task = first.task_id
    tamper(
        db_url,
        "UPDATE events SET data = :d, hash = :h WHERE task_id = :t AND seq = 1",
        d=canonical_json(data),
        h=event.hash,
        t=task,
    )
    tamper(db_url, "UPDATE tasks SET last_hash = :h WHERE task_id = :t AND seq = 1", h=event.hash, t=task)
    tamper(db_url, "DELETE FROM snapshots WHERE task_id = :t", t=task)


def test_an_edited_fork_origin_is_found_by_replay(eng: Engine, db_url: str) -> None:
    source = rejected_by_the_model(eng)
    fork = eng.fork(source, 3, actor="olga", reason="again", version=1)
    first = eng.history(fork)[0]

    def rewrite(data: dict[str, Any]) -> None:
        rewrite_first(db_url, first, data)

    origin: dict[str, Any] = dict(first.data)
    rewrite({**origin, "forked_from": {**origin["forked_from"], "hash": "0" * 64}})
    report = eng.replay(fork)
    assert report.codes == ["FORK_ORIGIN_MISMATCH"] and "holds hash" in report.findings[0].message

    facts = {**origin["carried"]["facts"], "assess_eligibility": {"order_id": "O-1001", "finding": "forged"}}
    rewrite({**origin, "carried": {**origin["carried"], "facts": facts}})
    report = eng.replay(fork)
    assert report.codes == ["FORK_ORIGIN_MISMATCH"] and "facts" in report.findings[0].message

    rewrite({**origin, "forked_from": {**origin["forked_from"], "task_id": "gone"}})
    assert eng.replay(fork).codes == ["FORK_ORIGIN_MISSING"]

    rewrite(dict(origin))
    assert eng.replay(fork).ok
    tamper(db_url, "UPDATE events SET actor = 'mallory' WHERE task_id = :t AND seq = 3", t=source)
    assert "FORK_ORIGIN_MISMATCH" in eng.replay(fork).codes  # the source's event at that seq no longer hashes so


def test_a_forged_redrive_to_a_state_the_task_never_was_in_is_found_by_replay(flow: Engine) -> None:
    from tests.support.insider import forge

    task_id = limited(flow)
    forge(flow, task_id, trigger="redrive", to_state="working~force", data={"reason": "x"})
    report = flow.replay(task_id)
    assert report.codes == ["ILLEGAL_TRANSITION"] and "redriven to" in report.findings[0].message


# -- the command line ---------------------------------------------------------------------------------------

runner = CliRunner()


@pytest.fixture
def cli(db_url: str, books: fakes.Systems, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    roles = tmp_path / "roles.toml"
    roles.write_text('[users]\ndana = ["refund_approver"]\nolga = ["refund_operator"]\n', encoding="utf-8")
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "workflows")
    monkeypatch.setenv("RAILYARD_ROLES_FILE", str(roles))
    with reference.reference_engine(db_url) as engine:
        yield engine


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_fork_and_redrive_on_the_command_line_with_their_exit_codes(
    cli: Engine, books: fakes.Systems, db_url: str
) -> None:
    source = rejected_by_the_model(cli)
    code, out, _ = invoke("fork", source, "--at", "3", "--version", "1", "--as", "olga", "--reason", "again")
    assert code == EXIT_OK
    fork = out.strip()
    assert cli.history(fork)[0].data["forked_from"]["task_id"] == source
    code, _, err = invoke("fork", source, "--at", "5", "--as", "olga", "--reason", "again")
    assert code == EXIT_REFUSED and "WRITE_WOULD_REPEAT" in err  # its first fork is still running
    cli.cancel(fork, actor="olga", reason="done with it")
    code, out, _ = invoke("fork", source, "--at", "5", "--as", "olga", "--reason", "again", "--json")
    shown = json.loads(out)
    assert code == EXIT_OK and shown["task_id"] not in (source, fork)
    assert (shown["state"], shown["version"], shown["seq"]) == ("eligible", 2, 1)
    code, _, err = invoke("fork", source, "--at", "99", "--as", "olga", "--reason", "again")
    assert code == EXIT_REFUSED and "FORK_INVALID" in err
    code, _, err = invoke("fork", source, "--at", "x", "--as", "olga", "--reason", "again")
    assert code == EXIT_USAGE and "Traceback" not in err
    code, _, err = invoke("fork", "no-such-task", "--at", "1", "--as", "olga", "--reason", "again")
    assert code == EXIT_REFUSED and "TASK_NOT_FOUND" in err

    task_id = cli.start("refund", DAMAGED, actor="ann", version=1)
    assert cli.run(task_id, model=ScriptedModel([{"text": "hmm"}] * 4, profile="anthropic")).state == "needs_human"
    code, _, err = invoke("redrive", task_id, "--to", "collecting_information", "--as", "bob", "--reason", "x")
    assert code == EXIT_REFUSED and "FORBIDDEN" in err
    code, _, err = invoke("redrive", task_id, "--to", "eligible", "--as", "olga", "--reason", "x")
    assert code == EXIT_REFUSED and "REDRIVE_INVALID" in err
    code, out, _ = invoke(
        "redrive", task_id, "--to", "collecting_information", "--as", "olga", "--reason", "x", "--json"
    )
    assert code == EXIT_OK and json.loads(out)["state"] == "collecting_information"

    # Replay exits 3 on a forged origin, as on any finding.
    assert invoke("replay", fork)[0] == EXIT_OK
    first = cli.history(fork)[0]
    claim: dict[str, Any] = dict(first.data["forked_from"])
    rewrite_first(db_url, first, {**first.data, "forked_from": {**claim, "seq": 2}})
    code, out, _ = invoke("replay", fork)
    assert code == EXIT_AUDIT and "FORK_ORIGIN_MISMATCH" in out


# -- the HTTP API -------------------------------------------------------------------------------------------


def test_fork_and_redrive_over_http_with_their_statuses(db_url: str) -> None:
    tokens = token_table()
    with Engine(db_url, Registry([FLOW_V1, FLOW_V2]), authoriser=tokens) as engine:
        task_id = limited(engine)
        gone = limited(engine)
        engine.cancel(gone, actor="olga", reason="given up")  # a fork is of a task that ended
        app = create_app(engine, tokens, session_secret="test-secret")
        with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            running = http.post(f"/api/tasks/{task_id}/fork", json={"at_seq": 1, "reason": "x"}, headers=bearer("olga"))
            assert (running.status_code, running.json()["code"]) == (422, "FORK_INVALID")
            forked = http.post(
                f"/api/tasks/{gone}/fork",
                json={"at_seq": 1, "reason": "start over", "version": 1},
                headers=bearer("olga"),
            )
            assert forked.status_code == 201, forked.text
            body = forked.json()
            assert forked.headers["Location"] == f"/api/tasks/{body['task_id']}"
            assert (body["state"], body["seq"], body["version"]) == ("working", 1, 1)
            assert engine.history(body["task_id"])[0].data["forked_from"]["task_id"] == gone

            before = heads(engine)
            bad = http.post(f"/api/tasks/{task_id}/fork", json={"at_seq": 99, "reason": "x"}, headers=bearer("olga"))
            assert (bad.status_code, bad.json()["code"]) == (422, "FORK_INVALID")
            bad = http.post(f"/api/tasks/{task_id}/fork", json={"at_seq": 0, "reason": "x"}, headers=bearer("olga"))
            assert bad.status_code == 422
            url_redrive = f"/api/tasks/{task_id}/redrive"
            bad = http.post(url_redrive, json={"to_state": "working", "reason": "x"}, headers=bearer("bob"))
            assert (bad.status_code, bad.json()["code"]) == (404, "TASK_NOT_FOUND")  # no role in flow: absent
            bad = http.post(url_redrive, json={"to_state": "working", "reason": "x"}, headers=bearer("audrey"))
            assert (bad.status_code, bad.json()["code"]) == (403, "FORBIDDEN")  # reads, never acts
            bad = http.post(url_redrive, json={"to_state": "done", "reason": "x"}, headers=bearer("olga"))
            assert (bad.status_code, bad.json()["code"]) == (422, "REDRIVE_INVALID")
            stale = {**bearer("olga"), "If-Match": '"1"'}
            bad = http.post(url_redrive, json={"to_state": "working", "reason": "x"}, headers=stale)
            assert bad.status_code == 412
            assert heads(engine) == before

            done = http.post(
                url_redrive, json={"to_state": "working", "reason": "budget raised"}, headers=bearer("olga")
            )
            assert done.status_code == 200, done.text
            assert (done.json()["state"], done.headers["ETag"]) == ("working", f'"{engine.get(task_id).seq}"')


def test_a_fork_is_checked_against_its_source_in_the_archive_and_a_lost_archive_is_found(
    db_url: str, books: fakes.Systems, tmp_path: Path
) -> None:
    registry = Registry([REFUND_V1, REFUND_V2])
    with Engine(db_url, registry, authoriser=StaticRoles(reference.ROLES), archive_dir=tmp_path) as engine:
        source = rejected_by_the_model(engine)
        at = seq_of(engine, source, "assess_eligibility")
        ended = engine.fork(source, at, actor="olga", reason="again", version=1)
        model = ScriptedModel([call("reject", reason="Still wear, not transit damage.")], profile="anthropic")
        assert engine.run(ended, model=model).state == "rejected"
        waiting = engine.fork(source, at, actor="olga", reason="and again", version=1)  # stays in `eligible`
        engine.audit.archive(now() + timedelta(seconds=1))
        assert engine.store.archive_of(source) is not None and engine.store.archive_of(ended) is not None
        assert engine.store.events(source) == [] and engine.store.archive_of(waiting) is None
        for task_id in (waiting, ended, source):
            assert engine.replay(task_id).ok, engine.replay(task_id).findings
        assert all(r.ok for r in engine.audit.replay_all())

        for file in tmp_path.iterdir():  # the archive is lost: where the forks came from cannot be proven
            file.rename(file.with_suffix(".gone"))
        report = engine.replay(waiting)
        assert report.codes == ["FORK_ORIGIN_MISSING"] and source in report.findings[0].message


def test_where_a_redrive_may_leave_from_and_go_to_is_read_from_the_definition() -> None:
    assert REFUND_V1.redrive_sources() == {
        "needs_human",  # the agents' on_exhausted state
        "limit_exceeded",
        "collecting_information~provider_error",
        "eligible~provider_error",
    }
    assert REFUND_V1.redrive_targets() == {"collecting_information", "looking_up_order", "eligible", "executing"}
    assert FLOW_V1.redrive_sources() == {"working~handoff", "working~provider_error", "limit_exceeded"}
    # A role of its own is part of the definition's digest, and only when it is set.
    assert replace(FLOW_V1, redrive_role="operator").digest != FLOW_V1.digest
    assert replace(FLOW_V1, redrive_role=None).digest == FLOW_V1.digest


def drive(eng: Engine, task_id: str) -> str:
    """Take a task as far as a willing model and approver can: the model proposes the refund, erin approves and
    retries. Returns where it stops."""
    model = ScriptedModel(
        {
            "by_state": {
                "collecting_information": [
                    call("query_order", order_id="O-1001"),
                    call("assess_eligibility", order_id="O-1001", finding="Delivered damaged; photo EV-1 shows it."),
                ],
                "eligible": [refund(12_999)],
            }
        },
        profile="anthropic",
    )
    for _ in range(10):
        task = eng.run(task_id, model=model, max_turns=5)
        if task.state == "awaiting_approval" and task.prepared is not None:
            eng.approve(task_id, actor="erin", prepared_digest=task.prepared["digest"])
        elif task.state == "retryable_failure":
            eng.fire(task_id, "retry_refund", actor="otto")
        else:
            return task.state
    return eng.get(task_id).state


def test_no_fork_of_a_paid_refund_at_any_seq_pays_it_again(eng: Engine, books: fakes.Systems) -> None:
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    to_approval(eng, task_id)
    action_id = approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    assert eng.run(task_id).state == "retryable_failure"
    eng.settle(task_id, actor="olga", outcome="executed", evidence="provider dashboard")
    eng.fire(task_id, "retry_refund", actor="olga")
    assert eng.run(task_id).state == "completed"
    allowed = []
    for seq in range(1, eng.get(task_id).seq + 1):
        try:
            fork = eng.fork(task_id, seq, actor="olga", reason="every seq", version=1)
        except RailyardError as error:
            assert error.code in (Code.WRITE_WOULD_REPEAT, Code.FORK_INVALID), (seq, error)
            continue
        allowed.append((seq, eng.get(fork).state, drive(eng, fork)))
        assert eng.replay(fork).ok, (seq, eng.replay(fork).findings)
    # Only the forks after the payment's outcome was on record went ahead, and they recorded it without paying.
    assert [(state, end) for _seq, state, end in allowed] == [
        ("retryable_failure", "completed"),
        ("executing", "completed"),
    ]
    assert books.payments.executions() == {action_id: 1}


def test_a_running_task_is_never_forked_and_a_second_fork_waits_for_the_first_to_end_unpaid(
    eng: Engine, books: fakes.Systems
) -> None:
    """From an attacker's review: a fork of a task that goes on, or two forks of one source, could each reach a
    refund neither had prepared when it was forked, and each would pay it."""
    running = eng.start("refund", DAMAGED, actor="ann", version=1)
    early = refused(lambda: eng.fork(running, 1, actor="olga", reason="a second try alongside"))
    assert early.code is Code.FORK_INVALID and "still running" in early.message

    source = rejected_by_the_model(eng)
    at = seq_of(eng, source, "assess_eligibility")
    first = eng.fork(source, at, actor="olga", reason="the rejection was wrong", version=1)
    assert eng.run(first, model=ScriptedModel([refund(6_000)], profile="anthropic")).state == "awaiting_approval"
    action_id = approve(eng, first)
    assert eng.run(first).state == "completed"
    second = refused(lambda: eng.fork(source, at, actor="olga", reason="once more", version=1))
    assert second.code is Code.WRITE_WOULD_REPEAT and first in second.message and action_id in second.message
    assert books.payments.executions() == {action_id: 1}  # one refund for the one request


def test_a_forged_fork_or_redrive_the_engine_would_refuse_is_found_by_replay(eng: Engine, books: fakes.Systems) -> None:
    """From an attacker's review: events written the way the engine writes them, at points it refuses (a fork of
    a task that went on, from before its payment; a redrive back past a payment): replay applies the engine's
    write rules again."""
    from engine.core.canonical import GENESIS_HASH, now
    from engine.core.definition import FORK
    from engine.core.events import seal
    from engine.core.forks import fork_data
    from engine.store import TaskRow
    from tests.support.insider import forge

    # A payment whose reply was lost, given up and settled `executed` by an approver.
    task_id = eng.start("refund", DAMAGED, actor="ann", version=1)
    to_approval(eng, task_id)
    approve(eng, task_id)
    books.arm("payments.refund", "lost_reply")
    assert eng.run(task_id).state == "retryable_failure"
    eng.fire(task_id, "give_up", actor="olga")
    eng.settle(task_id, actor="olga", outcome="executed", evidence="provider dashboard")

    point = seq_of(eng, task_id, "assess_eligibility")  # before the payment, of a task that goes on
    assert refused(lambda: eng.fork(task_id, point, actor="olga", reason="x")).code is Code.FORK_INVALID
    source = eng.audit.as_of(task_id, seq=point)
    at = now()
    first = seal(
        task_id="forged-fork",
        seq=1,
        at=at,
        actor="mallory",
        from_state=None,
        trigger=FORK,
        to_state=source.state,
        data=fork_data(eng.definition_of(source), source, source.digest, "again", source.usage.get("started_at")),
        prev_hash=GENESIS_HASH,
    )
    row = TaskRow(
        task_id="forged-fork",
        workflow="refund",
        version=1,
        digest=source.digest,
        state=source.state,
        status="runnable",
        seq=1,
        last_hash=first.hash,
        created_at=at,
        updated_at=at,
        next_run_at=at,
    )
    eng.store.create(row, first)
    report = eng.replay("forged-fork")
    assert report.codes == ["FORK_ORIGIN_MISMATCH"] and "a fork the engine refuses" in report.findings[0].message

    # A redrive back to the agent state would propose the payment again: the engine refuses it, and replay
    # finds a forged one.
    back = refused(lambda: eng.redrive(task_id, "collecting_information", actor="olga", reason="x"))
    assert back.code is Code.WRITE_WOULD_REPEAT
    entered = next(e.seq for e in reversed(eng.history(task_id)) if e.to_state == "collecting_information")
    forge(
        eng,
        task_id,
        trigger="redrive",
        to_state="collecting_information",
        data={"reason": "x", "redrive_from_seq": entered, "reset": {}},
    )
    report = eng.replay(task_id)
    assert "ILLEGAL_TRANSITION" in report.codes
    assert any("a redrive the engine refuses" in f.message for f in report.findings)
