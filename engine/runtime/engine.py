"""`Engine`: the public entry point that joins definitions, decisions and the store.

The engine loads a task by folding its log, asks the pure `decide` whether a
trigger becomes a transition, seals the event into the hash chain and appends
it under optimistic concurrency. It keeps no task in memory between calls.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from engine.audit import checkpoint as checkpoints
from engine.audit import parallel as replay_jobs
from engine.audit.archive import (
    ArchiveRun,
    archive_ended,
    archived_events,
    archived_hashes,
    replay_archived,
    replay_archives,
)
from engine.audit.checkpoint import Taken
from engine.audit.reads import AsOf, origin_check, replay_task, replay_tasks, state_as_of, task_logs, task_path
from engine.core.approvals import DECISIONS, check_decision, full_digest, pending_view
from engine.core.canonical import GENESIS_HASH, canonical_json, format_instant, now, parse_instant
from engine.core.chain import Finding
from engine.core.checkpoints import Head, Header, descends, extends
from engine.core.decide import Decision, decide, validate_payload
from engine.core.definition import CANCEL, FORK, MIGRATE, REDRIVE, START, Agent, Approval, StateKind, Tool, Workflow
from engine.core.effects import SETTLE, lands_until
from engine.core.errors import Code, ConcurrencyConflict, IntegrityError, LeaseLost, RailyardError, Refused
from engine.core.events import Event, seal
from engine.core.fold import TaskState, apply, fold, initial, pinned_at_start, predates_effects
from engine.core.forks import (
    EXECUTED_OR_MAY,
    FORKED_FROM,
    fork_data,
    last_entry,
    redrive_problem,
    repeat_hazard,
    writes,
)
from engine.core.model_interface import ModelAdapter
from engine.core.payloads import EventData, Settled, event_code
from engine.core.replay import OriginCheck, ReplayReport
from engine.core.summary import summarise
from engine.core.timers import next_run_at
from engine.observability import hooks
from engine.runtime import config
from engine.runtime.agent import AgentRunner
from engine.runtime.leases import current_epoch
from engine.runtime.models import open_model
from engine.runtime.offload import INLINE, Offload, run_sync
from engine.runtime.registry import Registry
from engine.runtime.roles import Authoriser, default_authoriser
from engine.runtime.tool_runner import SETTLE_MARGIN_SECONDS, ToolRunner
from engine.store import Loaded, Store, TaskRow, open_store
from engine.store.protocol import TaskQuery

log = logging.getLogger("railyard.engine")

#: How many archive files' event hashes `_archived_hash` keeps (a checkpoint lists tasks in id order, not by file).
ARCHIVE_FILES_KEPT = 8
#: One line per transition (see `_log_transition`); `railyard worker` prints it at INFO.
transitions_log = logging.getLogger("railyard.transitions")

MAX_ACTOR_LENGTH = 200


@dataclass(frozen=True, slots=True)
class TaskView:
    """What `get` answers: where a task stands and what may happen next."""

    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    kind: StateKind
    status: str
    seq: int
    allowed: list[str]
    input: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    #: A cancel waiting for a write in flight to settle (`Engine.cancel`), and that write, if one is open.
    cancel_requested: dict[str, Any] | None = None
    unsettled: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "version": self.version,
            "digest": self.digest,
            "state": self.state,
            "kind": str(self.kind),
            "status": self.status,
            "seq": self.seq,
            "allowed": self.allowed,
            "input": self.input,
            "facts": self.facts,
            "cancel_requested": self.cancel_requested,
            "unsettled": self.unsettled,
        }


class Engine:
    """Start tasks, fire triggers, read state and history. Thread-safe; share one per process."""

    def __init__(
        self,
        database_url: str | None = None,
        registry: Registry | None = None,
        *,
        authoriser: Authoriser | None = None,
        snapshot_every: int = config.DEFAULT_SNAPSHOT_EVERY,
        store: Store | None = None,
        model: ModelAdapter | None = None,
        archive_dir: str | Path | None = None,
    ) -> None:
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be >= 1")
        hooks.configure()  # the OTEL_* variables turn tracing on, once per process (before anything is opened)
        self.store: Store = store if store is not None else open_store(database_url or config.database_url())
        self.registry = registry if registry is not None else Registry.from_env()
        self.authoriser = authoriser if authoriser is not None else default_authoriser()
        self.snapshot_every = snapshot_every
        self.model = model
        #: Where archived task logs are (`railyard archive` writes them; load, history and replay read them).
        self.archive_dir = Path(archive_dir if archive_dir is not None else config.archive_dir())
        #: Event hashes of the archive files last read (`_archived_hash`), by (file, sha256), oldest first.
        self._archive_hashes: dict[tuple[str, str], dict[tuple[str, int], str]] = {}
        #: Request shapes a provider refused (profile:model:thinking:rung), shared by every task this engine runs;
        #: each task's log remembers its own too, so a restarted process does not re-send them for that task.
        self.refused_shapes: set[str] = set()
        #: Rungs that worked after escalating for a (profile, model, thinking), remembered the same way.
        self.worked_rungs: set[str] = set()
        #: By task id: a shape refused by an error that did not name it, waiting for the task's next call to
        #: confirm it (answered without it) before `refused_shapes` gets it (`AgentRunner.step`).
        self.unconfirmed_shapes: dict[str, str] = {}
        self._kept_agent: AgentRunner | None = None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- commands -------------------------------------------------------
    def start(
        self,
        workflow: str,
        input: Mapping[str, Any] | None = None,
        actor: str = "",
        version: int | None = None,
    ) -> str:
        """Start a task on `workflow` (newest version unless `version`); returns its id."""
        _check_actor(actor)
        definition = self.registry.get(workflow, version)
        _, input_json = validate_payload(definition.input, f"{definition.ref} input", input)
        task_id = str(uuid.uuid4())
        at = now()
        first = seal(
            task_id=task_id,
            seq=1,
            at=at,
            actor=actor,
            from_state=None,
            trigger=START,
            to_state=definition.initial_state,
            data={"workflow": definition.ref, "digest": definition.digest, "input": input_json or {}},
            prev_hash=GENESIS_HASH,
        )
        row = TaskRow(
            task_id=task_id,
            workflow=definition.name,
            version=definition.version,
            digest=definition.digest,
            state=first.to_state,
            status=str(definition.status_of(first.to_state)),
            seq=1,
            last_hash=first.hash,
            created_at=at,
            updated_at=at,
            next_run_at=next_run_at(definition, first.to_state, at),
        )
        self.store.create(row, first, definition.search_values(input_json))
        if hooks.active:
            hooks.transition(first, definition.name, definition.version, time.perf_counter())
        return task_id

    def fire(
        self,
        task_id: str,
        trigger: str,
        payload: Mapping[str, Any] | None = None,
        actor: str = "",
        expected_seq: int | None = None,
    ) -> TaskState:
        """Load the task, decide, append: a human or external command, decided on the state it finds.

        With `expected_seq` (the seq the caller saw), refuse if the task has moved past it. Either way, if the
        task moves between the read and the append, the command is refused (CONCURRENCY_CONFLICT naming the
        state now), never retried into another meaning.
        """
        _check_actor(actor)
        task = self._as_seen(task_id, expected_seq)
        if trigger in DECISIONS and self.definition_of(task).state(task.state).kind is StateKind.APPROVAL:
            # One way to decide an approval, whichever door it comes through: the same checks and the same
            # record as `approve` / `reject`. The payload names the digest the approver saw, and a comment.
            fields = dict(payload or {})
            digest = fields.pop("digest", None)
            comment = next((str(fields[k]) for k in ("comment", "reason", "note") if k in fields), "")
            verdict: Literal["approve", "reject"] = "approve" if trigger == "approve" else "reject"
            return self._decide_approval(
                task_id, verdict, actor, digest if isinstance(digest, str) else None, comment, loaded=task
            )
        if trigger == SETTLE:
            fields = dict(payload or {})
            return self._settle(task, actor, fields.get("outcome"), fields.get("evidence"))
        return self._human(task, lambda: self.transition(task, trigger, payload, actor=actor))

    #: DESIGN.md's name for firing a human or external trigger (a customer replied, an operator closed): the
    #: same method, so a signal gets the same checks, refusals and approval handling as `fire`.
    signal = fire

    def transition(
        self,
        task: TaskState,
        trigger: str,
        payload: Mapping[str, Any] | None = None,
        *,
        actor: str,
        system: bool = False,
    ) -> TaskState:
        """Advance a task the caller already holds (state and seq known): decide, then one append.

        This is the worker's path: no read before the write. If the task moved
        meanwhile the append conflicts and nothing is written. `system=True` is
        for the engine's own components (tool runner, timers): only they may fire
        tool outcomes and `expired`.
        """
        _check_actor(actor)
        definition = self.definition_of(task)
        roles: Set[str] = self.authoriser.roles_of(actor)
        decision = decide(definition, task, trigger, payload, actor=actor, roles=roles, system=system)
        return self.commit(task, decision, actor=actor)

    def commit(self, task: TaskState, decision: Decision, *, actor: str) -> TaskState:
        """Seal an accepted decision into the next event and append it (one round trip).

        Only for decisions `decide` produced for this `task`; the append conflicts if the task moved.
        """
        started = time.perf_counter()
        definition = self.definition_of(task)
        event = seal(
            task_id=task.task_id,
            seq=task.seq + 1,
            at=now(),
            actor=actor,
            from_state=decision.from_state,
            trigger=decision.trigger,
            to_state=decision.to_state,
            data=decision.data,
            prev_hash=task.last_hash,
        )
        after = apply(definition, task, event)
        snapshot = None
        if after.seq // self.snapshot_every > task.seq // self.snapshot_every:
            snapshot = (after.seq, after.last_hash, canonical_json(after.to_doc()))
        try:
            self.store.append(
                task.task_id,
                task.seq,
                [event],
                status=str(after.status),
                snapshot=snapshot,
                next_run_at=next_run_at(definition, after.state, event.at),
                lease_epoch=current_epoch(task.task_id),
            )
        except ConcurrencyConflict:
            if hooks.active:
                hooks.conflict(task)
            raise
        if hooks.active:
            hooks.transition(event, task.workflow, task.version, started)
        if transitions_log.isEnabledFor(logging.INFO):
            _log_transition(event, (time.perf_counter() - started) * 1000)
        return after

    def commit_system(self, task: TaskState, trigger: str, data: EventData, *, actor: str) -> TaskState:
        """Fire one of the engine's own triggers (repair, call, an outcome, limit, ...) with the data it records.

        `decide` still checks it is a legal transition from where the task stands.
        """
        decision = decide(self.definition_of(task), task, trigger, None, actor=actor, system=True)
        return self.commit(task, replace(decision, data={**decision.data, **data}), actor=actor)

    def step(self, task_id: str, *, model: ModelAdapter | None = None, thinking: bool = False) -> TaskState:
        """Run one model turn for a task in an agent state: exactly one event, whatever the model does."""
        runner = AgentRunner(self, self._model(model), thinking=thinking)
        task = self.load(task_id)
        return run_sync(hooks.step(task, "agent", runner.turn))

    def run(
        self,
        task_id: str,
        *,
        model: ModelAdapter | None = None,
        thinking: bool = False,
        max_turns: int = 50,
        until: Callable[[], bool] | None = None,
    ) -> TaskState:
        """Advance the task through agent turns and tool calls until it blocks (approval, wait) or ends.

        A model is needed only if the task reaches an agent state. `max_turns` bounds the steps.
        `until` is asked before each step: a stopping worker hands the task back between steps,
        never in the middle of one.
        """
        return self.advance(self.load(task_id), model=model, thinking=thinking, max_turns=max_turns, until=until)

    def advance(
        self,
        task: TaskState,
        *,
        model: ModelAdapter | None = None,
        thinking: bool = False,
        max_turns: int = 50,
        until: Callable[[], bool] | None = None,
    ) -> TaskState:
        """`run` for a task the caller already loaded: no second read."""
        return run_sync(self.drive(task, model=model, thinking=thinking, max_turns=max_turns, until=until))

    async def drive(
        self,
        task: TaskState,
        *,
        model: ModelAdapter | None = None,
        thinking: bool = False,
        max_turns: int = 50,
        until: Callable[[], bool] | None = None,
        io: Offload = INLINE,
    ) -> TaskState:
        """The one loop that advances a task, for `run` (in place) and for a worker (`io`: its threads).

        Both kinds of step are coroutines: an agent turn awaits its model call (no thread held), a tool step
        hands the tool's call to `io`'s slow work (a tool is user code that blocks) and its appends to `io`'s
        store work, so a worker's loop never waits for a tool and a tool never holds a database connection.
        """
        agent: AgentRunner | None = None
        tools = ToolRunner(self, io=io)
        for _ in range(max_turns):
            state = self.definition_of(task).state(task.state)
            if task.terminal or (until is not None and until()):
                break
            if isinstance(state, Agent):
                agent = agent or self._agent(self._model(model), thinking, io)
                task = await hooks.step(task, "agent", agent.turn)
            elif isinstance(state, Tool):
                task = await hooks.step(task, "tool", tools.advance)
            else:
                break
        return task

    def _agent(self, adapter: ModelAdapter, thinking: bool, io: Offload) -> AgentRunner:
        """The runner for `adapter`, kept while the same adapter and offload come back (a worker's every task).

        A runner holds no task's state, and building one resolves the model's profile (reading the profiles file
        when one is set): a worker did that for every task it claimed. One is kept; another adapter replaces it.
        """
        kept = self._kept_agent
        if kept is not None and kept.adapter is adapter and kept.io is io and kept.requested_thinking == thinking:
            return kept
        runner = self._kept_agent = AgentRunner(self, adapter, thinking=thinking, io=io)
        return runner

    def _model(self, model: ModelAdapter | None) -> ModelAdapter:
        if model is not None:
            return model
        if self.model is None:
            spec = config.model_spec()
            if spec is None:
                raise Refused(
                    "no model configured: set RAILYARD_MODEL (scripted:PATH, openai:MODEL, anthropic:MODEL)",
                    code=Code.MODEL_NOT_CONFIGURED,
                )
            self.model = open_model(spec)
        return self.model

    def approve(
        self,
        task_id: str,
        actor: str,
        prepared_digest: str | None,
        comment: str = "",
        *,
        expected_seq: int | None = None,
    ) -> TaskState:
        """Approve the prepared call awaiting approval; `prepared_digest` is the digest the approver saw."""
        return self._decide_approval(task_id, "approve", actor, prepared_digest, comment, expected_seq=expected_seq)

    def reject(
        self,
        task_id: str,
        actor: str,
        reason: str,
        prepared_digest: str | None = None,
        *,
        expected_seq: int | None = None,
    ) -> TaskState:
        """Reject it. The digest is optional: refusing a call does not depend on its exact content."""
        return self._decide_approval(task_id, "reject", actor, prepared_digest, reason, expected_seq=expected_seq)

    def approvals(
        self, *, role: str | None = None, after: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Tasks awaiting a human decision (optionally for one role), each with the prepared call; with `after`
        (a task id) only those after it, oldest first; at most `limit`."""
        found = self.awaiting_approval(role=role, after=after, limit=limit)
        return [pending_view(definition, task) for definition, task in found]

    def approvals_page(
        self, *, role: str | None = None, after: str | None = None, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of `approvals` and the task id the next page starts after (None at the end). The page is cut
        where the store's list is, not where the loaded tasks are: a task skipped on this page (it moved, or its
        version's code changed) does not end the list early."""
        ids = self.store.blocked_in(self._approval_states(role), after=after, limit=limit + 1)
        more = len(ids) > limit
        ids = ids[:limit]
        found = self._approval_tasks(ids, role)
        return [pending_view(definition, task) for definition, task in found], (ids[-1] if more and ids else None)

    def _approval_states(self, role: str | None) -> list[tuple[str, int, str]]:
        return [
            (definition.name, definition.version, state.name)
            for definition in self.registry
            for state in definition.states
            if isinstance(state, Approval) and (role is None or state.role == role)
        ]

    def awaiting_approval(
        self, *, role: str | None = None, after: str | None = None, limit: int | None = None
    ) -> Iterator[tuple[Workflow, TaskState]]:
        """The tasks standing at an approval gate (of `role`), oldest first, each loaded once with its definition.
        A task that moved between the store's read and its load is skipped, so a page may hold fewer than `limit`."""
        return self._approval_tasks(self.store.blocked_in(self._approval_states(role), after=after, limit=limit), role)

    def _approval_tasks(self, task_ids: Iterable[str], role: str | None) -> Iterator[tuple[Workflow, TaskState]]:
        for task_id in task_ids:
            try:
                task = self.load(task_id)
            except Refused:
                continue  # the code of its version changed without a new version (DEFINITION_CHANGED)
            definition = self.definition_of(task)
            state = definition.state(task.state)
            if isinstance(state, Approval) and (role is None or state.role == role):  # it may have moved since
                yield definition, task

    def _decide_approval(
        self,
        task_id: str,
        verdict: Literal["approve", "reject"],
        actor: str,
        digest: str | None,
        comment: str,
        *,
        loaded: TaskState | None = None,
        expected_seq: int | None = None,
    ) -> TaskState:
        """`loaded`: the task as the caller just loaded it (then `expected_seq` was checked already)."""
        _check_actor(actor)
        roles = self.authoriser.roles_of(actor)
        task = loaded if loaded is not None else self._as_seen(task_id, expected_seq)
        definition = self.definition_of(task)
        if verdict == "reject" and digest is None and task.prepared:
            digest = task.prepared["digest"]
        if digest is not None and task.prepared and digest != task.prepared["digest"]:
            digest = full_digest(digest, task.prepared["digest"], self._prepared_digests(task.task_id))
        check = check_decision(definition, task, verdict, actor=actor, roles=roles, digest=digest, comment=comment)
        action = definition.candidates(task.state, check.trigger)[0]
        payload = _comment_payload(action.args, comment)
        decision = decide(definition, task, check.trigger, payload, actor=actor, roles=roles)
        decision = replace(decision, data={**decision.data, "approval": check.record})
        return self._human(task, lambda: self.commit(task, decision, actor=actor))

    def _prepared_digests(self, task_id: str) -> set[str]:
        """Every call the task prepared, by digest: what a digest prefix must not also name."""
        found = set()
        for event in self.history(task_id):
            prepared = event.data.get("prepared")
            if isinstance(prepared, dict) and isinstance(prepared.get("digest"), str):
                found.add(prepared["digest"])
        return found

    def cancel(self, task_id: str, actor: str, reason: str, *, expected_seq: int | None = None) -> TaskState:
        """Stop the task: to `cancelled` from any non-terminal state, decided on the state it is in now.

        While a write call's outcome is open (its intent is recorded, its outcome is not, or was `unknown`),
        the cancel is recorded as `cancel_requested` and the task goes on until the write settles: then to
        `cancelled` if nothing happened, or to the workflow's `effect_after_cancel` state if it did. A cancel
        that finds the task moved on after it read it is refused (CONCURRENCY_CONFLICT), not retried.
        """
        return self.fire(task_id, CANCEL, {"reason": reason}, actor=actor, expected_seq=expected_seq)

    def settle(
        self, task_id: str, actor: str, outcome: str, evidence: str, *, expected_seq: int | None = None
    ) -> TaskState:
        """Record what an operator verified about a write whose outcome is open: `executed` or `not_executed`.

        The actor must hold the workflow's `settle_role` (else its `cancel_role`). `executed` is recorded as the
        write's outcome, and a retry then records it succeeded without calling; only `not_executed` lets a
        retry send it again. With a cancel waiting, the task goes where the cancel says.
        """
        _check_actor(actor)
        return self._settle(self._as_seen(task_id, expected_seq), actor, outcome, evidence)

    def _settle(self, task: TaskState, actor: str, outcome: Any, evidence: Any) -> TaskState:
        unsettled = task.unsettled
        if unsettled is None:
            raise Refused(
                f"task {task.task_id} has no write whose outcome is open: nothing to settle",
                code=Code.TRIGGER_NOT_ALLOWED,
                task_id=task.task_id,
                state=task.state,
            )
        definition = self.definition_of(task)
        decision = decide(
            definition,
            task,
            SETTLE,
            {"outcome": outcome, "evidence": evidence},
            actor=actor,
            roles=self.authoriser.roles_of(actor),
            system=True,
        )
        running = self._attempt_running(definition, task)
        if running is not None:
            raise Refused(
                f"write {unsettled['tool']} (action {unsettled['action_id']}) may still be running "
                f"({running}): what it did cannot be verified yet; settle it once it can no longer land",
                code=Code.OUTCOME_UNSETTLED,
                task_id=task.task_id,
                unsettled=dict(unsettled),
            )
        args = decision.data.get("args") or {}
        settled: Settled = {
            "action_id": unsettled["action_id"],
            "tool": unsettled["tool"],
            "outcome": args["outcome"],
            "evidence": args["evidence"],
            "was": unsettled["status"],
        }
        decision = replace(decision, data={**decision.data, "settled": settled})
        return self._human(task, lambda: self.commit(task, decision, actor=actor))

    def _attempt_running(self, definition: Workflow, task: TaskState) -> str | None:
        """Why the open write's last attempt may still be in flight (a worker holds the task, or its call has not
        timed out yet), or None: an operator's settlement must not race the call it settles."""
        effect = task.unsettled or {}
        row = self.store.row(task.task_id)
        at = now()
        if (
            row is not None
            and row.lease_owner is not None
            and row.lease_expires_at is not None
            and row.lease_expires_at > at
        ):
            return f"worker {row.lease_owner} holds the task"
        tools = definition.tools
        if tools is not None and effect.get("tool") in tools:
            until = lands_until(task.unsettled, tools.get(str(effect["tool"])).timeout, SETTLE_MARGIN_SECONDS)
            if until is not None and at < until:
                return f"its call may land until {format_instant(until)}"
        return None

    def _as_seen(self, task_id: str, expected_seq: int | None) -> TaskState:
        """The task a human command is decided on: as it is now, and at `expected_seq` if the caller names one."""
        task = self.load(task_id)
        if expected_seq is not None and expected_seq != task.seq:
            raise ConcurrencyConflict(task_id, expected_seq, task.seq, task.state)
        return task

    def _human(self, task: TaskState, append: Callable[[], TaskState]) -> TaskState:
        """Append a human command decided on `task`; if the task moved meanwhile, say where it is now."""
        try:
            return append()
        except LeaseLost:
            raise
        except ConcurrencyConflict:
            row = self.store.row(task.task_id)
            raise ConcurrencyConflict(
                task.task_id, task.seq, row.seq if row else None, row.state if row else None
            ) from None

    def migrate(
        self, task_id: str, to_version: int, state_map: Mapping[str, str], actor: str, reason: str
    ) -> TaskState:
        """Move an in-flight task to another version of its workflow: one `migrate` event, actor and reason kept.

        Only a task whose current state is a key of `state_map` moves, to the state it maps to
        (which must exist in `to_version`). Everything the task accumulated (input, facts, the
        prepared call, budgets) carries over; replay checks the events before the migration against
        the old version and those after it against the new one.
        """
        _check_actor(actor)
        task = self.load(task_id)
        source = self.definition_of(task)
        target = self.registry.get(task.workflow, to_version)
        problem = migration_problem(source, target, task, state_map, reason)
        if problem is not None:
            raise Refused(
                f"cannot migrate {task.ref} to {target.ref}: {problem}",
                code=Code.MIGRATION_INVALID,
                task_id=task_id,
                state=task.state,
            )
        event = seal(
            task_id=task_id,
            seq=task.seq + 1,
            at=now(),
            actor=actor,
            from_state=task.state,
            trigger=MIGRATE,
            to_state=state_map[task.state],
            data={
                "from": source.ref,
                "to": target.ref,
                "from_digest": source.digest,
                "to_version": target.version,
                "to_digest": target.digest,
                "state_map": dict(state_map),
                "reason": reason,
            },
            prev_hash=task.last_hash,
        )
        after = apply(target, task, event)
        self.store.repin(
            task_id,
            task.seq,
            event,
            version=target.version,
            digest=target.digest,
            status=str(after.status),
            next_run_at=next_run_at(target, after.state, event.at),
        )
        if hooks.active:
            hooks.transition(event, target.name, target.version, time.perf_counter())
        if transitions_log.isEnabledFor(logging.INFO):
            _log_transition(event, 0.0)
        return after

    # -- fork and redrive (engine.core.forks) -----------------------------------------------------------
    def fork(self, task_id: str, at_seq: int, *, actor: str, reason: str, version: int | None = None) -> str:
        """Start a new task from task `task_id`'s state as of event `at_seq`; returns the new task's id.

        The new task's first event (`fork`, seq 1) names the source, the seq and the hash there, and carries the
        state as of that seq (facts, visit, prepared call, write outcomes, budget counters; the deadline starts
        again). It runs on the newest version of the workflow, or `version`, checked as `migrate` checks a move.
        The source is only read. Refused (WRITE_WOULD_REPEAT) where the fork could make a write a second time.
        """
        _check_actor(actor)
        row = self.store.row(task_id)
        if row is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)

        def invalid(problem: str) -> Refused:
            return Refused(
                f"cannot fork task {task_id} at seq {at_seq}: {problem}", code=Code.FORK_INVALID, task_id=task_id
            )

        if not isinstance(reason, str) or not reason.strip():
            raise invalid("a reason is required")
        if isinstance(at_seq, bool) or not isinstance(at_seq, int) or not 1 <= at_seq <= row.seq:
            raise invalid(f"the task has events 1 to {row.seq}")
        if row.status != "terminal":
            # A source that goes on and a fork of it could both reach a write neither has prepared yet: each
            # would make its own, and both would be paid. A task that is stuck is sent back with `redrive`.
            raise invalid(
                f"the task is still running (in {row.state!r}): a fork and its source would both go on; fork a task "
                "that has ended (cancel it first), or send a stuck one back with `railyard redrive`"
            )
        source = self.as_of(task_id, seq=at_seq)
        if source.terminal:
            raise invalid(f"the task was in terminal state {source.state!r} there: nothing would run; fork earlier")
        hazard = repeat_hazard(
            writes(self._events(task_id), at_seq),
            at_seq,
            source.prepared["action_id"] if source.prepared else None,
            source_live=False,
        ) or self._sibling_hazard(task_id)
        if hazard is not None:
            raise Refused(
                f"cannot fork task {task_id} at seq {at_seq}: {hazard}", code=Code.WRITE_WOULD_REPEAT, task_id=task_id
            )
        origin = self.definition_of(source)
        target = self.registry.get(source.workflow, version)
        if target.version != origin.version:
            problem = migration_problem(origin, target, source, {source.state: source.state}, reason)
            if problem is not None:
                raise invalid(f"to {target.ref}: {problem}")
        new_id = str(uuid.uuid4())
        at = now()
        first = seal(
            task_id=new_id,
            seq=1,
            at=at,
            actor=actor,
            from_state=None,
            trigger=FORK,
            to_state=source.state,
            data=fork_data(target, source, source.digest, reason, source.usage.get("started_at")),
            prev_hash=GENESIS_HASH,
        )
        task = initial(target, first)
        self.store.create(
            TaskRow(
                task_id=new_id,
                workflow=target.name,
                version=target.version,
                digest=target.digest,
                state=task.state,
                status=str(task.status),
                seq=1,
                last_hash=first.hash,
                created_at=at,
                updated_at=at,
                next_run_at=next_run_at(target, task.state, at),
            ),
            first,
            fields={FORKED_FROM: task_id},  # how the next fork of the same source finds this one
        )
        if transitions_log.isEnabledFor(logging.INFO):
            _log_transition(first, 0.0)
        if hooks.active:
            hooks.transition(first, target.name, target.version, time.perf_counter())
        return new_id

    def _sibling_hazard(self, source_id: str) -> str | None:
        """Why another fork of `source_id` could make a write twice: a fork of it that is still running (both
        could reach the same write, or each its own), or one that made a write (a second fork would make it, or
        its twin, again). None when every earlier fork ended without making one."""
        found = self.store.list_tasks(TaskQuery(field_value=source_id, limit=500))
        for fork in (t for t in found if t.fields.get(FORKED_FROM) == source_id):
            if fork.row.status != "terminal":
                return f"fork {fork.row.task_id} of this task is still running: two forks would both go on"
            made = [w for w in writes(self._events(fork.row.task_id), 1) if w.status in EXECUTED_OR_MAY]
            if made:
                return (
                    f"fork {fork.row.task_id} of this task made {made[0].where()}, {made[0].status}: another fork "
                    "would make it, or its twin, again"
                )
        return None

    def redrive(
        self, task_id: str, to_state: str, *, actor: str, reason: str, expected_seq: int | None = None
    ) -> TaskState:
        """Send a handed-off or limit-state task back to an agent or tool state it visited: one `redrive` event.

        The actor must hold the workflow's `redrive_role` (else its `settle_role`, else its `cancel_role`). The
        budgets start again (the event records what they were), so a task the limit stopped can go on. Refused
        (WRITE_WOULD_REPEAT) where going back could make a write a second time.
        """
        _check_actor(actor)
        task = self._as_seen(task_id, expected_seq)
        definition = self.definition_of(task)

        def refuse(problem: str, code: Code = Code.REDRIVE_INVALID) -> Refused:
            return Refused(
                f"cannot redrive task {task_id} to {to_state!r}: {problem}",
                code=code,
                task_id=task_id,
                state=task.state,
            )

        events = self.events_of(task)
        entered = last_entry(events, to_state)
        problem = redrive_problem(definition, task, to_state, entered)
        if problem is not None:
            raise refuse(problem)
        if not isinstance(reason, str) or not reason.strip():
            raise refuse("a reason is required")
        role = definition.redrive_role or definition.settle_role or definition.cancel_role
        if role is not None and role not in self.authoriser.roles_of(actor):
            raise Refused(
                f"{actor!r} may not redrive {task_id}: role {role!r} required",
                code=Code.FORBIDDEN,
                task_id=task_id,
                trigger=REDRIVE,
                role=role,
                actor=actor,
            )
        assert entered is not None
        if isinstance(definition.state(to_state), Tool):
            # The checks on the way into a tool state (an approval of this very call, its deadline, who may
            # approve) were made for the call the task held then: going back runs only that call.
            then = self.as_of(task_id, seq=entered).prepared
            was = then["action_id"] if then is not None else None
            held = task.prepared["action_id"] if task.prepared is not None else None
            if was != held:
                raise refuse(
                    f"the call it holds now (action {held}) is not the one it held when it last entered {to_state!r} "
                    f"at seq {entered} (action {was}): what let that one in (an approval) was not given for this "
                    "one; redrive to the agent state instead"
                )
        hazard = repeat_hazard(
            writes(events, entered), entered, task.prepared["action_id"] if task.prepared else None, source_live=False
        )
        if task.unsettled is not None:
            hazard = (
                f"write {task.unsettled['tool']} (action {task.unsettled['action_id']}) is "
                f"{task.unsettled['status']}: its outcome is open"
            )
        if hazard is not None:
            raise refuse(hazard, Code.WRITE_WOULD_REPEAT)
        # Every counter the budgets read starts again (turns, calls, repeats, tokens, the deadline): the event keeps
        # what they were.
        data: EventData = {"reason": reason, "redrive_from_seq": entered, "reset": dict(task.usage)}
        decision = Decision(trigger=REDRIVE, from_state=task.state, to_state=to_state, data=data)
        return self._human(task, lambda: self.commit(task, decision, actor=actor))

    # -- queries --------------------------------------------------------
    def load(self, task_id: str) -> TaskState:
        """The task's state: the newest snapshot plus the events after it, checked against the task row."""
        loaded = self.store.load(task_id)
        if loaded is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        return self._state(loaded)

    def load_many(self, task_ids: Sequence[str]) -> dict[str, TaskState]:
        """`load` of each task, read in one round trip: what a worker does with the tasks one claim gave it.

        A task that `load` would refuse (not found, pinned to a version this process lacks, a log that does
        not fold) is left out rather than raised: the caller loads it on its own, and `load` says why."""
        states: dict[str, TaskState] = {}
        for task_id, loaded in self.store.load_many(task_ids).items():
            try:
                states[task_id] = self._state(loaded)
            except Exception:  # `load` of this task raises it again, where its caller handles it
                continue
        return states

    def get(self, task_id: str) -> TaskView:
        return self.view(self.load(task_id))

    def view(self, task: TaskState) -> TaskView:
        """What `get` shows of a folded state: also the view of a past state (`as_of`)."""
        definition = self.definition_of(task)
        unsettled = task.unsettled
        allowed = [] if task.terminal else definition.triggers(task.state)
        return TaskView(
            task_id=task.task_id,
            workflow=task.workflow,
            version=task.version,
            digest=task.digest,
            state=task.state,
            kind=definition.state(task.state).kind,
            status=str(task.status),
            seq=task.seq,
            allowed=[*allowed, SETTLE] if unsettled is not None and not task.terminal else allowed,
            input=task.input,
            facts=task.facts,
            cancel_requested=task.cancel_requested if not task.terminal else None,
            unsettled=(
                {k: unsettled[k] for k in ("action_id", "tool", "state", "status")} if unsettled is not None else None
            ),
        )

    def history(self, task_id: str) -> list[Event]:
        """Every event of the task, in order."""
        if self.store.row(task_id) is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        return self._events(task_id)

    def events_of(self, task: TaskState) -> list[Event]:
        """`history` of a task just loaded (it exists: no second look at its row)."""
        return self._events(task.task_id)

    def _events(self, task_id: str) -> list[Event]:
        return self.store.events(task_id) or self._archived_events(task_id)

    # -- audit ----------------------------------------------------------
    def replay(self, task_id: str, *, jobs: int = 1) -> ReplayReport:
        """Check the task's whole log from zero, without calling any model or tool (see `engine.core.replay`).

        With `jobs` > 1, a long log is checked in stretches by that many processes (`engine.audit.parallel`).
        """
        if not hooks.active:
            return self._replay(task_id, jobs)
        started = time.perf_counter()
        report = self._replay(task_id, jobs)
        hooks.replayed(report, started)
        return report

    def _replay(self, task_id: str, jobs: int) -> ReplayReport:
        if jobs > 1:
            row = self.store.row(task_id)
            if row is not None and row.seq >= replay_jobs.LONG_LOG and replay_jobs.can_fork(self.store):
                report = replay_jobs.replay_long(self.store, self.registry.find, row, jobs, self._archived_events)
                if report is not None:
                    return report
        return self._from_archive(replay_task(self.store, self.registry.find, task_id, self._archived_events))

    def replay_all(
        self, workflow: str | None = None, since: datetime | None = None, *, jobs: int = 1
    ) -> Iterator[ReplayReport]:
        """`replay` of every task (of `workflow`, changed since `since`), streamed: memory stays flat.

        Reports come in task id order, archived tasks last, file by file.

        With `jobs` > 1, pages of tasks are checked by that many processes; the reports come in the same order.
        """
        if jobs > 1 and replay_jobs.can_fork(self.store):
            reports = replay_jobs.replay_pages(
                self.store, self.registry.find, jobs, workflow=workflow, since=since, archived=self._archived_events
            )
        else:
            reports = replay_tasks(
                self.store, self.registry.find, workflow=workflow, since=since, archived=self._archived_events
            )
        reports = self._then_archives(reports, workflow, since)
        return hooks.replays(reports) if hooks.active else reports

    def _then_archives(
        self, reports: Iterator[ReplayReport], workflow: str | None, since: datetime | None
    ) -> Iterator[ReplayReport]:
        """The database's reports, then the archived tasks' from their files, file by file (each read once).

        An archived task has no events left in the database: its report there is left out, and the
        archive's comes after the others (a task archived while this runs may be reported twice).
        """
        for report in reports:
            if report.events or not report.task_id or self.store.archive_of(report.task_id) is None:
                yield report
        yield from replay_archives(
            self.store.archived(workflow=workflow, since=since), self.archive_dir, self.registry.find, self._origin()
        )

    def archive(self, before: datetime, *, batch: int = 500) -> ArchiveRun:
        """Move the logs of tasks that ended before `before` to verified files in `archive_dir` (`audit.archive`)."""
        return archive_ended(self.store, self.registry.find, before, self.archive_dir, batch=batch)

    # -- signed checkpoints (engine.audit.checkpoint) ---------------------------------------------------
    def checkpoint(self, key_file: str | Path | None = None, directory: str | Path | None = None) -> Taken:
        """Sign every task's head now and write the checkpoint to `directory` (RAILYARD_CHECKPOINT_DIR), with the key
        in `key_file` (RAILYARD_SIGNING_KEY). Its predecessor is the newest checkpoint in that directory."""
        key_path = key_file if key_file is not None else config.signing_key()
        if key_path is None:
            raise RailyardError(
                "no signing key: set RAILYARD_SIGNING_KEY to a key file (`railyard checkpoint keygen FILE` makes one)",
                code=Code.CONFIG_INVALID,
            )
        target = Path(directory if directory is not None else config.checkpoint_dir())
        return checkpoints.take(self.store, checkpoints.load_signing_key(Path(key_path)), target)

    def judge_checkpoint(self, path: str | Path, public_keys: str | Sequence[str]) -> tuple[Header, list[ReplayReport]]:
        """The database against a signed checkpoint: a report per task that no longer holds what it committed to,
        or one report (task id "") if the checkpoint itself does not verify with one of `public_keys`."""
        keys = checkpoints.Keys.load([public_keys] if isinstance(public_keys, str) else public_keys)
        self._archive_hashes.clear()  # archive files are read afresh by each judgement
        try:
            return checkpoints.judge_store(self.store, Path(path), keys, self._archived_hash)
        finally:
            self._archive_hashes.clear()

    def checkpoint_extends(
        self,
        older: str | Path,
        newer: str | Path,
        public_keys: str | Sequence[str],
        directories: Sequence[str | Path] = (),
    ) -> list[Finding]:
        """Whether checkpoint `newer` extends `older`: both verify (each with the key it names, among `public_keys`),
        `newer`'s chain of predecessors reaches `older` (the files looked up in `directories`, default the two
        files' own), and every task of `older` is in `newer` at a head whose log (in this database, or its
        archive) holds the older head at its seq."""
        keys = checkpoints.Keys.load([public_keys] if isinstance(public_keys, str) else public_keys)
        try:
            old, new = checkpoints.read(Path(older), keys), checkpoints.read(Path(newer), keys)
        except IntegrityError as error:
            if error.code is not Code.CHECKPOINT_INVALID:
                raise
            return [Finding(Code.CHECKPOINT_INVALID, 0, error.message)]
        if parse_instant(new.header.at) < parse_instant(old.header.at):
            return [Finding(Code.CHECKPOINT_NOT_EXTENDING, 0, "the newer checkpoint was taken before the older one")]
        places = [Path(d) for d in directories] or list(dict.fromkeys([Path(newer).parent, Path(older).parent]))
        found = checkpoints.chain_findings(old.header, new.header, places, keys)
        unreadable: list[Finding] = []

        def log_descends(a: Head, b: Head) -> bool:
            try:
                log = self.store.events(a.task_id, after_seq=a.seq - 1, upto_seq=b.seq) or [
                    e for e in self._archived_events(a.task_id) if a.seq <= e.seq <= b.seq
                ]
            except IntegrityError as error:  # an archive file gone: said as such, not as a head that moved
                unreadable.append(Finding(error.code, a.seq, f"task {a.task_id}: {error.message}"))
                return True
            return descends(log, a, b)

        return [*found, *extends(old, new, log_descends), *unreadable]

    def _archived_hash(self, task_id: str, seq: int) -> str | None:
        """The hash of event `seq` of an archived task, from its file; None if the task is not archived. An archived
        task whose file is gone or changed raises IntegrityError (ARCHIVE_MISSING, HASH_MISMATCH). The files last
        read are kept, so judging a checkpoint reads each archive file once, not once per task."""
        ref = self.store.archive_of(task_id)
        if ref is None:
            return None
        key = (ref.file, ref.sha256)
        hashes = self._archive_hashes.pop(key, None)
        if hashes is None:
            hashes = archived_hashes(ref, self.archive_dir)
        self._archive_hashes[key] = hashes  # the newest at the end
        while len(self._archive_hashes) > ARCHIVE_FILES_KEPT:
            self._archive_hashes.pop(next(iter(self._archive_hashes)))
        return hashes.get((task_id, seq))

    def _archived_events(self, task_id: str) -> list[Event]:
        """The events of an archived task, from its file (checked against the sha256 on its row); [] if not archived."""
        ref = self.store.archive_of(task_id)
        return archived_events(ref, self.archive_dir) if ref is not None else []

    def _from_archive(self, report: ReplayReport) -> ReplayReport:
        """A task without events in the database may be archived: then its file is what replay proves."""
        if report.events or not report.task_id:
            return report
        ref = self.store.archive_of(report.task_id)
        row = self.store.row(report.task_id)
        if ref is None or row is None:
            return report
        return replay_archived(row, ref, self.archive_dir, self.registry.find, self._origin())

    def _origin(self) -> OriginCheck:
        """How replay checks a fork against its source here: the source in this database, or its archive file."""
        return origin_check(self.store, self.registry.find, self._archived_events)

    def as_of(self, task_id: str, seq: int | None = None, at: datetime | None = None) -> TaskState:
        """The task's state right after event `seq`, or after the last event written at or before `at`."""
        return self.as_of_event(task_id, seq, at).task

    def as_of_event(self, task_id: str, seq: int | None = None, at: datetime | None = None) -> AsOf:
        """`as_of`, with the event it stops at (its time and actor): what `show --as-of` prints."""
        row = self.store.row(task_id)
        if row is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        return state_as_of(self.store, self._definition, self._archived_events, row, seq=seq, at=at)

    def logs(
        self, task_ids: list[str] | None = None, *, workflow: str | None = None, since: datetime | None = None
    ) -> Iterator[TaskRow | Event]:
        """Task rows each followed by its events, streamed; archived tasks' events come from their files."""
        return task_logs(self.store, self._archived_events, task_ids=task_ids, workflow=workflow, since=since)

    def path(self, task_id: str) -> tuple[TaskRow, Counter[tuple[str, str, str]], str | None]:
        """The task's row, how often it took each (source, trigger, target) edge, and where it is now."""
        return task_path(self.store, self._archived_events, task_id)

    def definition_of(self, task: TaskState) -> Workflow:
        return self._definition(task.workflow, task.version, task.digest)

    # -- internals ------------------------------------------------------
    def _definition(self, name: str, version: int, digest: str) -> Workflow:
        definition = self.registry.find(name, version)
        if definition is None:
            raise Refused(
                f"task is pinned to {name}@{version}, which the loaded code does not define",
                code=Code.DEFINITION_MISSING,
                workflow=name,
                version=version,
            )
        if definition.digest != digest:
            raise Refused(
                f"{name}@{version} changed since the task started (digest {digest[:12]} now "
                f"{definition.digest[:12]}): publish the change as a new version",
                code=Code.DEFINITION_CHANGED,
                workflow=name,
                version=version,
                stored_digest=digest,
                loaded_digest=definition.digest,
            )
        return definition

    def _state(self, loaded: Loaded) -> TaskState:
        # The version the task runs on now must be loadable before anything else is read.
        self._definition(loaded.row.workflow, loaded.row.version, loaded.row.digest)
        return self._fold_checked(loaded)

    def _fold_checked(self, loaded: Loaded) -> TaskState:
        """Fold from the snapshot (or from zero), each event under the version the task was on when it was written."""
        row = loaded.row
        if loaded.snapshot is not None:
            try:
                doc = json.loads(loaded.snapshot.doc)
                if predates_effects(doc):
                    raise ValueError("it predates folded write outcomes")
                start = TaskState.from_doc(doc)
                if (start.task_id, start.seq, start.last_hash) != (
                    row.task_id,
                    loaded.snapshot.seq,
                    loaded.snapshot.hash,
                ):
                    raise IntegrityError("snapshot header disagrees with its row", code=Code.SNAPSHOT_MISMATCH)
                task = fold(
                    self._definition(start.workflow, start.version, start.digest),
                    loaded.events,
                    start,
                    resolve=self._definition,
                )
                if _matches(task, row):
                    return task
                log.warning(
                    "task %s: snapshot at seq %s does not lead to the task row; folding from zero",
                    row.task_id,
                    loaded.snapshot.seq,
                )
            except (IntegrityError, KeyError, ValueError, TypeError) as exc:
                log.warning(
                    "task %s: snapshot at seq %s unusable (%s); folding from zero",
                    row.task_id,
                    loaded.snapshot.seq,
                    exc,
                )
            events: list[Event] = self.store.events(row.task_id, 0, row.seq)
        else:
            events = loaded.events or self._archived_events(row.task_id)
        task = fold(self._definition(*pinned_at_start(row.workflow, events)), events, resolve=self._definition)
        if not _matches(task, row):
            raise IntegrityError(
                f"task {row.task_id}: row says {row.state}@{row.seq}, its events fold to {task.state}@{task.seq}",
                code=Code.STATE_MISMATCH,
                task_id=row.task_id,
            )
        return task

    def resolve_task_id(self, text: str) -> str:
        """The task id `text` names: itself, or the one id it is a prefix of (8+ characters; `task_ids`)."""
        from engine.runtime.task_ids import resolve_task_id

        return resolve_task_id(self.store, text)


def _log_transition(event: Event, duration_ms: float) -> None:
    """One line per transition, key=value, for operators' log pipelines: codes and names, no payload values."""
    code = event_code(event.data) or "-"
    transitions_log.info(
        "task=%s seq=%d actor=%s from=%s trigger=%s to=%s code=%s duration_ms=%.1f summary=%s",
        event.task_id,
        event.seq,
        event.actor,
        event.from_state or "-",
        event.trigger,
        event.to_state,
        code,
        duration_ms,
        json.dumps(summarise(event, values=False), ensure_ascii=False),
    )


def _comment_payload(args: type[BaseModel] | None, comment: str) -> dict[str, Any] | None:
    """Hand the approver's comment to the decision's argument model, under whichever name it uses."""
    if args is None:
        return None
    for name in ("comment", "reason", "note"):
        if name in args.model_fields:
            return {name: comment}
    return {}


def migration_problem(
    source: Workflow, target: Workflow, task: TaskState, state_map: Mapping[str, str], reason: str
) -> str | None:
    """Why this migration may not happen, or None: a pure check, so the CLI and API refuse alike."""
    if target.version == source.version:
        return "the task is already on that version"
    if task.terminal:
        return f"the task has ended (in {task.state!r})"
    if task.unsettled is not None:
        return (
            f"write {task.unsettled['tool']} (action {task.unsettled['action_id']}) is "
            f"{task.unsettled['status']}: migrate once its outcome is settled"
        )
    if not isinstance(reason, str) or not reason.strip():
        return "a reason is required"
    unknown_from = sorted(name for name in state_map if not source.has_state(name))
    unknown_to = sorted(name for name in state_map.values() if not target.has_state(name))
    if unknown_from:
        return f"the map names states {source.ref} does not have: {', '.join(unknown_from)}"
    if unknown_to:
        return f"the map targets states {target.ref} does not have: {', '.join(unknown_to)}"
    if task.state not in state_map:
        return f"the task is in {task.state!r}, which the map does not name: only mapped states move"
    return None


def _matches(task: TaskState, row: TaskRow) -> bool:
    return (task.state, task.seq, task.last_hash, str(task.status), task.version, task.digest) == (
        row.state,
        row.seq,
        row.last_hash,
        row.status,
        row.version,
        row.digest,
    )


def _check_actor(actor: str) -> None:
    if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR_LENGTH:
        raise Refused(
            f"an actor (1 to {MAX_ACTOR_LENGTH} characters) is required for every write",
            code=Code.ACTOR_REQUIRED,
        )
