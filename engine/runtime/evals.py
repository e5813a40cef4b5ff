"""Run evaluation cases (`engine.core.evals`) through the real agent runner, writing nothing anywhere.

A case's task is put before a model by `AgentRunner`, the runner every worker uses: the same forcing ladder,
the same proposal checks, schema and guards of the current definition, the same repairs and escalations. Its
steps go to a `Sandbox` instead of the engine: a `TaskPort` that seals and folds each event in memory, so no
task log, no database and no tool is touched, and the events it keeps are read with the quality fold
(`engine.core.quality`), the figures `railyard quality` prints for real tasks.

Its model calls go through the worker's flow control when one is given (`flow`, `Engine.flow_control`): the shared
circuit breaker and quotas of the (provider, model), so an evaluation run beside live workers takes its share of
the same quota instead of adding to it unseen. Without a lease, a call short of quota waits in the process (a
sleep), and a provider's `retry-after` is waited out as a worker would: within the runner's retries, or, when it
asks for longer, as the durable backoff the sandbox records, slept through before the next turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.canonical import now
from engine.core.decide import Decision, decide
from engine.core.definition import Agent, Workflow
from engine.core.errors import Category, RailyardError
from engine.core.evals import Expectation, expectation, task_of
from engine.core.events import Event
from engine.core.fold import apply
from engine.core.model_interface import ModelAdapter
from engine.core.payloads import EventData
from engine.core.quality import TurnFigures, base_state, fold_quality
from engine.core.retries import waiting
from engine.core.rows import TaskRow
from engine.core.task import TaskState
from engine.runtime.agent import AgentRunner, RetryPolicy
from engine.runtime.flow import Flow

__all__ = ["CaseResult", "Sandbox", "run_case", "totals"]


class Sandbox:
    """A `TaskPort` that appends nowhere: each decided step is sealed and folded in memory, and kept in `events`."""

    def __init__(self, definition: Workflow) -> None:
        self.definition = definition
        self.events: list[Event] = []

    def load(self, task_id: str) -> TaskState:
        raise LookupError(f"{task_id}: an evaluation's task lives only in its run")

    def definition_of(self, task: TaskState) -> Workflow:
        return self.definition

    def commit(self, task: TaskState, decision: Decision, *, actor: str) -> TaskState:
        event = decision.sealed(task, actor, now())
        self.events.append(event)
        return apply(self.definition, task, event)

    def commit_system(self, task: TaskState, trigger: str, data: EventData, *, actor: str) -> TaskState:
        decision = decide(self.definition, task, trigger, None, actor=actor, system=True)
        return self.commit(task, replace(decision, data={**decision.data, **data}), actor=actor)


@dataclass(frozen=True)
class CaseResult:
    """What one case came to with one model."""

    name: str
    model: str
    #: The action the model's accepted proposal named (None: none was accepted: the repairs ran out, or the
    #: provider failed).
    action: str | None
    expected: str | None
    #: Where the task ended: the state the action led to, or the state a person picks it up in.
    ended_in: str
    #: Each turn's rung and code (None: accepted), in order.
    turns: list[dict[str, Any]]
    figures: TurnFigures
    seconds: float
    #: Why the case could not be decided (a guard failed on a value the case does not hold), if it could not.
    error: str | None = None
    events: list[Event] = field(repr=False, default_factory=list)
    #: The workflow version the case ran against.
    version: int = 0
    #: The accepted proposal's arguments, as the log would hold them (sensitive fields redacted).
    args: dict[str, Any] | None = None
    expectation: Expectation = field(default_factory=Expectation)

    @property
    def unmet(self) -> list[str]:
        """Why the answer does not meet the case's expectation (empty: it does, or the case expects nothing)."""
        if self.error is not None:
            return [self.error]
        return self.expectation.unmet(self.action, self.args, self.figures.first_try_accepted > 0)

    @property
    def met(self) -> bool | None:
        """Whether the answer met the case's expectation (None: the case expects nothing)."""
        return not self.unmet if self.expectation.any else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "model": self.model,
            "version": self.version,
            "action": self.action,
            "expected": self.expected,
            "met": self.met,
            "unmet": self.unmet if self.expectation.any else [],
            "ended_in": self.ended_in,
            "turns": self.turns,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            **{k: v for k, v in self.figures.to_dict().items() if k not in ("turns",)},
        }


