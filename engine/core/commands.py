"""Human commands as pure functions beside `decide`: the engine loads, calls one of these, and appends its answer.

Each takes the definition, the task as the person saw it and the caller (with
the roles the trusted authoriser gave), holds every check the command needs
(its role through `engine.core.access`, a digest, a comment, the effect rules,
a redrive's or fork's hazards), and returns either a `Decision` for the one
append path or a `NewTask` (its first event sealed, its row built) for the one
create path. No database and no clock: what a check needs to read (the digests
a task prepared before, whether a write's attempt may still be in flight, the
task as of an earlier seq) comes in as a value or a pure callable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

from engine.core.access import Caller, operator_refusal, start_tenant
from engine.core.approvals import check_decision, full_digest
from engine.core.canonical import GENESIS_HASH
from engine.core.decide import Decision, decide, validate_payload
from engine.core.definition import CANCEL, FORK, MIGRATE, REDRIVE, START, Tool, Workflow
from engine.core.effects import SETTLE
from engine.core.errors import Code, Refused
from engine.core.events import Event, seal
from engine.core.fold import initial
from engine.core.forks import fork_data, last_entry, redrive_problem, repeat_hazard, writes
from engine.core.payloads import ChildRecord, EventData, ParentLink, Settled
from engine.core.rows import TaskRow
from engine.core.task import TaskState
from engine.core.timers import next_run_at


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task a command creates: its first event, its row, and the fields the lists index it by."""

    row: TaskRow
    first: Event
    task: TaskState
    fields: Mapping[str, str]


def new_task(
    definition: Workflow,
    *,
    task_id: str,
    at: datetime,
    actor: str,
    trigger: str,
    to_state: str,
    data: EventData,
    fields: Mapping[str, str],
) -> NewTask:
    """The one way a task begins (`start`, `fork`): a first event at seq 1 on the genesis hash, and its row."""
    first = seal(
        task_id=task_id,
        seq=1,
        at=at,
        actor=actor,
        from_state=None,
        trigger=trigger,
        to_state=to_state,
        data=data,
        prev_hash=GENESIS_HASH,
    )
    task = initial(definition, first)
    row = TaskRow(
        task_id=task_id,
        workflow=definition.name,
        version=definition.version,
        digest=definition.digest,
        state=task.state,
        status=str(task.status),
        seq=1,
        last_hash=first.hash,
        created_at=at,
        updated_at=at,
        next_run_at=next_run_at(definition, task.state, at),
        tenant=task.tenant,
    )
    return NewTask(row, first, task, dict(fields))


def start(
    definition: Workflow,
    input: Mapping[str, Any] | None,
    *,
    caller: Caller,
    task_id: str,
    at: datetime,
    tenant: str | None = None,
) -> NewTask:
    """A task of `definition` with `input` (checked by its input model), pinned to its version and digest, in the
    tenant the caller starts it in (`engine.core.access.start_tenant`: `tenant` only chooses among the caller's)."""
    within = start_tenant(caller, tenant)
    _, input_json = validate_payload(definition.input, f"{definition.ref} input", input)
    data: EventData = {"workflow": definition.ref, "digest": definition.digest, "input": input_json or {}}
    if within is not None:  # absent, not null, when there is none: a single-tenant install's events are unchanged
        data["tenant"] = within
    return new_task(
        definition,
        task_id=task_id,
        at=at,
        actor=caller.actor,
        trigger=START,
        to_state=definition.initial_state,
        data=data,
        fields=definition.search_values(input_json),
    )


def start_child(
    definition: Workflow, parent: TaskState, record: ChildRecord, link: ParentLink, *, at: datetime
) -> NewTask:
    """The child task that the intent `record` of `parent` starts (`engine.core.children`): under the id, version,
    digest and input the intent recorded, its first event naming the parent. It belongs to the parent's tenant
    and is started by whoever started the parent, so separation of duties holds down the chain (the person who
    started a ticket does not approve the refund it started)."""
    if definition.ref != record.get("workflow") or definition.digest != record.get("digest"):
        raise Refused(
            f"the intent pins {record.get('workflow')} ({str(record.get('digest'))[:12]}), not {definition.ref} "
            f"({definition.digest[:12]})",
            code=Code.DEFINITION_CHANGED,
            workflow=definition.name,
            version=definition.version,
        )
    _, input_json = validate_payload(definition.input, f"{definition.ref} input", record.get("input"))
    data: EventData = {
        "workflow": definition.ref,
        "digest": definition.digest,
        "input": input_json or {},
        "parent": link,
    }
    if parent.tenant is not None:
        data["tenant"] = parent.tenant
    return new_task(
        definition,
        task_id=record["task_id"],
        at=at,
        actor=parent.started_by,
        trigger=START,
        to_state=definition.initial_state,
        data=data,
        fields=definition.search_values(input_json),
    )


