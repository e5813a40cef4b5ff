"""Decide whether a trigger becomes a transition: a pure function of the definition and the folded task.

No database and no clock: the same inputs always give the same decision, so
tests call it directly and a worker can decide on a task it already holds
without reading anything. Checks run in a fixed order and each fails with its
own stable code: terminal task, trigger allowed in this state, identity fields in
the payload, payload schema, domain guards, engine-only triggers, the actor's role;
then risk, which does not refuse but may route the transition to its risk target.
A caller who may take none of the trigger's actions (`engine.core.access`) is
refused before the payload and the guards: their refusal reveals nothing the
guards read.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.core.access import Caller, fire_refusal, is_models, override_role
from engine.core.approvals import self_approval
from engine.core.arguments import IDENTITY_FIELDS, redact
from engine.core.definition import (
    CANCEL,
    CHILD_TRIGGER_PREFIX,
    EXPIRED,
    SPAWN,
    SPAWNED,
    TOOL_OUTCOMES,
    Action,
    Approval,
    GuardContext,
    StateKind,
    Tool,
    Workflow,
    guard_name,
)
from engine.core.effects import CANCEL_REQUESTED, SETTLE
from engine.core.errors import Code, Refused
from engine.core.events import Event, seal
from engine.core.payloads import EventData, PreparedCallData
from engine.core.task import TaskState


@dataclass(frozen=True, slots=True)
class Decision:
    """A transition the engine has accepted, ready to be sealed into the next event."""

    trigger: str
    from_state: str
    to_state: str
    data: EventData

    def sealed(self, task: TaskState, actor: str, at: datetime) -> Event:
        """The event this decision on `task` becomes: the next seq, chained to the task's last hash."""
        return seal(
            task_id=task.task_id,
            seq=task.seq + 1,
            at=at,
            actor=actor,
            from_state=self.from_state,
            trigger=self.trigger,
            to_state=self.to_state,
            data=self.data,
            prev_hash=task.last_hash,
        )


