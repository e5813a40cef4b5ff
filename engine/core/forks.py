"""Fork and redrive: pure checks of whether a write could happen twice, and what a fork's first event carries.

A fork starts a new task from another task's log at a seq; a redrive sends a
handed-off or limit-state task back to an agent or tool state it visited. Both
re-run a stretch of a task's path, and the product's promise is that a write runs
at most once per action id: neither may let a write the log records as executed
(or possibly executed) run again. What the log says about each write is folded
here from its events (`writes`); `repeat_hazard` says which write would repeat.
The I/O (reading the source's log, appending) is the runtime's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.core.canonical import canonical_json
from engine.core.chain import Finding
from engine.core.definition import Tool, Workflow
from engine.core.effects import OPEN, next_effect
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import Carried, EventData, ForkOrigin
from engine.core.task import TaskState

#: The searchable field a fork's task row carries (no workflow declares it: `~` is not a field name): the
#: source's task id, so the next fork of the same source finds the earlier ones (`Engine._sibling_hazard`).
FORKED_FROM = "~forked_from"

#: A write's statuses that say it executed, or may have: such a write must not be made again.
EXECUTED_OR_MAY = frozenset({"pending", "unknown", "succeeded", "executed"})


@dataclass(frozen=True, slots=True)
class Write:
    """One write call of a log: when it was prepared and first attempted, its status at a point and at the head.

    A status of None means no attempt was recorded (the call was prepared and never made).
    """

    action_id: str
    tool: str
    prepared_at: int
    attempted_at: int | None
    status_at_point: str | None
    status: str | None

    def where(self) -> str:
        seq = f"attempted at seq {self.attempted_at}" if self.attempted_at else f"prepared at seq {self.prepared_at}"
        return f"write {self.tool} (action {self.action_id}, {seq})"


def writes(events: Iterable[Event], point: int) -> list[Write]:
    """Every write call the log prepared or attempted, with its status right after event `point` and at the end."""
    prepared: dict[str, tuple[str, int]] = {}
    attempted: dict[str, int] = {}
    records: dict[str, dict[str, Any]] = {}
    at_point: dict[str, str | None] = {}
    taken = False
    for event in events:
        if not taken and event.seq > point:  # the status right after event `point` (which may not be given)
            at_point, taken = {a: str(r["status"]) for a, r in records.items()}, True
        call = event.data.get("prepared")
        if isinstance(call, dict) and call.get("kind") == "write":
            prepared.setdefault(str(call["action_id"]), (str(call["tool"]), event.seq))
        intent = event.data.get("intent") if event.trigger == "call" else None
        if isinstance(intent, dict) and intent.get("kind") == "write":
            action = str(intent["action_id"])
            prepared.setdefault(action, (str(intent["tool"]), event.seq))
            attempted.setdefault(action, event.seq)
            effect = next_effect(records.get(action), event)
            if effect is not None:
                records[action] = effect
        else:
            for action, record in list(records.items()):
                after = next_effect(record, event)
                if after is not None:
                    records[action] = after
    if not taken:
        at_point = {a: str(r["status"]) for a, r in records.items()}
    return [
        Write(
            action,
            tool,
            seq,
            attempted.get(action),
            at_point.get(action),
            str(records[action]["status"]) if action in records else None,
        )
        for action, (tool, seq) in prepared.items()
    ]


def repeat_hazard(found: Iterable[Write], point: int, carried_action: str | None, *, source_live: bool) -> str | None:
    """Why going on from event `point` could make a write a second time, or None.

    A write is *in play* when going on from `point` could make it: it was prepared after `point` (the path would
    prepare it again), or it is the prepared call carried from `point` (`carried_action`) and it had not executed
    there. An in-play write is a hazard when the log says it executed or may have; for a fork, also when the
    source goes on (`source_live`): the source may still make it, and so would the fork.
    """
    found = list(found)
    for write in found:
        if write.status_at_point in OPEN:
            return f"{write.where()} is {write.status_at_point} at seq {point}: its outcome is open there"
    for write in found:
        carried = write.action_id == carried_action and write.status_at_point not in EXECUTED_OR_MAY
        if not (write.prepared_at > point or carried):
            continue
        if write.status in EXECUTED_OR_MAY:
            return f"the log holds {write.where()}, {write.status}: going on from seq {point} would make it again"
        if source_live:
            return (
                f"the source holds {write.where()}, {write.status or 'not made yet'}, and is still running: it may "
                f"still make it, and so would a fork from seq {point}"
            )
    return None


def carried_of(task: TaskState) -> Carried:
    """What a fork carries of `task` (the source's state as of the fork's seq): what replay compares."""
    carried: Carried = {
        "state": task.state,
        "facts": task.facts,
        "visit": task.visit,
        "prepared": task.prepared,
        "prepared_by": task.prepared_by,
        "usage": task.usage,
        "effect": task.effect,
        "started_by": task.started_by,
    }
    if task.tenant is not None:  # only when there is one: forks of tasks of no tenant carry what they always did
        carried["tenant"] = task.tenant
    return carried


def fork_data(
    target: Workflow, source: TaskState, source_digest: str, reason: str, started_at: str | None
) -> EventData:
    """The data of a fork's first event: the target version, the origin, the carried state, and what restarts."""
    origin: ForkOrigin = {
        "task_id": source.task_id,
        "seq": source.seq,
        "hash": source.last_hash,
        "workflow": source.ref,
        "digest": source_digest,
    }
    data: EventData = {
        "workflow": target.ref,
        "digest": target.digest,
        "input": source.input,
        "forked_from": origin,
        "carried": carried_of(source),
        "reason": reason,
    }
    if started_at is not None:
        data["reset"] = {"started_at": started_at}
    return data


