"""One model turn in an agent state: build the request, call the model, append exactly one event.

This is the I/O around the pure parts (`forcing` builds the request,
`proposal` reads the answer, `decide` checks it). Whatever happens (a valid
proposal, an invalid one, a request shape the provider refused, a provider
failure) the turn ends in one event whose data says which strategy was used,
what was proposed and the code if any. No database transaction is open while
the model is called.

A turn is one coroutine (`AgentRunner.turn`): the model call is awaited, and the
append goes through the runner's `Offload` (in place for `Engine.run`, on the
worker's store threads for a worker), so the same code serves both.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from engine.core.budgets import exceeded
from engine.core.canonical import now
from engine.core.decide import Decision
from engine.core.definition import BACKOFF, DEMOTE, LIMIT, PROVIDER_ERROR, Agent
from engine.core.errors import Code, Refused
from engine.core.forcing import (
    MODE_OF_RUNG,
    STRICT_SCHEMA,
    Rung,
    build_request,
    choose_rung,
    demotion_key,
    escalate,
    model_actions,
    refused_shape,
    remembered_rung,
    reminder_message,
)
from engine.core.model_errors import REQUEST_SHAPE, ModelError, provider_said
from engine.core.model_interface import ModelAdapter, ModelRequest, ModelResponse
from engine.core.payloads import EventData, TokenUsage, Turn
from engine.core.profiles import CapabilityProfile, load_profiles, profile_for
from engine.core.proposal import interpret
from engine.core.retries import BASE_SECONDS, CAP_SECONDS, durable_delay, next_retry, waiting
from engine.core.task import TaskState
from engine.observability import hooks
from engine.runtime.flow import WAITED, Flow
from engine.runtime.offload import INLINE, Offload, run_sync
from engine.runtime.port import TaskPort

log = logging.getLogger("railyard.agent")
_RUNG_NAMES = frozenset(str(rung) for rung in Rung)


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for a call that failed in a way calling again may fix (`ModelError.retryable`): a separate budget
    that never spends repairs.

    First `attempts` calls in the process, with short waits. When they all fail, or the provider asks for a
    longer wait than `max_retry_after`, the turn ends in a durable `backoff` (`engine.core.retries`), due after
    `durable_delay(n)` seconds (from `durable_base`, doubling up to `durable_cap`), never sooner than the
    provider asked; the agent state's `retry_budget` bounds how many.
    """

    attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    #: The longest a provider's `retry-after` is waited for in the process; one that asks for longer ends the
    #: in-process retries, and the wait becomes a durable backoff (never a call sooner than it said).
    max_retry_after: float = 5.0
    durable_base: float = BASE_SECONDS
    durable_cap: float = CAP_SECONDS
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    def delay(self, attempt: int, retry_after: float | None = None) -> float | None:
        """Full jitter: uniform in [0, min(max, base * 2^attempt)], but never sooner than the provider's
        `retry_after`; None when that is longer than this policy waits."""
        jitter = random.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))
        if retry_after is None:
            return jitter
        if retry_after > self.max_retry_after:
            return None
        return max(jitter, retry_after)


@dataclass
class LadderMemory:
    """What the forcing ladder learned in this process, shared by every task its runner serves: request shapes a
    provider refused and rungs that worked after escalating, each keyed `profile:model:thinking:rung`. Each task's
    log remembers its own too, so a restarted process does not re-send them for that task."""

    refused_shapes: set[str] = field(default_factory=set)
    worked_rungs: set[str] = field(default_factory=set)
    #: By task id: a shape refused by an error that did not name it, waiting for the task's next call to confirm it
    #: (answered without it) before `refused_shapes` gets it.
    unconfirmed_shapes: dict[str, str] = field(default_factory=dict)