def decide(
    definition: Workflow,
    task: TaskState,
    trigger: str,
    payload: Mapping[str, Any] | None,
    *,
    actor: str,
    roles: Set[str] = frozenset(),
    system: bool = False,
    by_model: bool = False,
) -> Decision:
    """Accept `trigger` with `payload` from `actor`, or raise `Refused` with the first failing check's code.

    `system` is True only when the engine itself fires (a tool outcome, a deadline):
    those triggers are refused to every other caller, whatever roles it holds.
    `by_model` is True only for the agent runner's accepted proposal: an agent state's actions are the model's,
    and a person fires one only with the role to stand in for it (`engine.core.access`).
    """
    if task.terminal:
        raise Refused(
            f"task {task.task_id} is in terminal state {task.state!r}",
            code=Code.TASK_TERMINAL,
            task_id=task.task_id,
            state=task.state,
        )
    unsettled = task.unsettled
    if trigger == CANCEL and unsettled is not None:
        # The write's effect may be happening now: the cancel is recorded, and completes when the write settles.
        trigger, system = CANCEL_REQUESTED, True
    candidates = definition.candidates(task.state, trigger)
    if not candidates:
        raise Refused(
            f"trigger {trigger!r} is not allowed in state {task.state!r}",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task.task_id,
            state=task.state,
            trigger=trigger,
            allowed=definition.triggers(task.state),
        )
    if isinstance(payload, Mapping) and IDENTITY_FIELDS & set(payload):
        raise Refused(
            f"{trigger}: identity fields {sorted(IDENTITY_FIELDS & set(payload))} come from the trusted caller",
            code=Code.IDENTITY_OVERRIDE,
            task_id=task.task_id,
            trigger=trigger,
        )
    caller = Caller(actor, frozenset(roles))
    permissions = [_permission(definition, task, a, caller, system=system, by_model=by_model) for a in candidates]
    if permissions[0] is not None and all(p is not None for p in permissions):
        # Who may not fire the trigger learns nothing of the task from its refusal: no payload or guard is checked
        # for them (a guard's reason reads real state: a balance, an order's total).
        raise permissions[0]
    args_model, args_json = validate_payload(candidates[0].args, trigger, payload)

    refusals: list[str] = []
    for action, refusal in zip(candidates, permissions, strict=True):
        reasons = _guard_refusals(action, GuardContext(task=task, args=args_model, actor=actor))
        if reasons:
            refusals.extend(reasons)
            continue
        if refusal is not None:  # the first action whose guards pass is this one, and the caller may not take it
            raise refusal
        if trigger == "approve" and self_approval(definition, task, actor):
            # `fire` reaches approval actions without `Engine.approve`; separation of duties must hold there too.
            raise Refused(
                f"{actor!r} started this task or proposed the call and may not approve it",
                code=Code.APPROVAL_FORBIDDEN,
                task_id=task.task_id,
                actor=actor,
                reason="self_approval",
            )
        data: EventData = {}
        if not by_model and is_models(definition, task.state, trigger):
            # A person fired the model's action: the event says so, and as whom (separation of duties then
            # treats them as the proposer, as the fold records the actor of a prepared call).
            data["stood_in"] = {"role": str(override_role(definition, task.state, trigger))}
        if args_json is not None:
            data["args"] = redact(action.args, args_json)
        if action.guards:
            data["guards"] = [guard_name(g) for g in action.guards]
        if action.prepares is not None:
            data["prepared"] = _prepare(definition, task, action, args_json or {})
        to_state = action.target
        if action.risk is not None and action.risk_target is not None:
            risk = action.risk(GuardContext(task=task, args=args_model, actor=actor))
            if risk is not None:
                to_state = action.risk_target
                data["risk"] = {"check": guard_name(action.risk), "reason": risk}
        if unsettled is not None:
            _refuse_unsettling(definition, task, trigger, to_state, unsettled, prepares=action.prepares is not None)
        return Decision(trigger=trigger, from_state=task.state, to_state=to_state, data=data)

    raise Refused(
        f"trigger {trigger!r} refused by its guards: {'; '.join(refusals)}",
        code=Code.DOMAIN_INVALID,
        task_id=task.task_id,
        trigger=trigger,
        reasons=refusals,
    )


def validate_payload(
    model: type[BaseModel] | None, what: str, payload: Mapping[str, Any] | None
) -> tuple[BaseModel | None, dict[str, Any] | None]:
    """Validate `payload` against `model`; the JSON form is what the log records."""
    if payload is not None and not isinstance(payload, Mapping):
        raise Refused(f"{what}: payload must be a JSON object", code=Code.PAYLOAD_INVALID)
    if model is None:
        if payload:
            raise Refused(
                f"{what} takes no arguments, got {sorted(payload)}",
                code=Code.PAYLOAD_INVALID,
                errors=[{"loc": [k], "msg": "unexpected argument"} for k in sorted(payload)],
            )
        return None, None
    try:
        instance = model.model_validate(dict(payload or {}))
    except ValidationError as exc:
        # Only locations and messages: the rejected values may be sensitive and stay out of logs.
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        summary = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errors)
        raise Refused(f"{what}: invalid payload: {summary}", code=Code.PAYLOAD_INVALID, errors=errors) from None
    return instance, instance.model_dump(mode="json")


#: The steps of the open write's own protocol, in the tool state that made it: they record or settle it.
_PROTOCOL = frozenset({*TOOL_OUTCOMES, "reconcile", "call"})
#: Records made about the open write wherever the task stands: a cancel waiting for it, an operator's settlement.
_NOTES = frozenset({SETTLE, CANCEL_REQUESTED})
#: A child's start and end, in the child state that made it (`engine.core.children`).
_CHILD_PROTOCOL = frozenset({SPAWN, SPAWNED})