#: The triggers whose events change what `writes` folds (with any event that prepares a call).
WRITE_TRIGGERS = frozenset({"call", "succeeded", "failed", "unknown", "reconcile", "settle"})


def concerns_writes(event: Event) -> bool:
    """Whether `writes` reads `event`: what replay keeps of a long log to judge a redrive's write rule."""
    return event.trigger in WRITE_TRIGGERS or "prepared" in event.data


def redrive_problem(definition: Workflow, task: TaskState, target: str, entered_at: int | None) -> str | None:
    """Why `task` may not be sent back to `target` (which the log last entered at seq `entered_at`), or None."""
    if task.terminal:
        return f"the task has ended (in {task.state!r})"
    sources = definition.redrive_sources()
    if task.state not in sources:
        return (
            f"the task is in {task.state!r}, not a hand-off or limit state (redrive leaves "
            f"{', '.join(sorted(sources)) or 'none in ' + definition.ref})"
        )
    if not definition.has_state(target) or target not in definition.redrive_targets():
        return f"{target!r} is not an agent or tool state of {definition.ref}"
    if entered_at is None:
        return f"the task never was in {target!r}: redrive goes back to a state it visited"
    state = definition.state(target)
    if isinstance(state, Tool) and (task.prepared is None or task.prepared.get("tool") != state.tool):
        return f"{target!r} runs {state.tool}, and the task holds no prepared call for it"
    return None


def last_entry(events: Iterable[Event], state: str) -> int | None:
    """The seq of the last event that entered `state` from another state (or started the task there)."""
    found = None
    for event in events:
        if event.to_state == state and event.from_state != state:
            found = event.seq
    return found


def origin_findings(fork: Event, source_event: Event | None, source: TaskState | None) -> list[Finding]:
    """What is wrong with the origin `fork` (a task's first event) claims, given the source's event and state at
    the claimed seq (None: the source, or that seq of it, is gone)."""
    claim = fork.data.get("forked_from")
    carried = fork.data.get("carried")
    if not isinstance(claim, dict) or not isinstance(carried, dict):
        return [Finding(Code.FORK_ORIGIN_MISMATCH, 1, "the fork does not name its source and the state it carries")]
    where = f"source {claim.get('task_id')} at seq {claim.get('seq')}"
    if source_event is None or source is None:
        return [Finding(Code.FORK_ORIGIN_MISSING, 1, f"{where} is not in the database or its archives")]
    found: list[Finding] = []
    if source_event.computed_hash() != source_event.hash:
        found.append(Finding(Code.FORK_ORIGIN_MISMATCH, 1, f"{where}: that event was edited (its hash does not match)"))
    if source_event.hash != claim.get("hash"):
        found.append(
            Finding(
                Code.FORK_ORIGIN_MISMATCH,
                1,
                f"{where} holds hash {source_event.hash[:12]}, the fork names {str(claim.get('hash'))[:12]}",
            )
        )
    if (source.ref, source.digest) != (claim.get("workflow"), claim.get("digest")):
        found.append(
            Finding(
                Code.FORK_ORIGIN_MISMATCH,
                1,
                f"{where} was on {source.ref}, the fork names {claim.get('workflow')!r}",
            )
        )
    ours = canonical_json({**carried_of(source), "input": source.input})
    if canonical_json({**carried, "input": fork.data.get("input")}) != ours:
        differ = sorted(k for k, v in carried_of(source).items() if canonical_json(carried.get(k)) != canonical_json(v))
        if canonical_json(fork.data.get("input")) != canonical_json(source.input):
            differ.append("input")
        found.append(
            Finding(
                Code.FORK_ORIGIN_MISMATCH,
                1,
                f"the state the fork carries is not {where}'s as its log folds (differs in: {', '.join(differ)})",
            )
        )
    return found