class AgentRunner:
    """Runs model turns for tasks in agent states, with one adapter and one thinking setting. The ladder's memory
    is the runner's (`memory`): a new runner for the same process may be handed the last one's."""

    def __init__(
        self,
        engine: TaskPort,
        adapter: ModelAdapter,
        *,
        thinking: bool = False,
        retry: RetryPolicy | None = None,
        profiles: dict[str, CapabilityProfile] | None = None,
        io: Offload = INLINE,
        memory: LadderMemory | None = None,
        flow: Flow | None = None,
    ) -> None:
        self.engine = engine
        #: The breaker and quotas every worker shares (None: calls go straight to the adapter).
        self.flow = flow
        self.memory = memory if memory is not None else LadderMemory()
        self.adapter = adapter
        #: Where the appends (and a synchronous adapter's call) run: in place, or on a worker's threads.
        self.io = io
        retries = getattr(adapter, "retries", None)  # the adapter's settings (`ModelSettings.retries`)
        self.retry = retry or (RetryPolicy(attempts=1 + retries) if isinstance(retries, int) else RetryPolicy())
        provider = getattr(adapter, "profile", None) or adapter.provider
        self.profile = profile_for(provider, adapter.model, profiles if profiles is not None else load_profiles())
        #: As requested, except for a model that always thinks: the ladder, the memory and the event use this.
        self.thinking = self.profile.thinks(adapter.model, thinking)
        self.requested_thinking = thinking
        self.actor = f"model:{adapter.provider}:{adapter.model}"

    def run(self, task: TaskState, *, max_turns: int = 50) -> TaskState:
        for _ in range(max_turns):
            definition = self.engine.definition_of(task)
            if task.terminal or not isinstance(definition.state(task.state), Agent) or waiting(task.visit, now()) > 0:
                break  # ended, left the agent states, or a backoff put the next call off
            task = self.step(task)
        return task

    def step(self, task: TaskState) -> TaskState:
        """One turn, for a synchronous caller."""
        return run_sync(self.turn(task))

    async def turn(self, task: TaskState) -> TaskState:
        """One model turn: exactly one event, whatever the model does."""
        definition = self.engine.definition_of(task)
        state = definition.state(task.state)
        if not isinstance(state, Agent) or task.terminal:
            raise Refused(
                f"task {task.task_id} is in {task.state!r}, not an agent state",
                code=Code.STATE_NOT_AGENT,
                task_id=task.task_id,
                state=task.state,
            )
        over = exceeded(definition, task, now())
        if over is not None:
            return await self._commit(task, LIMIT, {"code": str(Code.AGENT_STEP_LIMIT_EXCEEDED), **over})
        refused = set(task.visit.get("demoted", [])) | self.memory.refused_shapes
        n_actions = len(model_actions(state))
        rung = choose_rung(self.profile, self.adapter.model, self.thinking, n_actions, refused, self._start(task))
        request, added = build_request(definition, task, self.profile, self.adapter.model, self.thinking, rung, refused)
        turn: Turn = {
            "strategy": str(rung),
            "model": f"{self.adapter.provider}:{self.adapter.model}",
            "profile": self.profile.name,
            "thinking": self.thinking,
            "mode": MODE_OF_RUNG[rung],
        }
        if learned := self._learned(task, n_actions, rung):
            turn["learned"] = learned
        if request.thinking_switch:
            turn["thinking_switch"] = request.thinking_switch
        try:
            response, attempts, retried = await self._call(request)
        except ModelError as error:
            turn["code"], turn["messages"] = str(error.code), [m.to_dict() for m in added]
            turn["attempts"], turn["seconds"] = error.attempts, error.seconds
            if said := provider_said(error).get("message"):
                turn["provider_message"] = said
            if error.retried:
                turn["retried"] = error.retried
            if error.usage is not None and (spent := error.usage.to_dict()):  # answered, then failed: it counts
                turn["usage"] = cast(TokenUsage, spent)
            # A call that fails after an unconfirmed refusal does not confirm it: the shape stays this task's alone.
            self.memory.unconfirmed_shapes.pop(task.task_id, None)
            shape = refused_shape(self.profile, self.adapter.model, self.thinking, rung, request, error.code)
            if error.code in REQUEST_SHAPE and shape not in refused:
                # Never re-send this shape to this (model, thinking): the next turn takes the next rung its refusal
                # does not rule out (a refused forced tool choice rules out every forced form), the same rung
                # without `strict` when a strict schema was what the provider refused, or the bottom rung without
                # JSON mode. A shape already refused is never demoted again: the request went without it, so the
                # refusal was about something else, and the turn is a provider error (no loop to the turn budget).
                turn["demoted"] = shape
                if error.named:
                    self.memory.refused_shapes.add(shape)  # other tasks on this process skip it too
                else:
                    # The error's fields did not name the shape: only this task skips it, until the same request
                    # without the shape is answered (`unconfirmed_shapes`), which shows the shape was what was refused.
                    turn["shared"] = False
                    self.memory.unconfirmed_shapes[task.task_id] = shape
                return await self._commit(task, DEMOTE, {"turn": turn})
            if not error.retryable:
                return await self._commit(task, PROVIDER_ERROR, {"turn": turn})
            # Calling again may work, later: a durable backoff while the state's budget lasts, then provider_error.
            n = int(task.visit.get("retries", 0)) + 1
            delay = durable_delay(n, error.retry_after, base=self.retry.durable_base, cap=self.retry.durable_cap)
            retry = next_retry(state.retry_budget, task.visit, now(), delay)
            if retry is not None:
                log.info("task %s: model call %s; next try at %s", task.task_id, error.code, retry["due_at"])
                return await self._commit(task, BACKOFF, {"turn": turn, "retry": retry})
            failed: EventData = {"turn": turn}
            if n > 1:  # the budget ran out: say how it was spent
                failed["retries_spent"] = {
                    "n": n - 1,
                    "due_at": str(task.visit.get("due_at") or ""),
                    "since": str(task.visit.get("retrying_since") or ""),
                    "budget": state.retry_budget.spec(),
                }
            return await self._commit(task, PROVIDER_ERROR, failed)
        if (confirmed := self.memory.unconfirmed_shapes.pop(task.task_id, None)) is not None:
            self.memory.refused_shapes.add(confirmed)  # answered without the shape: the refusal was the shape's
        outcome = interpret(definition, task, response, rung, actor=self.actor)
        turn["code"] = str(outcome.code) if outcome.code else None
        messages = [*added, *outcome.messages]
        if outcome.kind == "repair":
            escalation = escalate(
                self.profile,
                self.adapter.model,
                self.thinking,
                n_actions,
                refused,
                rung,
                outcome.code,
                int(task.visit.get("escalations", 0)),
                outcome.errors,
            )
            if escalation is not None:
                turn["escalated"] = escalation.to_dict()
                if escalation.step == "reminder":  # recorded with this turn: the next request carries it
                    messages.append(reminder_message(self.profile, MODE_OF_RUNG[rung], model_actions(state)))
        elif (
            outcome.kind == "accept"
            and task.visit.get("escalations")
            and rung != choose_rung(self.profile, self.adapter.model, self.thinking, n_actions, refused)
        ):
            # Escalating found a rung this model follows: the next visit, and every task here, starts there.
            turn["worked"] = demotion_key(self.profile, self.adapter.model, self.thinking, rung)
            self.memory.worked_rungs.add(turn["worked"])
        turn["messages"] = [m.to_dict() for m in messages]
        if usage := response.usage.to_dict():  # what the provider reported, and nothing when it reported nothing
            turn["usage"] = cast(TokenUsage, usage)
        if attempts > 1:
            turn["attempts"] = attempts
        if retried:
            turn["retried"] = retried
        if outcome.errors:
            turn["errors"] = outcome.errors
        data: EventData = {**outcome.data, "turn": turn}
        if outcome.kind == "accept":
            # `interpret` already decided it (on the real arguments; the data holds them redacted).
            accepted = Decision(outcome.trigger, task.state, outcome.to_state, data)
            return await self.io.store(lambda: self.engine.commit(task, accepted, actor=self.actor))
        return await self._commit(task, outcome.trigger, data)

    def _learned(self, task: TaskState, n_actions: int, rung: Rung) -> list[str]:
        """What other tasks of this process found (refused shapes, rungs that worked) that changed this turn's
        request from the one the task's own log would make: so its log says why it did not start at the top."""
        prefix = demotion_key(self.profile, self.adapter.model, self.thinking, "")
        own_refused, own_worked = set(task.visit.get("demoted", [])), set(task.visit.get("worked", []))
        taught = (self.memory.refused_shapes - own_refused) | (self.memory.worked_rungs - own_worked)
        mine = sorted(key for key in taught if key.startswith(prefix))
        if not mine:
            return []
        alone = choose_rung(
            self.profile, self.adapter.model, self.thinking, n_actions, own_refused, self._start(task, shared=False)
        )
        strict = demotion_key(self.profile, self.adapter.model, self.thinking, STRICT_SCHEMA) in mine
        return mine if alone != rung or strict else []

    def _start(self, task: TaskState, *, shared: bool = True) -> Rung | None:
        """Where the ladder starts: where escalation moved this visit, else the rung that worked before (for this
        task, and with `shared` for any task of the process)."""
        if (escalated := task.visit.get("rung")) in _RUNG_NAMES:  # a value this version does not know is ignored
            return Rung(escalated)
        worked = [*task.visit.get("worked", []), *(self.memory.worked_rungs if shared else ())]
        return remembered_rung(self.profile, self.adapter.model, self.thinking, worked)

    async def _commit(self, task: TaskState, trigger: str, data: EventData) -> TaskState:
        """A sub-machine transition (repair, demote, hand_off, provider_error, limit)."""
        return await self.io.store(lambda: self.engine.commit_system(task, trigger, data, actor=self.actor))

    async def _ask(self, request: ModelRequest) -> ModelResponse:
        """The adapter's answer, once flow control lets the call through (`engine.runtime.flow`: it raises
        `FlowWait` in a worker while the breaker is open or the quota short)."""
        if self.flow is not None:
            return await self.flow.call(self.adapter, request, lambda: self._answer(request), self.io)
        return await self._answer(request)

    async def _answer(self, request: ModelRequest) -> ModelResponse:
        """The adapter's answer: awaited, or for an adapter written without `async`, waited for on a thread."""
        complete = self.adapter.complete
        if inspect.iscoroutinefunction(complete):
            return await complete(request)  # type: ignore[no-any-return]
        answer = await self.io.wait(lambda: complete(request))
        return await answer if inspect.isawaitable(answer) else answer

    async def _call(self, request: ModelRequest) -> tuple[ModelResponse, int, list[dict[str, Any]]]:
        """The answer, the calls it took, and what each call made again was retried after (`turn.retried`)."""
        attempt, started = 0, time.monotonic()
        retried: list[dict[str, Any]] = []
        while True:
            attempt += 1
            call_started = time.perf_counter() if hooks.active else 0.0  # this attempt's, for its span
            WAITED.set(None)
            try:
                response = await self._ask(request)
            except ModelError as error:
                if hooks.active:
                    hooks.model_call(
                        self.adapter.provider,
                        self.adapter.model,
                        self.profile.name,
                        call_started,
                        error=error,
                        waited=WAITED.get(),
                    )
                delay = self.retry.delay(attempt, error.retry_after) if error.retryable else None
                if delay is None or attempt >= self.retry.attempts:
                    error.attempts, error.seconds = attempt, round(time.monotonic() - started, 3)
                    error.retried = retried
                    raise
                retried.append({**provider_said(error), "waited": round(delay, 3)})
                log.info(
                    "model call %s; retrying in %.2fs (attempt %s of %s)",
                    error.code,
                    delay,
                    attempt,
                    self.retry.attempts,
                )
                await self.retry.sleep(delay)
                continue
            if hooks.active:
                hooks.model_call(
                    self.adapter.provider,
                    self.adapter.model,
                    self.profile.name,
                    call_started,
                    response=response,
                    waited=WAITED.get(),
                )
            return response, attempt, retried
