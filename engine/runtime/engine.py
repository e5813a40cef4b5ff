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
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.audit.auditor import Auditor
from engine.core import commands, remarks
from engine.core.access import Caller, in_tenants
from engine.core.approvals import DECISIONS
from engine.core.canonical import canonical_json, format_instant, now
from engine.core.children import is_spawned
from engine.core.commands import NewTask
from engine.core.decide import Decision, decide
from engine.core.definition import (
    CHILD_TRIGGER_PREFIX,
    SPAWN,
    Agent,
    Child,
    StateKind,
    Tool,
    Workflow,
)
from engine.core.effects import SETTLE, lands_until
from engine.core.errors import (
    Code,
    ConcurrencyConflict,
    IntegrityError,
    LeaseLost,
    RailyardError,
    Refused,
    StoreError,
)
from engine.core.events import Event
from engine.core.fanout import child_records
from engine.core.flow import check_priority, with_declared
from engine.core.fold import apply, fold, pinned_at_start, predates_effects
from engine.core.forks import (
    EXECUTED_OR_MAY,
    FORKED_FROM,
    repeat_hazard,
    writes,
)
from engine.core.lineage import chain_fields, handle
from engine.core.model_interface import ModelAdapter
from engine.core.payloads import EventData, event_code
from engine.core.quality import entered_at
from engine.core.replay import ReplayReport
from engine.core.retries import due_at, waiting
from engine.core.summary import summarise
from engine.core.task import TaskState
from engine.core.timers import next_run_at
from engine.core.webhooks import Outgoing
from engine.observability import hooks
from engine.runtime import config
from engine.runtime.agent import AgentRunner
from engine.runtime.children import ChildRunner
from engine.runtime.flow import Flow, flow_settings
from engine.runtime.leases import current_epoch, current_patience
from engine.runtime.models import open_model
from engine.runtime.offload import INLINE, Offload, run_sync
from engine.runtime.outbox import Outbox
from engine.runtime.registry import Registry
from engine.runtime.roles import Authoriser, PeopleFirst, default_authoriser
from engine.runtime.tool_runner import SETTLE_MARGIN_SECONDS, ToolRunner
from engine.runtime.webhooks import SenderSettings
from engine.store import Loaded, Store, TaskRow, open_store
from engine.store.protocol import FlowStore, TaskQuery, WorkClaim

log = logging.getLogger("railyard.engine")

#: One line per transition (see `_log_transition`); `railyard worker` prints it at INFO.
transitions_log = logging.getLogger("railyard.transitions")

MAX_ACTOR_LENGTH = 200

