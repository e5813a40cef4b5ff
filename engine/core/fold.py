"""Fold a task's events into its state: a pure function, no database, no clock.

The state of a task is never kept alive in memory between steps; it is what
the fold of its log says. Loading folds from the latest snapshot; replay folds
from zero. Both use `apply`, so they cannot disagree about what an event means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.core.canonical import GENESIS_HASH, canonical_json, format_instant, sha256_hex
from engine.core.children import result_fact
from engine.core.definition import (
    CALL,
    CHILD_TRIGGER_PREFIX,
    COMMENT,
    FORK,
    MIGRATE,
    REDRIVE,
    SPAWN,
    START,
    Agent,
    Workflow,
)
from engine.core.effects import next_cancel_request, next_effect
from engine.core.errors import Code, IntegrityError
from engine.core.events import Event
from engine.core.fanout import result_fact as fan_out_fact
from engine.core.payloads import EventData, PreparedCallData
from engine.core.task import Status, TaskState
from engine.core.visit import next_visit

#: The prefix of a note's key in `facts`, with the seq it was written at (`Workflow.notes_to_model` only): untrusted
#: human text, kept apart from arguments like a tool's result, shown to a model only inside tags of its own.
NOTE_FACT = "note:"


def predates_effects(doc: dict[str, Any]) -> bool:
    """Whether a snapshot was written before writes' outcomes were folded: it has a prepared call and no `effect`.

    Such a snapshot cannot say whether a write's intent is still open, so neither load nor replay may start
    from it: an open intent read as "never sent" would be sent again.
    """
    return doc.get("prepared") is not None and "effect" not in doc


def initial(definition: Workflow, event: Event) -> TaskState:
    """The state after the first event (seq 1): a `start`, or a `fork` with the state it carries."""
    if event.seq != 1 or event.trigger not in (START, FORK) or event.prev_hash != GENESIS_HASH:
        raise IntegrityError(
            f"task {event.task_id}: first event is not a start event at seq 1",
            code=Code.SEQ_GAP if event.seq != 1 else Code.HASH_MISMATCH,
            task_id=event.task_id,
            seq=event.seq,
        )
    if event.trigger == FORK:
        return forked(definition, event)
    return TaskState(
        task_id=event.task_id,
        workflow=definition.name,
        version=definition.version,
        digest=event.data.get("digest", definition.digest),
        state=event.to_state,
        status=definition.status_of(event.to_state),
        seq=1,
        last_hash=event.hash,
        input=event.data.get("input", {}),
        visit=next_visit(definition, {}, event.trigger, event.to_state, event.data),
        started_by=event.actor,
        tenant=event.data.get("tenant"),
        parent=event.data.get("parent"),
        usage={"turns": 0, "calls": 0, "repeats": {}, "started_at": format_instant(event.at)},
    )


def forked(definition: Workflow, event: Event) -> TaskState:
    """The state after a `fork` event: the source's state as of the fork's seq (`carried`), under this task's id.

    What a fork starts again is the deadline (`started_at` is the fork's time: a fork of an old task is not out of
    time before it runs); the other counters carry, so forking does not buy a looping task more turns (`redrive`
    is the explicit way to). A cancel waiting in the source is not the fork's: a fork never carries an open write.
    """
    carried = event.data["carried"]
    return TaskState(
        task_id=event.task_id,
        workflow=definition.name,
        version=definition.version,
        digest=event.data.get("digest", definition.digest),
        state=event.to_state,
        status=definition.status_of(event.to_state),
        seq=1,
        last_hash=event.hash,
        input=event.data.get("input", {}),
        facts=carried["facts"],
        visit=carried["visit"],
        started_by=carried["started_by"],
        tenant=carried.get("tenant"),
        prepared=carried["prepared"],
        prepared_by=carried["prepared_by"],
        usage={**carried["usage"], "started_at": format_instant(event.at)},
        effect=carried["effect"],
    )


def apply(definition: Workflow, task: TaskState, event: Event) -> TaskState:
    """The state after `event`. Checks only that the event continues the chain (seq and prev_hash)."""
    folding = Fold(definition, task)
    folding.step(event)
    return folding.record()


class Fold:
    """A task's state being folded event by event; a `TaskState` is made only when asked for (`record()`).

    `apply` is one step of this. Load and replay fold long runs of events and need
    the record only at the end or at a snapshot: building the 15-field record after
    every event was a sixth of replay's cost. There is one fold: `apply`, `fold`
    and replay's `LogCheck` all step through this class.
    """

    __slots__ = (
        "_own_facts",
        "cancel_requested",
        "definition",
        "digest",
        "effect",
        "facts",
        "last_hash",
        "prepared",
        "prepared_by",
        "seq",
        "state",
        "status",
        "task",
        "usage",
        "version",
        "visit",
    )

    def __init__(self, definition: Workflow, task: TaskState) -> None:
        self.definition = definition  # a caller that follows a migration sets the version it moves to
        self.task = task  # what does not change: id, workflow, input, who started it
        self.state, self.status = task.state, task.status
        self.seq = task.seq
        self.last_hash = task.last_hash
        self.version, self.digest = task.version, task.digest
        self.facts, self.visit, self.usage = task.facts, task.visit, task.usage
        self.prepared, self.prepared_by = task.prepared, task.prepared_by
        self.effect, self.cancel_requested = task.effect, task.cancel_requested
        #: Whether `facts` is a dict this fold made (and may add to) rather than one a TaskState holds.
        self._own_facts = False

    @property
    def terminal(self) -> bool:
        return self.status is Status.TERMINAL

    def step(self, event: Event) -> None:
        """Fold one event, which must continue the chain (seq and prev_hash)."""
        if event.seq != self.seq + 1:
            raise IntegrityError(
                f"task {self.task.task_id}: event seq {event.seq} does not follow {self.seq}",
                code=Code.SEQ_GAP,
                task_id=self.task.task_id,
                seq=event.seq,
            )
        if event.prev_hash != self.last_hash:
            raise IntegrityError(
                f"task {self.task.task_id}: event {event.seq} does not chain to event {self.seq}",
                code=Code.HASH_MISMATCH,
                task_id=self.task.task_id,
                seq=event.seq,
            )
        status = self.definition.status_of(event.to_state)  # KeyError for a state the definition does not have
        data, trigger = event.data, event.trigger
        args = data.get("args")
        if args is not None:
            if not self._own_facts:
                self.facts, self._own_facts = self.facts.copy(), True
            self.facts[trigger] = args
        result = data.get("tool_result")
        if result is not None:  # untrusted data: kept apart from arguments, shown to a model only inside tags
            ok, failed = f"tool:{result['tool']}", f"tool_error:{result['tool']}"
            facts = {k: v for k, v in self.facts.items() if k not in (ok, failed)}
            if "result" in result:
                facts[ok] = result["result"]
            else:
                facts[failed] = result["error"]
            self.facts, self._own_facts = facts, True
        child = data.get("child")
        if child is not None and trigger.startswith(CHILD_TRIGGER_PREFIX):  # a child's end: what the parent reads
            if not self._own_facts:
                self.facts, self._own_facts = self.facts.copy(), True
            self.facts[f"child:{event.from_state}"] = result_fact(child)
        if trigger == COMMENT and self.definition.notes_to_model:  # a note the workflow lets its model read
            note = data.get("note")
            if isinstance(note, dict):
                if not self._own_facts:
                    self.facts, self._own_facts = self.facts.copy(), True
                self.facts[f"{NOTE_FACT}{event.seq}"] = {"by": event.actor, "text": note.get("text", "")}
        fan = data.get("fan_out")
        if fan is not None and trigger.startswith(CHILD_TRIGGER_PREFIX):  # a fan-out's end: the join, in order
            if not self._own_facts:
                self.facts, self._own_facts = self.facts.copy(), True
            self.facts[f"children:{event.from_state}"] = fan_out_fact(fan)
        self.visit = next_visit(self.definition, self.visit, trigger, event.to_state, data, event.from_state, event.seq)
        self.effect = next_effect(self.effect, event)
        self.cancel_requested = next_cancel_request(self.cancel_requested, event, self.effect)
        if "prepared" in data:
            self.prepared, self.prepared_by = data["prepared"], event.actor
        if trigger == MIGRATE:  # from here on the task is pinned to the version the event names
            self.version, self.digest = self.definition.version, self.definition.digest
        self.usage = count_usage(self.usage, event)
        if self.definition.budgets.counts_tokens and "turn" in data:
            self.usage = count_tokens(self.usage, self.definition, event)
        self.state, self.status, self.seq, self.last_hash = event.to_state, status, event.seq, event.hash

    def resync(self, seq: int, last_hash: str) -> None:
        """Go on as if the fold had reached `seq` with `last_hash` (replay follows a log past a broken link)."""
        self.seq, self.last_hash = seq, last_hash

    def record(self) -> TaskState:
        """The record of the state folded so far; folding on afterwards leaves it as it is."""
        task = self.task
        self._own_facts = False  # the record holds `facts` now: the next step copies it before adding
        return TaskState(
            task.task_id,
            task.workflow,
            self.version,
            self.digest,
            self.state,
            self.status,
            self.seq,
            self.last_hash,
            task.input,
            self.facts,
            self.visit,
            task.started_by,
            self.prepared,
            self.prepared_by,
            self.usage,
            self.effect,
            self.cancel_requested,
            task.tenant,
            task.parent,
        )


def count_usage(usage: dict[str, Any], event: Event) -> dict[str, Any]:
    """The budget counters after `event`: a model turn, or a tool call (by tool and normalised arguments)."""
    if "turn" in event.data:
        return {**usage, "turns": int(usage.get("turns", 0)) + 1}
    if event.trigger == REDRIVE:  # an operator sent the task back: every budget starts again (the event says from what)
        return {"turns": 0, "calls": 0, "repeats": {}, "started_at": format_instant(event.at)}
    if event.trigger == SPAWN:  # a child start counts against `Budgets.children`, a fan-out's N whole
        fan = event.data.get("fan_out")
        started = len(fan["children"]) if isinstance(fan, dict) else 1
        return {**usage, "children": int(usage.get("children", 0)) + started}
    if event.trigger == CALL:
        key = call_key(event.data["intent"])
        repeats = dict(usage.get("repeats", {}))
        repeats[key] = int(repeats.get(key, 0)) + 1
        return {**usage, "calls": int(usage.get("calls", 0)) + 1, "repeats": repeats}
    return usage


def count_tokens(usage: dict[str, Any], definition: Workflow, event: Event) -> dict[str, Any]:
    """The token counters after a model turn: the task's, and the agent state's the turn was made in.

    Kept only for definitions with a token budget, so tasks of other definitions fold (and snapshot) as before.
    """
    spent = turn_tokens(event.data)
    if not spent:
        return usage
    source = event.from_state or ""
    state = definition.state(source) if definition.has_state(source) else None
    base = state.base if isinstance(state, Agent) else source
    by_state = dict(usage.get("state_tokens", {}))
    by_state[base] = int(by_state.get(base, 0)) + spent
    return {**usage, "tokens": int(usage.get("tokens", 0)) + spent, "state_tokens": by_state}


def turn_tokens(data: EventData) -> int:
    """Input plus output tokens of a model turn, as the provider reported them (0 when it reported none)."""
    turn = data.get("turn")
    usage = turn.get("usage") if isinstance(turn, dict) else None
    if not isinstance(usage, dict):
        return 0
    return sum(v for k, v in usage.items() if k in ("input_tokens", "output_tokens") and isinstance(v, int))


#: The definition a task is pinned to, by (name, version, digest); refuses DEFINITION_MISSING / _CHANGED.
Resolve = Callable[[str, int, str], Workflow]


def fold(
    definition: Workflow, events: Iterable[Event], start: TaskState | None = None, resolve: Resolve | None = None
) -> TaskState:
    """Fold `events` onto `start` (a snapshot), or from the `start` event when there is none.

    `definition` is the version the first event is folded with; a `migrate` event switches to the
    version it names, found with `resolve` (without one, a migrated log cannot be folded).
    """
    folding = Fold(definition, start) if start is not None else None
    for event in events:
        if folding is None:
            folding = Fold(definition, initial(definition, event))
            continue
        if event.trigger == MIGRATE:
            folding.definition = migration_target(folding.record(), event, resolve)
        folding.step(event)
    if folding is None:
        raise IntegrityError("no events to fold", code=Code.SEQ_GAP)
    return folding.record()


def pinned_at_start(workflow: str, events: list[Event]) -> tuple[str, int, str]:
    """(name, version, digest) the task started on, as its `start` event recorded them."""
    if not events:
        raise IntegrityError("a task without events", code=Code.SEQ_GAP)
    data = events[0].data
    ref = str(data.get("workflow", ""))
    name, _, version = ref.rpartition("@")
    if name != workflow or not version.isdigit() or not isinstance(data.get("digest"), str):
        raise IntegrityError(
            f"the start event names {ref!r}, not a version of {workflow}",
            code=Code.STATE_MISMATCH,
            task_id=events[0].task_id,
        )
    return name, int(version), data["digest"]


def migration_target(task: TaskState, event: Event, resolve: Resolve | None) -> Workflow:
    """The definition a `migrate` event moves the task to (its data names version and digest)."""
    if resolve is None:
        raise IntegrityError(
            f"task {task.task_id}: event {event.seq} migrates the task, and no definitions were given to follow it",
            code=Code.DEFINITION_MISSING,
            task_id=task.task_id,
        )
    return resolve(task.workflow, int(event.data["to_version"]), str(event.data["to_digest"]))


def call_key(prepared: PreparedCallData) -> str:
    """Which calls count as repeats of each other: the same tool with the same normalised arguments."""
    return f"{prepared['tool']}:{sha256_hex(canonical_json(prepared['arguments']))[:16]}"