def _refuse_unsettling(
    definition: Workflow, task: TaskState, trigger: str, to_state: str, unsettled: Mapping[str, Any], *, prepares: bool
) -> None:
    """No effect outside the log: while a write's outcome is open the task neither ends, nor prepares another call
    (which would take the open one's place), nor sends the open one again blindly."""
    if trigger in _NOTES or (trigger in _PROTOCOL and task.state == unsettled["state"]):
        return
    if (
        "child" in unsettled
        and task.state == unsettled["state"]
        and (trigger == EXPIRED or trigger in _CHILD_PROTOCOL or trigger.startswith(CHILD_TRIGGER_PREFIX))
    ):
        return  # a child: spawned, the record of its end, or the deadline that ends the wait (its policy applied)
    where = f"write {unsettled['tool']} (action {unsettled['action_id']}) is {unsettled['status']}"
    if prepares:
        raise Refused(
            f"{trigger!r} would prepare another call while {where}: settle it first (a retry "
            "reconciles it; `railyard settle` records what an operator verified)",
            code=Code.OUTCOME_UNSETTLED,
            task_id=task.task_id,
            trigger=trigger,
            unsettled=dict(unsettled),
        )
    target = definition.state(to_state)
    if target.kind is StateKind.TERMINAL:
        raise Refused(
            f"{trigger!r} would end the task while {where}: settle it first (a retry reconciles it; "
            "`railyard settle` records what an operator verified; `cancel` waits for it)",
            code=Code.OUTCOME_UNSETTLED,
            task_id=task.task_id,
            trigger=trigger,
            unsettled=dict(unsettled),
        )
    if (
        isinstance(target, Tool)
        and target.tool == unsettled["tool"]
        and definition.tools is not None
        and target.tool in definition.tools
    ):
        tool = definition.tools.get(target.tool)
        prepared = task.prepared
        if (
            prepared is not None
            and prepared.get("action_id") == unsettled["action_id"]
            and tool.reconcile is None
            and not tool.idempotent_remote
        ):
            raise Refused(
                f"{trigger!r} would send {tool.name} again while {where}, and the remote can neither "
                "deduplicate it nor say what happened: record what you verified first (`railyard settle "
                "TASK executed|not_executed --evidence REF`); only `not_executed` sends it again",
                code=Code.OUTCOME_UNSETTLED,
                task_id=task.task_id,
                trigger=trigger,
                unsettled=dict(unsettled),
            )


def _permission(
    definition: Workflow, task: TaskState, action: Action, caller: Caller, *, system: bool, by_model: bool
) -> Refused | None:
    """Why `caller` may not take `action`: an engine-only trigger, or what the one authorisation point says."""
    if action.system and not system:
        return Refused(
            f"{action.name!r} is fired by the engine only, not by {caller.actor!r}",
            code=Code.FORBIDDEN,
            task_id=task.task_id,
            trigger=action.name,
            actor=caller.actor,
        )
    return fire_refusal(
        definition,
        task.state,
        action.name,
        action.role,
        caller,
        task_id=task.task_id,
        system=system,
        by_model=by_model,
    )


def _guard_refusals(action: Action, ctx: GuardContext) -> list[str]:
    reasons = []
    for guard in action.guards:
        reason = guard(ctx)
        if reason is not None:
            reasons.append(f"{guard_name(guard).rsplit('.', 1)[-1]}: {reason}")
    return reasons


def _prepare(definition: Workflow, task: TaskState, action: Action, args: dict[str, Any]) -> PreparedCallData:
    """Compile the action's validated arguments into the prepared call this event records.

    The action id comes from this event's seq, so it is the same for every
    attempt and every worker. The role recorded is the one its approval needs.
    """
    from engine.core.tools.prepared import prepare

    assert definition.tools is not None and action.prepares is not None
    target = definition.state(action.target)
    role = target.role if isinstance(target, Approval) else action.role
    call = prepare(
        definition.tools, action.prepares, args, task_id=task.task_id, seq=task.seq + 1, required_role=role or None
    )
    return call.to_dict()
