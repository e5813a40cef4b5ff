"""A hypothesis state machine drives starts, fires, cancels and conflicting appends against the real store.

After every step, for every task it started: seq is gap-free, nothing follows a
terminal state, the fold of the whole log equals both the task row and the
engine's (snapshot-based) load, every snapshot equals a fold from zero up to
its seq, and the hash chain verifies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from engine import (
    ConcurrencyConflict,
    Engine,
    RailyardError,
    Registry,
    ScriptedModel,
    StaticRoles,
    TaskState,
    fold,
    verify_chain,
)
from engine.core.canonical import parse_instant
from engine.providers.scripted import call
from engine.runtime.agent import AgentRunner, RetryPolicy
from tests.support.provider_server import no_sleep
from tests.support.sample_workflows import ROLES, all_workflows

TRIGGERS = [
    "propose",
    "give_up",
    "note",
    "approve",
    "reject",
    "resume",
    "close",
    "tick",
    "finish",
    "succeeded",
    "failed",
    "unknown",
    "expired",
    "cancel",
    "bogus",
]
ACTORS = ["model", "dana", "olga", "bob", "system"]
#: What a model turn may meet: answers, failures calling again may fix, and one it cannot.
MODEL_ANSWERS: list[dict[str, Any]] = [
    call("tick", n=1),
    call("finish"),
    {"text": "no action"},
    {"error": {"status": 500, "type": "server_error", "message": "upstream overloaded"}},
    {"error": {"status": 429, "message": "slow down", "retry_after": 7}},
    {"error": {"status": 401, "type": "authentication_error", "message": "bad key"}},
]
ONE_CALL = RetryPolicy(attempts=1, base_delay=0.0, sleep=no_sleep)

payloads = st.one_of(
    st.just({}),
    st.fixed_dictionaries({"amount": st.integers(-5, 900), "reason": st.sampled_from(["late", ""])}),
    st.fixed_dictionaries({"note": st.sampled_from(["x", ""])}),
    st.fixed_dictionaries({"n": st.integers(0, 9)}),
    st.fixed_dictionaries({"reason": st.sampled_from(["stop", ""])}),
    st.dictionaries(st.sampled_from(["amount", "extra", "actor"]), st.integers(0, 3), max_size=2),
)


class StoreMachine(RuleBasedStateMachine):
    url: str = ""
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.registry = Registry(all_workflows())
        self.eng = Engine(self.url, self.registry, authoriser=StaticRoles(ROLES), snapshot_every=3)
        self.expected_seq: dict[str, int] = {}

    def teardown(self) -> None:
        self.eng.close()

    @rule(target=tasks, workflow=st.sampled_from(["refund", "counter"]), balance=st.integers(0, 600))
    def start(self, workflow: str, balance: int) -> str:
        payload = {"customer": "c1", "balance": balance} if workflow == "refund" else {}
        task_id = self.eng.start(workflow, payload, actor="ann")
        self.expected_seq[task_id] = 1
        return task_id

    @rule(task_id=tasks, trigger=st.sampled_from(TRIGGERS), payload=payloads, actor=st.sampled_from(ACTORS))
    def fire(self, task_id: str, trigger: str, payload: dict[str, Any], actor: str) -> None:
        before = self._log(task_id)
        try:
            self.eng.fire(task_id, trigger, payload, actor=actor)
        except RailyardError as refusal:
            assert refusal.code.value.isupper()
            assert self._log(task_id) == before, "a refusal must leave the log unchanged"
            return
        self.expected_seq[task_id] += 1

    @rule(task_id=tasks, outcome=st.sampled_from(["succeeded", "failed", "unknown", "expired"]))
    def engine_fires(self, task_id: str, outcome: str) -> None:
        """The engine's own components (tool runner, timers) fire outcomes and deadlines."""
        before = self._log(task_id)
        try:
            self.eng.transition(self.eng.load(task_id), outcome, {}, actor="system", system=True)
        except RailyardError as refusal:
            assert refusal.code in {"TRIGGER_NOT_ALLOWED", "TASK_TERMINAL"}
            assert self._log(task_id) == before
            return
        self.expected_seq[task_id] += 1

    @rule(task_id=tasks)
    def cancel(self, task_id: str) -> None:
        terminal = self.eng.load(task_id).terminal
        try:
            self.eng.cancel(task_id, actor="ann", reason="stop")
        except RailyardError as refusal:
            assert terminal and refusal.code == "TASK_TERMINAL"
            return
        assert not terminal
        self.expected_seq[task_id] += 1

    @rule(task_id=tasks, answer=st.sampled_from(MODEL_ANSWERS))
    def model_turn(self, task_id: str, answer: dict[str, Any]) -> None:
        """A model turn, answered or failed: transient failures are durable backoffs (issue #30), whose due time
        the row is put off until."""
        task = self.eng.load(task_id)
        try:
            after = AgentRunner(self.eng, ScriptedModel([answer]), retry=ONE_CALL).step(task)
        except RailyardError as refusal:
            assert refusal.code == "STATE_NOT_AGENT"
            return
        self.expected_seq[task_id] += after.seq - task.seq
        row = self.eng.store.row(task_id)
        assert row is not None
        if self.eng.history(task_id)[-1].trigger == "backoff":
            assert row.next_run_at == parse_instant(after.visit["due_at"]) > self.eng.history(task_id)[-1].at

    @rule(task_id=tasks, first=st.sampled_from(["note", "tick", "cancel"]))
    def conflicting_append(self, task_id: str, first: str) -> None:
        """Two writers hold the same head; the second append must conflict and write nothing."""
        held = self.eng.load(task_id)
        payload = {"note": "a"} if first == "note" else {"n": 1} if first == "tick" else {"reason": "stop"}
        try:
            self.eng.transition(held, first, payload, actor="model")
        except RailyardError:
            return  # not allowed in this state: nothing to race
        self.expected_seq[task_id] += 1
        after_first = self._log(task_id)
        try:
            self.eng.transition(held, "cancel", {"reason": "late writer"}, actor="ann")
        except ConcurrencyConflict:
            pass
        except RailyardError as refusal:  # refused before the append (e.g. the held task was terminal)
            assert refusal.code in {"TASK_TERMINAL"}
        else:
            raise AssertionError("a stale writer's append succeeded")
        assert self._log(task_id) == after_first

    def _log(self, task_id: str) -> list[tuple[int, str]]:
        return [(e.seq, e.hash) for e in self.eng.history(task_id)]

    @invariant()
    def every_log_holds_together(self) -> None:
        for task_id, expected in self.expected_seq.items():
            events = self.eng.history(task_id)
            assert [e.seq for e in events] == list(range(1, expected + 1))
            assert verify_chain(events) == []
            definition = self.registry.find(
                events[0].data["workflow"].split("@")[0], int(events[0].data["workflow"].split("@")[1])
            )
            assert definition is not None
            terminal_at = [e.seq for e in events if definition.status_of(e.to_state) == "terminal"]
            assert not terminal_at or terminal_at == [events[-1].seq], "an event follows a terminal state"
            full = fold(definition, events)
            row = self.eng.store.row(task_id)
            assert row is not None
            assert (full.state, full.seq, full.last_hash, str(full.status)) == (
                row.state,
                row.seq,
                row.last_hash,
                row.status,
            )
            assert self.eng.load(task_id) == full
            for snap in self.eng.store.snapshots(task_id):
                assert TaskState.from_doc(json.loads(snap.doc)) == fold(definition, events[: snap.seq])


@pytest.mark.parametrize("examples", [30])
def test_store_invariants_hold_under_random_operations(db_url: str, examples: int) -> None:
    StoreMachine.url = db_url
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=examples, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
        ),
    )
