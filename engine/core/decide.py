"""Decide whether a trigger becomes a transition: a pure function of the definition and the folded task.

No database and no clock: the same inputs always give the same decision, so
tests call it directly and a worker can decide on a task it already holds
without reading anything. Checks run in a fixed order and each fails with its
own stable code: terminal task, trigger allowed in this state, identity fields in
the payload, payload schema, domain guards, engine-only triggers, the actor's role;
then risk, which does not refuse but may route the transition to its risk target.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.core.approvals import self_approval
from engine.core.definition import (
    CANCEL,
    IDENTITY_FIELDS,
    TOOL_OUTCOMES,
    Action,
    Approval,
    GuardContext,
    StateKind,
    Tool,
    Workflow,
    guard_name,
    redact,
)
from engine.core.effects import CANCEL_REQUESTED, SETTLE
from engine.core.errors import Code, Refused
from engine.core.fold import TaskState
from engine.core.payloads import EventData, PreparedCallData


@dataclass(frozen=True, slots=True)
class Decision:
    """A transition the engine has accepted, ready to be sealed into the next event."""

    trigger: str
    from_state: str
    to_state: str
    data: EventData


def decide(
    definition: Workflow,
    task: TaskState,
    trigger: str,
    payload: Mapping[str, Any] | None,
    *,
    actor: str,
    roles: Set[str] = frozenset(),
    system: bool = False,
) -> Decision:
    """Accept `trigger` with `payload` from `actor`, or raise `Refused` with the first failing check's code.

    `system` is True only when the engine itself fires (a tool outcome, a deadline):
    those triggers are refused to every other caller, whatever roles it holds.
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
    args_model, args_json = validate_payload(candidates[0].args, trigger, payload)

    refusals: list[str] = []
    for action in candidates:
        reasons = _guard_refusals(action, GuardContext(task=task, args=args_model, actor=actor))
        if reasons:
            refusals.extend(reasons)
            continue
        if action.system and not system:
            raise Refused(
                f"{trigger!r} is fired by the engine only, not by {actor!r}",
                code=Code.FORBIDDEN,
                task_id=task.task_id,
                trigger=trigger,
                actor=actor,
            )
        if action.role is not None and action.role not in roles:
            raise Refused(
                f"{actor!r} may not fire {trigger!r}: role {action.role!r} required",
                code=Code.FORBIDDEN,
                task_id=task.task_id,
                trigger=trigger,
                role=action.role,
                actor=actor,
            )
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


def _refuse_unsettling(
    definition: Workflow, task: TaskState, trigger: str, to_state: str, unsettled: Mapping[str, Any], *, prepares: bool
) -> None:
    """No effect outside the log: while a write's outcome is open the task neither ends, nor prepares another call
    (which would take the open one's place), nor sends the open one again blindly."""
    if trigger in _NOTES or (trigger in _PROTOCOL and task.state == unsettled["state"]):
        return
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