if TYPE_CHECKING:
    from engine.runtime.people import People


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
    #: The tenant the task belongs to (None: none).
    tenant: str | None = None
    #: After a `backoff`: when the next model call is due (UTC); None when no call is put off.
    next_try_at: str | None = None
    #: A worker put its model call off for quota: which quota, its place in line (`queries.waiting_for_quota`);
    #: None when it waits for none (read from the shared flow rows, not the log).
    waiting_for_quota: dict[str, Any] | None = None
    #: The task that started this one from a child state (its first event's `parent`); None: none did.
    parent: dict[str, Any] | None = None
    #: The tasks this one started from its child states, in order: each one's id, workflow, state and status now,
    #: the seq of its intent and where it ended as the parent recorded it (`engine.core.children`).
    children: list[dict[str, Any]] = field(default_factory=list)

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
            "tenant": self.tenant,
            # Only when a call is put off, so the view of every other task reads as it did.
            **({"next_try_at": self.next_try_at} if self.next_try_at is not None else {}),
            **({"waiting_for_quota": self.waiting_for_quota} if self.waiting_for_quota is not None else {}),
            # Only for tasks in a tree, likewise.
            **({"parent": self.parent} if self.parent is not None else {}),
            **({"children": self.children} if self.children else {}),
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
        # Without one given: the people table first, then the roles file (`roles.PeopleFirst`).
        self.authoriser = authoriser if authoriser is not None else PeopleFirst(self.store, default_authoriser())
        self.snapshot_every = snapshot_every
        self.model = model
        #: Where archived task logs are (`railyard archive` writes them; load, history and replay read them).
        self.archive_dir = Path(archive_dir if archive_dir is not None else config.archive_dir())
        #: Replay, archive, checkpoints, as-of, logs and paths (`engine.audit.auditor`).
        self.audit = Auditor(
            self.store,
            self.registry.find,
            self.archive_dir,
            self._definition,
            signing_key=config.signing_key,
            checkpoint_dir=config.checkpoint_dir,
        )
        #: The webhook subscriptions events are matched against (`engine.runtime.outbox`).
        webhook_settings = config.webhook_settings()
        self.outbox = Outbox(self.store, webhook_settings["refresh_seconds"])
        #: How this process's worker sends them (`engine.runtime.webhooks`).
        self.outbox_settings = SenderSettings.of(webhook_settings)
        self._kept_agent: AgentRunner | None = None
        self._flow: Flow | None = None
        self._flow_given: dict[str, Any] = {}  # `give_flow_settings`: the command line's
        self._people: People | None = None

    def close(self) -> None:
        self.store.close()

    @property
    def people(self) -> People:
        """The people and database tokens of this store and their access trail (`engine.runtime.people`), which
        the API, its CSV export and the `users` and `tokens` commands read and change through the engine."""
        if self._people is None:
            from engine.runtime.people import People  # it builds on this module (the actor's length)

            self._people = People(self.store)
        return self._people

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
        *,
        tenant: str | None = None,
        priority: int | None = None,
    ) -> str:
        """Start a task on `workflow` (newest version unless `version`); returns its id. It belongs to the actor's
        tenant (`tenant` chooses among the actor's, or names any for an actor confined to none). `priority`: its
        place when quota is short (higher first; None: its workflow's, `engine.core.flow`)."""
        _check_actor(actor)
        ranked = check_priority(priority) if priority is not None else None
        definition = self.registry.get(workflow, version)
        created = commands.start(
            definition, input, caller=self._caller(actor), task_id=str(uuid.uuid4()), at=now(), tenant=tenant
        )
        if ranked is not None:
            created = replace(created, row=replace(created.row, priority=ranked))
        return self._create(definition, created)

    def create(self, definition: Workflow, created: NewTask) -> str:
        """The one create path, for a task a command made (`start`, `fork`, a child state's child). A child is
        created with its parent's name on its row (`engine.core.lineage`), for the lists and the work queue."""
        link = created.task.parent
        if link is not None:
            created = replace(created, fields={**created.fields, **self._chain_fields(str(link["task_id"]))})
        return self._create(definition, created)

    def _chain_fields(self, parent_id: str) -> dict[str, str]:
        """What a child's row says of its parent: its id, workflow and handle, read from the parent's row and
        searchable fields (two bounded queries, never its log)."""
        found = self.store.list_tasks(TaskQuery(id_prefix=parent_id, limit=1))
        if not found or found[0].row.task_id != parent_id:
            return chain_fields(parent_id, "", parent_id[:8])
        row = found[0].row
        definition = self.registry.find(row.workflow, row.version)
        searchable = definition.searchable if definition is not None else ()
        return chain_fields(parent_id, row.workflow, handle(parent_id, searchable, found[0].fields))

    def _create(self, definition: Workflow, created: NewTask) -> str:
        """The one create path: a new task's row and first event in one write, then the hooks and the log line."""
        outbox = self.outbox.for_event(definition, created.first, created.row.status)
        self.store.create(created.row, created.first, created.fields, outbox)
        if hooks.active:
            hooks.transition(created.first, definition.name, definition.version, time.perf_counter())
        if transitions_log.isEnabledFor(logging.INFO):
            _log_transition(created.first, 0.0)
        return created.row.task_id

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
        caller = self._caller(actor)
        task = self._as_seen(task_id, expected_seq, caller)
        if trigger in DECISIONS and self.definition_of(task).state(task.state).kind is StateKind.APPROVAL:
            # One way to decide an approval, whichever door it comes through: the same checks and the same
            # record as `approve` / `reject`. The payload names the digest the approver saw, and a comment.
            fields = dict(payload or {})
            digest = fields.pop("digest", None)
            comment = next((str(fields[k]) for k in ("comment", "reason", "note") if k in fields), "")
            verdict: Literal["approve", "reject"] = "approve" if trigger == "approve" else "reject"
            return self._decide_approval(
                task_id, verdict, caller, digest if isinstance(digest, str) else None, comment, loaded=task
            )
        if trigger == SETTLE:
            fields = dict(payload or {})
            return self._settle(task, caller, fields.get("outcome"), fields.get("evidence"))
        decision = decide(self.definition_of(task), task, trigger, payload, actor=actor, roles=caller.roles)
        return self._human(task, lambda: self.commit(task, decision, actor=actor))

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
        event = decision.sealed(task, actor, now())
        after = apply(definition, task, event)
        snapshot = None
        if after.seq // self.snapshot_every > task.seq // self.snapshot_every:
            snapshot = (after.seq, after.last_hash, canonical_json(after.to_doc()))
        try:
            self._append_kept(
                event,
                task.seq,
                status=str(after.status),
                snapshot=snapshot,
                next_run_at=next_run_at(definition, after.state, event.at, due_at(after.visit)),
                lease_epoch=current_epoch(task.task_id),
                outbox=self.outbox.for_event(definition, event, str(after.status), after),
            )
        except ConcurrencyConflict:
            if hooks.active:
                hooks.conflict(task)
            raise
        if hooks.active:
            hooks.transition(event, task.workflow, task.version, started, self._entered(event))
        if transitions_log.isEnabledFor(logging.INFO):
            _log_transition(event, (time.perf_counter() - started) * 1000)
        if after.terminal and task.parent is not None:
            self._wake_parent(task.parent)
        return after

    def _wake_parent(self, parent: Mapping[str, Any]) -> None:
        """A child ended: its parent, waiting in the child state that started it, is due now (`Store.wake`). A wake
        that a crash loses costs the parent time, not its end: the parent's timer looks again
        (`engine.runtime.children`)."""
        try:
            self.store.wake(str(parent["task_id"]), str(parent["state"]), now())
        except StoreError as error:
            log.warning("task %s: its parent was not woken (%s); its timer looks again", parent["task_id"], error.code)

    def _append_kept(
        self,
        event: Event,
        expected_seq: int,
        *,
        status: str,
        snapshot: tuple[int, str, str] | None,
        next_run_at: datetime | None,
        lease_epoch: int | None,
        outbox: Sequence[Outgoing] = (),
    ) -> None:
        """Append `event` (with the webhook messages it brings, in the same write); under a worker's lease, keep the
        sealed event and try again while the database does not answer, for as long as the lease's `patience`
        (issue #33): a model's answer or a tool's outcome is written once the database is back instead of being
        thrown away and paid for again.

        The same event goes each time (same seq, hash and lease epoch), so a try whose write went through but
        whose acknowledgement was lost meets a conflict on the next one, finds its own event at its seq (same
        hash) and counts as written. Any other conflict, a lost lease, or a write the database refused is raised
        as it is; so is the last failure once the patience is spent.
        """
        patience = current_patience(event.task_id)
        deadline, pause, tried = time.monotonic() + patience, 0.05, False
        while True:
            try:
                self.store.append(
                    event.task_id,
                    expected_seq,
                    [event],
                    status=status,
                    snapshot=snapshot,
                    next_run_at=next_run_at,
                    lease_epoch=lease_epoch,
                    outbox=outbox,
                )
                return
            except ConcurrencyConflict as conflict:
                if tried and not isinstance(conflict, LeaseLost) and self._written(event):
                    log.info("task %s: seq %s was written by the try whose answer was lost", event.task_id, event.seq)
                    return
                raise
            except StoreError as error:
                if not error.transient or time.monotonic() + pause > deadline:
                    raise
                log.warning(
                    "task %s: the database did not take seq %s (%s); trying again in %.2f s",
                    event.task_id,
                    event.seq,
                    error.code,
                    pause,
                )
                tried = True
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _written(self, event: Event) -> bool:
        """Whether the log holds `event` itself at its seq (a lost acknowledgement), not another writer's."""
        try:
            found = self.store.events(event.task_id, after_seq=event.seq - 1, upto_seq=event.seq)
        except StoreError:
            return False
        return len(found) == 1 and found[0].hash == event.hash

    def commit_system(self, task: TaskState, trigger: str, data: EventData, *, actor: str) -> TaskState:
        """Fire one of the engine's own triggers (repair, call, an outcome, limit, ...) with the data it records.

        `decide` still checks it is a legal transition from where the task stands.
        """
        decision = decide(self.definition_of(task), task, trigger, None, actor=actor, system=True)
        return self.commit(task, replace(decision, data={**decision.data, **data}), actor=actor)

    def step(self, task_id: str, *, model: ModelAdapter | None = None, thinking: bool = False) -> TaskState:
        """Run one model turn for a task in an agent state: exactly one event, whatever the model does."""
        runner = self._agent(self._model(model), thinking, INLINE)
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

        A `backoff` (a provider failing for a while) ends the run too: the next call is due at the event's
        `retry.due_at`, the task's row is put off until then, and a worker (or a later `run`) makes it. No
        process sleeps through a durable wait.
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
        children: ChildRunner | None = None
        tools = ToolRunner(self, io=io)
        for _ in range(max_turns):
            state = self.definition_of(task).state(task.state)
            if task.terminal or (until is not None and until()):
                break
            if isinstance(state, Agent):
                if waiting(task.visit, now()) > 0:
                    break  # a backoff's due time is not here yet: the row is put off until then
                agent = agent or self._agent(self._model(model), thinking, io)
                task = await hooks.step(task, "agent", agent.turn)
            elif isinstance(state, Tool):
                task = await hooks.step(task, "tool", tools.advance)
            elif isinstance(state, Child):
                children = children or ChildRunner(self, io=io)
                after = await hooks.step(task, "child", children.advance)
                if after.seq == task.seq or (after.state == task.state and is_spawned(after)):
                    task = after
                    break  # waiting for the child: the task holds nothing meanwhile
                task = after
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
        # The ladder's memory is per process: a runner for another adapter (or offload) takes the last one's over.
        memory = kept.memory if kept is not None else None
        runner = self._kept_agent = AgentRunner(
            self, adapter, thinking=thinking, io=io, memory=memory, flow=self.flow_control()
        )
        return runner

    def flow_control(self) -> Flow | None:
        """The breaker and quotas this engine's model calls honour, shared through its store with every worker on
        the database (None: a store without the rows, `FlowStore`). Its settings are read once, on first use."""
        if self._flow is None and isinstance(self.store, FlowStore):
            declared = {w.name: w.priority for w in sorted(self.registry, key=lambda w: w.version)}  # newest wins
            self._flow = Flow(self.store, with_declared(flow_settings(self._flow_given), declared))
            self._flow.breaker_messages = self.outbox.for_breaker
        return self._flow

    def give_flow_settings(self, given: Mapping[str, Any]) -> None:
        """Flow settings given on the command line (`railyard worker --quotas`), in the profiles file's shape,
        over the environment's and the file's; CONFIG_INVALID now if they do not read."""
        flow_settings(given)
        self._flow_given, self._flow = dict(given), None

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
        _check_actor(actor)
        caller = self._caller(actor)
        return self._decide_approval(task_id, "approve", caller, prepared_digest, comment, expected_seq=expected_seq)

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
        _check_actor(actor)
        caller = self._caller(actor)
        return self._decide_approval(task_id, "reject", caller, prepared_digest, reason, expected_seq=expected_seq)

    def approvals(
        self, *, role: str | None = None, after: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Tasks awaiting a human decision (optionally for one role), each with the prepared call; with `after`
        (a task id) only those after it, oldest first; at most `limit`. The read is `queries.approvals`'s, for the
        trusted process (every task)."""
        from engine.runtime import queries  # the read side builds on the engine

        return queries.approvals(self, None, role=role, after=after, limit=limit)[0]

    def _decide_approval(
        self,
        task_id: str,
        verdict: Literal["approve", "reject"],
        caller: Caller,
        digest: str | None,
        comment: str,
        *,
        loaded: TaskState | None = None,
        expected_seq: int | None = None,
    ) -> TaskState:
        """`loaded`: the task as the caller just loaded it (then `expected_seq` was checked already)."""
        task = loaded if loaded is not None else self._as_seen(task_id, expected_seq, caller)
        decision = commands.approval(
            self.definition_of(task),
            task,
            verdict,
            caller=caller,
            digest=digest,
            comment=comment,
            earlier_digests=lambda: self._prepared_digests(task.task_id),
        )
        return self._human(task, lambda: self.commit(task, decision, actor=caller.actor))

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
        _check_actor(actor)
        caller = self._caller(actor)
        task = self._as_seen(task_id, expected_seq, caller)
        definition = self.definition_of(task)
        decision = commands.cancel(definition, task, caller=caller, reason=reason)
        after = self._human(task, lambda: self.commit(task, decision, actor=actor))
        if isinstance(definition.state(after.state), Child) and after.cancel_requested is not None:
            after = self._propagate_cancel(after)
        return after

    def _propagate_cancel(self, task: TaskState) -> TaskState:
        """A cancel that waits for a child: pass it on to the child now (its state's `on_parent_end`), rather than at
        the next worker's look. The task is due, so a failure here leaves the rest to a worker."""
        try:
            return ChildRunner(self).step(task)
        except RailyardError as error:
            log.warning("task %s: its cancel is passed on to its child by a worker (%s)", task.task_id, error.code)
            return task

    def settle(
        self, task_id: str, actor: str, outcome: str, evidence: str, *, expected_seq: int | None = None
    ) -> TaskState:
        """Record what an operator verified about a write whose outcome is open: `executed` or `not_executed`.

        The actor must hold the workflow's `settle_role` (else its `cancel_role`). `executed` is recorded as the
        write's outcome, and a retry then records it succeeded without calling; only `not_executed` lets a
        retry send it again. With a cancel waiting, the task goes where the cancel says.
        """
        _check_actor(actor)
        caller = self._caller(actor)
        return self._settle(self._as_seen(task_id, expected_seq, caller), caller, outcome, evidence)

    def _settle(self, task: TaskState, caller: Caller, outcome: Any, evidence: Any) -> TaskState:
        definition = self.definition_of(task)
        running = self._attempt_running(definition, task) if task.unsettled is not None else None
        decision = commands.settle(definition, task, caller=caller, outcome=outcome, evidence=evidence, running=running)
        return self._human(task, lambda: self.commit(task, decision, actor=caller.actor))

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

    # -- remarks: notes and who is on a work item (engine.core.remarks) ------------------------------
    def note(self, task_id: str, actor: str, text: str) -> TaskState:
        """Record a person's note on the task: a `comment` event where it stands, shown in its timeline and sent to
        its model only when the workflow says so (`Workflow.notes_to_model`). It makes no decision stale. Refused on
        an ended task (TASK_TERMINAL), for an auditor (FORBIDDEN), for empty or overlong text (PAYLOAD_INVALID)."""
        _check_actor(actor)
        caller = self._caller(actor)
        return self._remark(
            task_id, caller, lambda definition, task: remarks.comment(definition, task, caller=caller, text=text)
        )

    def _remark(
        self, task_id: str, caller: Caller, make: Callable[[Workflow, TaskState], Decision], *, tries: int = 5
    ) -> TaskState:
        """Append a remark where the task stands now. The task's status and timers stay as they are (a note does not
        put off an approval's deadline), a live claim carries over to the new seq, and no hook counts it as a
        transition. Another writer's event in between is met by deciding the remark again on the task as it is
        then: a remark means the same whatever moved (and an ended task refuses it)."""
        for attempt in range(tries):
            task = self.load(task_id)
            self._within_tenants(task_id, task.tenant, caller)
            definition = self.definition_of(task)
            decision = make(definition, task)
            row = self.store.row(task_id)
            if row is None or row.seq != task.seq:
                continue
            if (busy := remarks.busy_refusal(task_id, row.lease_owner, row.lease_expires_at, now())) is not None:
                raise busy
            event = decision.sealed(task, caller.actor, now())
            after = apply(definition, task, event)
            snapshot = None
            if after.seq // self.snapshot_every > task.seq // self.snapshot_every:
                snapshot = (after.seq, after.last_hash, canonical_json(after.to_doc()))
            try:
                self.store.append(
                    task_id, task.seq, [event], status=str(after.status), snapshot=snapshot, next_run_at=row.next_run_at
                )
            except ConcurrencyConflict:
                if attempt + 1 == tries:
                    raise
                continue
            self.store.carry_claim(task_id, task.seq, after.seq)
            return after
        raise ConcurrencyConflict(task_id, -1, None)

    # -- who is on a work item: claims (a side table for the queue, and an event in the log) ------------
    #: How long a claim on a work item lasts unless renewed: a morning's stretch of work, not a day.
    CLAIM_MINUTES = 30

    def claim_work(self, task_id: str, actor: str, *, take_over: str | None = None) -> WorkClaim:
        """Put `actor` on the task's work item for `CLAIM_MINUTES` (renewing their own claim), so others see who
        has it. Someone else's live claim is refused (WORK_CLAIMED, naming them) unless `take_over` gives the
        reason to take it; an auditor, who acts on nothing, may not claim (FORBIDDEN); an ended task has no work
        (TASK_TERMINAL). Which items are a person's work is the read side's to say; this records who is on one.

        The side table decides the race (of two claimers one wins, `Store.claim_work`) and is what the queue
        reads; the winner's claim (and a take-over's reason) is then recorded as a `work_claimed` event, which
        makes no decision stale (`engine.core.remarks`)."""
        _check_actor(actor)
        caller = self._caller(actor)
        row = self.store.row(task_id)
        if row is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        self._within_tenants(task_id, row.tenant, caller)
        definition = self._definition(row.workflow, row.version, row.digest)
        remarks.may_remark(definition, task_id, row.state, row.status == "terminal", caller, "claim")
        # Asked of the row before the claim table is written, as `_remark` asks it again before the event.
        if (busy := remarks.busy_refusal(task_id, row.lease_owner, row.lease_expires_at, now())) is not None:
            raise busy
        reason = take_over.strip() if take_over is not None else None
        if take_over is not None and not reason:
            raise Refused("taking over someone's claim needs a reason", code=Code.PAYLOAD_INVALID, task_id=task_id)
        at = now()
        held = self.store.claim_work(
            task_id, actor, at=at, until=at + timedelta(minutes=self.CLAIM_MINUTES), take_over=reason
        )
        if held is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        if held.actor != actor:
            raise Refused(
                f"{held.actor} is on task {task_id} (claimed until {format_instant(held.expires_at)}): "
                "leave it to them, or take it over with a reason",
                code=Code.WORK_CLAIMED,
                task_id=task_id,
                claimed_by=held.actor,
                until=format_instant(held.expires_at),
            )
        after = self._remark(
            task_id,
            caller,
            lambda definition, task: remarks.claimed(
                definition, task, caller=caller, until=held.expires_at, taken_from=held.taken_from, reason=held.reason
            ),
        )
        return replace(held, seq=after.seq)

    def release_work(self, task_id: str, actor: str) -> bool:
        """Take `actor` off the task's work item (a `work_released` event); False when they were not on it."""
        _check_actor(actor)
        caller = self._caller(actor)
        if not self.store.release_work(task_id, actor):
            return False
        row = self.store.row(task_id)
        if row is not None and row.status != "terminal":
            self._remark(task_id, caller, lambda _definition, task: remarks.released(task))
        return True

    def _caller(self, actor: str) -> Caller:
        """The trusted caller an actor is: the roles and tenants the authoriser gives it."""
        return Caller(actor, frozenset(self.authoriser.roles_of(actor)), self.authoriser.tenants_of(actor))

    def caller(self, actor: str) -> Caller:
        """The person `actor` is to this process (the authoriser's roles): whom a read made for them is scoped to
        (the CLI's `--as` on reads)."""
        _check_actor(actor)
        return self._caller(actor)

    def _as_seen(self, task_id: str, expected_seq: int | None, caller: Caller) -> TaskState:
        """The task a human command is decided on: as it is now, and at `expected_seq` if the caller names one.
        A task of a tenant the caller is not of is, to it, no task (`engine.core.access.in_tenants`)."""
        task = self.load(task_id)
        self._within_tenants(task_id, task.tenant, caller)
        if expected_seq is not None and expected_seq != task.seq:
            # Only what changes a decision makes it stale: notes and claims since the seq the person saw do not
            # (`engine.core.remarks`). The command is then decided on the task as it is, which they saw.
            since = self.store.events(task_id, after_seq=expected_seq) if 0 < expected_seq < task.seq else []
            moved = remarks.decisive_after(since, expected_seq) if since else None
            if moved is not None or not since:
                raise ConcurrencyConflict(
                    task_id,
                    expected_seq,
                    task.seq,
                    task.state,
                    by=moved.actor if moved is not None else None,
                    trigger=moved.trigger if moved is not None else None,
                    to_state=moved.to_state if moved is not None else None,
                )
        return task

    def _within_tenants(self, task_id: str, tenant: str | None, caller: Caller) -> None:
        if not in_tenants(tenant, caller):
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)

    def _human(self, task: TaskState, append: Callable[[], TaskState]) -> TaskState:
        """Append a human command decided on `task`; if the task moved meanwhile, say where it is now."""
        try:
            return append()
        except LeaseLost:
            raise
        except ConcurrencyConflict:
            row = self.store.row(task.task_id)
            moved = remarks.decisive_after(self.store.events(task.task_id, after_seq=task.seq), task.seq)
            raise ConcurrencyConflict(
                task.task_id,
                task.seq,
                row.seq if row else None,
                row.state if row else None,
                by=moved.actor if moved is not None else None,
                trigger=moved.trigger if moved is not None else None,
                to_state=moved.to_state if moved is not None else None,
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
        caller = self._caller(actor)
        task = self._as_seen(task_id, None, caller)
        target = self.registry.get(task.workflow, to_version)
        decision = commands.migrate(self.definition_of(task), target, task, state_map, caller=caller, reason=reason)
        event = decision.sealed(task, actor, now())
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
            hooks.transition(event, target.name, target.version, time.perf_counter(), self._entered(event))
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
        caller = self._caller(actor)
        self._within_tenants(task_id, row.tenant, caller)
        definition = self._definition(row.workflow, row.version, row.digest)
        refusal = commands.fork_refusal(definition, row, at_seq, caller=caller, reason=reason)
        if refusal is not None:
            raise refusal
        source = self.audit.as_of(task_id, seq=at_seq)
        hazard = None
        if not source.terminal:
            hazard = repeat_hazard(
                writes(self._events(task_id), at_seq),
                at_seq,
                source.prepared["action_id"] if source.prepared else None,
                source_live=False,
            ) or self._sibling_hazard(task_id)
        refusal = commands.fork_source_refusal(source, task_id, hazard)
        if refusal is not None:
            raise refusal
        target = self.registry.get(source.workflow, version)
        created = commands.fork(
            self.definition_of(source),
            target,
            source,
            source_id=task_id,
            caller=caller,
            reason=reason,
            task_id=str(uuid.uuid4()),
            at=now(),
            forked_from=FORKED_FROM,  # how the next fork of the same source finds this one
        )
        return self._create(target, created)

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
        caller = self._caller(actor)
        task = self._as_seen(task_id, expected_seq, caller)
        decision = commands.redrive(
            self.definition_of(task),
            task,
            self.events_of(task),
            to_state,
            caller=caller,
            reason=reason,
            state_at=lambda seq: self.audit.as_of(task_id, seq=seq),
        )
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
            tenant=task.tenant,
            next_try_at=None if task.terminal else task.visit.get("due_at"),
            parent=dict(task.parent) if task.parent is not None else None,
            children=self.children_of(task) if definition.starts_children else [],
        )

    def children_of(self, task: TaskState) -> list[dict[str, Any]]:
        """The children `task` started up to its seq, read from its log, each with its state now (the tree that
        `show`, the API and the task page draw)."""
        found: dict[str, dict[str, Any]] = {}
        for event in self._events(task.task_id):
            if event.seq > task.seq:
                break
            for record in child_records(event.data):  # a single child, or a fan-out's, in the order of its items
                child_id = record["task_id"]
                if event.trigger == SPAWN:
                    found[child_id] = {
                        "task_id": child_id,
                        "workflow": record.get("workflow"),
                        "state_of_parent": event.from_state,
                        "spawn_seq": event.seq,
                        "ended": None,
                    }
                elif child_id in found and event.trigger.startswith(CHILD_TRIGGER_PREFIX):
                    found[child_id]["ended"] = {"state": record.get("state"), "result": record.get("result")}
        for child in found.values():
            row = self.store.row(child["task_id"])
            child["state"], child["status"] = (row.state, row.status) if row is not None else (None, None)
        return list(found.values())

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

    def _entered(self, event: Event) -> Callable[[], datetime | None]:
        """When the task `event` moves had entered the state it was in, read from its log: what the state-time
        metric asks when this process did not see the task enter it."""
        return lambda: entered_at(self.store.events(event.task_id, upto_seq=event.seq - 1))

    # -- audit (engine.audit.auditor) ------------------------------------------------------------------
    def replay(self, task_id: str, *, jobs: int = 1) -> ReplayReport:
        """Check the task's whole log from zero, without calling any model or tool (`Auditor.replay`): the one
        audit verb the façade keeps; the others are `engine.audit`'s."""
        return self.audit.replay(task_id, jobs=jobs)

    def _archived_events(self, task_id: str) -> list[Event]:
        return self.audit.archived_events(task_id)

    def definition_of(self, task: TaskState) -> Workflow:
        return self._definition(task.workflow, task.version, task.digest)

    def pinned_definition(self, name: str, version: int, digest: str) -> Workflow:
        """`name@version` as this process defines it, refused unless its digest is `digest` (DEFINITION_MISSING,
        DEFINITION_CHANGED): what a child's intent pinned."""
        return self._definition(name, version, digest)

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

    def resolve_task_id(
        self, text: str, workflows: Sequence[str] | None = None, tenants: Sequence[str] | None = None
    ) -> str:
        """The task id `text` names: itself, or the one id it is a prefix of (8+ characters; `task_ids`), among
        the tasks of `workflows` and `tenants` if given (what a caller may read)."""
        from engine.runtime.task_ids import resolve_task_id

        return resolve_task_id(self.store, text, workflows, tenants)


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