def run_case(
    definition: Workflow,
    case: Mapping[str, Any],
    adapter: ModelAdapter,
    *,
    name: str = "case",
    thinking: bool = False,
    retry: RetryPolicy | None = None,
    max_turns: int = 20,
    flow: Flow | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> CaseResult:
    """Put `case` before `adapter` until it proposes an action that is accepted, or its task leaves the case's agent
    state (the repairs ran out, the provider failed), or `max_turns` turns were taken. With `flow`, each call
    passes the breaker and quotas every worker shares; a backoff the provider asked for is slept through."""
    task = task_of(definition, case)
    wanted = expectation(case)
    sandbox = Sandbox(definition)
    runner = AgentRunner(sandbox, adapter, thinking=thinking, retry=retry, flow=flow)
    state = base_state(task.state)
    started = time.monotonic()
    error = None
    try:
        for _ in range(max_turns):
            if task.terminal or base_state(task.state) != state or not isinstance(definition.state(task.state), Agent):
                break
            if (due := waiting(task.visit, now())) > 0:  # a durable backoff (a long retry-after): wait it out here
                sleep(due)
            task = runner.step(task)
            if "proposal" in sandbox.events[-1].data:  # the model decided (an action may keep the task where it is)
                break
    except RailyardError as failed:
        if failed.code.category is Category.CONFIG:
            raise  # the process is set up wrong: no case can run
        error = f"{failed.code}: {failed.message}"
    except Exception as failed:  # a guard that cannot read the case (a value redacted from it): this case's failure
        error = f"{type(failed).__name__}: {failed}"
    seconds = time.monotonic() - started
    row = TaskRow(
        task.task_id, definition.name, definition.version, definition.digest, task.state, "", 0, "", now(), now()
    )
    figures = fold_quality([row, *sandbox.events])
    totals = TurnFigures()
    for found in figures.turns.values():  # one key per rung the ladder used
        _add(totals, found)
    proposed = next((e for e in sandbox.events if "proposal" in e.data), None)
    accepted = proposed.data["proposal"]["action"] if proposed is not None else None
    turns = [
        {"rung": e.data["turn"]["strategy"], "code": e.data["turn"].get("code")}
        for e in sandbox.events
        if "turn" in e.data
    ]
    return CaseResult(
        name,
        runner.actor.removeprefix("model:"),
        accepted,
        wanted.action,
        task.state,
        turns,
        totals,
        seconds,
        error,
        sandbox.events,
        definition.version,
        dict(proposed.data.get("args") or {}) if proposed is not None else None,
        wanted,
    )


def variant(result: CaseResult, results: Sequence[CaseResult]) -> str:
    """What a result's figures are totalled under: its model, and its workflow version when the run compared
    several versions (`scripted:small v2`)."""
    several = len({(r.name, r.version) for r in results}) > len({r.name for r in results})
    return f"{result.model} v{result.version}" if several else result.model


def totals(results: Sequence[CaseResult]) -> dict[str, dict[str, Any]]:
    """Each variant's totals (`variant`): cases, expectations met of those that expect something, cases accepted at
    the first try, repairs and turns, and the two shares the gate compares (`engine.core.evals.regressions`)."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        t = out.setdefault(
            variant(r, results),
            {"cases": 0, "expected": 0, "met": 0, "first_try_accepted": 0, "repairs": 0, "turns": 0, "tokens": 0},
        )
        t["cases"] += 1
        t["expected"] += r.met is not None
        t["met"] += bool(r.met)
        t["first_try_accepted"] += r.figures.first_try_accepted > 0
        t["repairs"] += r.figures.repairs
        t["turns"] += r.figures.turns
        t["tokens"] += r.figures.tokens["input_tokens"] + r.figures.tokens["output_tokens"]
    for t in out.values():
        t["met_share"] = round(t["met"] / t["expected"], 4) if t["expected"] else None
        t["first_try_share"] = round(t["first_try_accepted"] / t["cases"], 4)
    return dict(sorted(out.items()))


def _add(total: TurnFigures, more: TurnFigures) -> None:
    for name in TurnFigures.__slots__:
        value = getattr(more, name)
        if isinstance(value, int | float):
            setattr(total, name, getattr(total, name) + value)
        else:
            getattr(total, name).update(value)