def cancel(definition: Workflow, task: TaskState, *, caller: Caller, reason: str) -> Decision:
    """Stop the task, from any state that is not terminal: to `cancelled`, or, while a write's outcome is open, a
    `cancel_requested` recorded until it settles (`decide` turns the one into the other)."""
    return decide(definition, task, CANCEL, {"reason": reason}, actor=caller.actor, roles=caller.roles)


def requested_cancel(definition: Workflow, task: TaskState, fallback_actor: str) -> tuple[Decision, str]:
    """The cancel a request waited for (a write's, a child's start, to settle first), and its requester, who acts.

    The requester's role was checked when the request was recorded (`cancel_requested` needs the cancel role):
    the engine completes it on that authority, whatever this process's authoriser says of them now (a worker need
    not share the server's tokens, and a role revoked since does not strand the request)."""
    request = task.cancel_requested or {}
    requester = str(request.get("actor") or fallback_actor)
    held = definition.operator_of(CANCEL)
    decision = decide(
        definition,
        task,
        CANCEL,
        {"reason": request.get("reason") or "cancel requested"},
        actor=requester,
        roles=frozenset({held} if held else ()),
    )
    return replace(decision, data={**decision.data, "requested_at_seq": request.get("seq")}), requester


def approval(
    definition: Workflow,
    task: TaskState,
    verdict: Literal["approve", "reject"],
    *,
    caller: Caller,
    digest: str | None,
    comment: str,
    earlier_digests: Callable[[], Set[str]],
) -> Decision:
    """An approver's decision on the prepared call awaiting approval, named by the digest they were shown (a
    reject may name none: refusing does not depend on the call's exact content). `earlier_digests`: every call
    the task prepared, which a digest prefix must not also name (read only when a prefix is given)."""
    current = task.prepared["digest"] if task.prepared else None
    if verdict == "reject" and digest is None:
        digest = current
    if digest is not None and current is not None and digest != current:
        digest = full_digest(digest, current, earlier_digests())
    roles = caller.roles
    check = check_decision(definition, task, verdict, actor=caller.actor, roles=roles, digest=digest, comment=comment)
    action = definition.candidates(task.state, check.trigger)[0]
    decision = decide(
        definition, task, check.trigger, _comment_payload(action.args, comment), actor=caller.actor, roles=roles
    )
    return replace(decision, data={**decision.data, "approval": check.record})


def _comment_payload(args: type[BaseModel] | None, comment: str) -> dict[str, Any] | None:
    """Hand the approver's comment to the decision's argument model, under whichever name it uses."""
    if args is None:
        return None
    for name in ("comment", "reason", "note"):
        if name in args.model_fields:
            return {name: comment}
    return {}


def settle(
    definition: Workflow, task: TaskState, *, caller: Caller, outcome: Any, evidence: Any, running: str | None
) -> Decision:
    """An operator's assertion of what became of the write whose outcome is open: `executed` or `not_executed`,
    with the evidence it rests on. `running`: why the write's last attempt may still be in flight (a worker holds
    the task, or its call may land until some time), or None; an assertion must not race the call it settles."""
    unsettled = task.unsettled
    if unsettled is None:
        raise Refused(
            f"task {task.task_id} has no write whose outcome is open: nothing to settle",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task.task_id,
            state=task.state,
        )
    if "child" in unsettled:
        # A child's start is never a guess to settle: the child exists under its derived id or it does not, and the
        # worker that holds the task finds out (`engine.runtime.children`).
        raise Refused(
            f"task {task.task_id} is starting child task {unsettled['child']}: a worker finds or makes it by its "
            "action id; there is nothing for an operator to verify",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task.task_id,
            state=task.state,
        )
    decision = decide(
        definition,
        task,
        SETTLE,
        {"outcome": outcome, "evidence": evidence},
        actor=caller.actor,
        roles=caller.roles,
        system=True,
    )
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
    return replace(decision, data={**decision.data, "settled": settled})


def redrive(
    definition: Workflow,
    task: TaskState,
    events: Sequence[Event],
    to_state: str,
    *,
    caller: Caller,
    reason: str,
    state_at: Callable[[int], TaskState],
) -> Decision:
    """Send a handed-off or limit-state task back to an agent or tool state it visited, its budgets started again.
    `events`: the task's log; `state_at(seq)`: the task as of an earlier seq (read only to go back into a tool
    state, whose call must be the one the task held when it last entered it)."""

    def refuse(problem: str, code: Code = Code.REDRIVE_INVALID) -> Refused:
        return Refused(
            f"cannot redrive task {task.task_id} to {to_state!r}: {problem}",
            code=code,
            task_id=task.task_id,
            state=task.state,
        )

    entered = last_entry(events, to_state)
    problem = redrive_problem(definition, task, to_state, entered)
    if problem is not None:
        raise refuse(problem)
    if not isinstance(reason, str) or not reason.strip():
        raise refuse("a reason is required")
    refusal = operator_refusal(definition, task.state, REDRIVE, caller, task.task_id)
    if refusal is not None:
        raise refusal
    assert entered is not None
    if isinstance(definition.state(to_state), Tool):
        # The checks on the way into a tool state (an approval of this very call, its deadline, who may
        # approve) were made for the call the task held then: going back runs only that call.
        then = state_at(entered).prepared
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
    return Decision(trigger=REDRIVE, from_state=task.state, to_state=to_state, data=data)


def migrate(
    source: Workflow, target: Workflow, task: TaskState, state_map: Mapping[str, str], *, caller: Caller, reason: str
) -> Decision:
    """Move `task` from `source` to `target`, another version of its workflow: the state it maps to, one `migrate`
    event that names both versions and digests, the map and the reason. Refused as `migration_problem` says, then
    to a caller without the workflow's operator role (the role that sends a stopped task on: `redrive`'s)."""
    problem = migration_problem(source, target, task, state_map, reason)
    if problem is not None:
        raise Refused(
            f"cannot migrate {task.ref} to {target.ref}: {problem}",
            code=Code.MIGRATION_INVALID,
            task_id=task.task_id,
            state=task.state,
        )
    refusal = operator_refusal(source, task.state, MIGRATE, caller, task.task_id)
    if refusal is not None:
        raise refusal
    data: EventData = {
        "from": source.ref,
        "to": target.ref,
        "from_digest": source.digest,
        "to_version": target.version,
        "to_digest": target.digest,
        "state_map": dict(state_map),
        "reason": reason,
    }
    return Decision(trigger=MIGRATE, from_state=task.state, to_state=state_map[task.state], data=data)


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


def fork_refusal(definition: Workflow, row: TaskRow, at_seq: int, *, caller: Caller, reason: str) -> Refused | None:
    """Why `caller` may not fork the task of `row` (on `definition`) at `at_seq`, from its row alone: the role
    (`redrive`'s chain), a reason, a seq it has, and a task that has ended: a source that goes on and a fork of
    it could both reach a write neither has prepared yet, and both would be paid."""
    refusal = operator_refusal(definition, row.state, FORK, caller, row.task_id)
    if refusal is not None:
        return refusal

    def invalid(problem: str) -> Refused:
        return Refused(
            f"cannot fork task {row.task_id} at seq {at_seq}: {problem}", code=Code.FORK_INVALID, task_id=row.task_id
        )

    if not isinstance(reason, str) or not reason.strip():
        return invalid("a reason is required")
    if isinstance(at_seq, bool) or not isinstance(at_seq, int) or not 1 <= at_seq <= row.seq:
        return invalid(f"the task has events 1 to {row.seq}")
    if row.status != "terminal":
        # A task that is stuck is sent back with `redrive` instead.
        return invalid(
            f"the task is still running (in {row.state!r}): a fork and its source would both go on; fork a task "
            "that has ended (cancel it first), or send a stuck one back with `railyard redrive`"
        )
    return None


def fork_source_refusal(source: TaskState, source_id: str, hazard: str | None) -> Refused | None:
    """Why a fork of task `source_id` from `source` (its state as of the fork's seq) may not be made: nothing would
    run from a terminal state, or `hazard`, why going on from there could make a write again (read by the engine
    from the source's log and its other forks, `engine.core.forks`)."""
    if source.terminal:
        return Refused(
            f"cannot fork task {source_id} at seq {source.seq}: the task was in terminal state {source.state!r} "
            "there: nothing would run; fork earlier",
            code=Code.FORK_INVALID,
            task_id=source_id,
        )
    if hazard is not None:
        return Refused(
            f"cannot fork task {source_id} at seq {source.seq}: {hazard}",
            code=Code.WRITE_WOULD_REPEAT,
            task_id=source_id,
        )
    return None


def fork(
    origin: Workflow,
    target: Workflow,
    source: TaskState,
    *,
    source_id: str,
    caller: Caller,
    reason: str,
    task_id: str,
    at: datetime,
    forked_from: str,
) -> NewTask:
    """A new task from `source`, the source task's state as of the fork's seq, on `target` (the newest version
    of its workflow, or the one asked for, checked as a migration is), once `fork_refusal` (of the source's row)
    and `fork_source_refusal` (of its state there) found nothing."""
    if target.version != origin.version:
        problem = migration_problem(origin, target, source, {source.state: source.state}, reason)
        if problem is not None:
            raise Refused(
                f"cannot fork task {source_id} at seq {source.seq}: to {target.ref}: {problem}",
                code=Code.FORK_INVALID,
                task_id=source_id,
            )
    return new_task(
        target,
        task_id=task_id,
        at=at,
        actor=caller.actor,
        trigger=FORK,
        to_state=source.state,
        data=fork_data(target, source, source.digest, reason, source.usage.get("started_at")),
        fields={forked_from: source_id},
    )
