"""Human approval gates: who may decide, on exactly what, and only once.

The approver decides on the prepared call the server compiled (its digest),
never on the model's raw JSON: a decision naming any other digest is stale.
The approver's identity comes from the trusted caller and must hold the
state's role; whoever started the task or proposed the call may not approve it
unless the workflow says so. The checks are pure; `Engine.approve` and
`Engine.reject` do the I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Any, Literal

from engine.core.access import AUDITOR, holds
from engine.core.definition import Approval, Workflow
from engine.core.errors import Code, Refused
from engine.core.payloads import ApprovalRecord
from engine.core.task import TaskState

Verdict = Literal["approve", "reject"]


@dataclass(frozen=True, slots=True)
class ApprovalCheck:
    """A decision the checks let through: the trigger to fire and what the event records of it."""

    trigger: Verdict
    record: ApprovalRecord


#: The triggers that decide an approval; `Engine.fire` routes them through the same checks as approve/reject.
DECISIONS = frozenset({"approve", "reject"})
#: The fewest leading characters of a digest an approver may name it by (what `railyard approvals` shows): 48 bits,
#: so that a prefix cannot match another call by chance, yet short enough to read off a screen.
DIGEST_PREFIX = 12


def full_digest(named: str | None, current: str | None, earlier: Set[str] = frozenset()) -> str | None:
    """The digest `named` stands for: `current` when it is a unique prefix of it of at least `DIGEST_PREFIX`
        characters, else `named` as given (`check_decision` then refuses it as stale). A digest that is not hex at
    all is DIGEST_INVALID.

        `earlier`: the digests of the calls the task prepared before; a prefix that also names one of them does not say
        which call the approver reviewed (DIGEST_AMBIGUOUS). A prefix too short to be trusted is DIGEST_TOO_SHORT.
    """
    if named is None:
        return named
    if not named or any(c not in "0123456789abcdefABCDEF" for c in named):
        raise Refused(
            f"digest {named!r} is not hexadecimal: a digest is 64 characters 0-9 and a-f (copy it, or its first "
            f"{DIGEST_PREFIX}, from `railyard approvals`)",
            code=Code.DIGEST_INVALID,
            named=named,
        )
    if current is None or named == current:
        return named
    if len(named) < DIGEST_PREFIX:
        raise Refused(
            f"digest {named!r} is {len(named)} characters: give at least the {DIGEST_PREFIX} `railyard approvals` "
            "shows",
            code=Code.DIGEST_TOO_SHORT,
            named=named,
            minimum=DIGEST_PREFIX,
        )
    if not current.startswith(named):
        return named
    if any(other != current and other.startswith(named) for other in earlier):
        raise Refused(
            f"digest {named!r} names more than one call this task prepared: give more of it",
            code=Code.DIGEST_AMBIGUOUS,
            named=named,
        )
    return current


def decision_role(definition: Workflow, state: str, verdict: str) -> str:
    """The role a `verdict` in approval state `state` needs: its action's own role, else the state's."""
    approval = definition.state(state)
    assert isinstance(approval, Approval)
    candidates = definition.candidates(state, verdict)
    return (candidates[0].role if candidates else None) or approval.role


def self_approval(definition: Workflow, task: TaskState, actor: str) -> bool:
    """Whether `actor` approving `task` would approve their own request (they started it or proposed the call),
    where the approval state does not allow that."""
    state = definition.state(task.state)
    return (
        isinstance(state, Approval) and not state.allow_self_approval and actor in {task.started_by, task.prepared_by}
    )


def check_decision(
    definition: Workflow,
    task: TaskState,
    verdict: Verdict,
    *,
    actor: str,
    roles: Set[str],
    digest: str | None,
    comment: str,
) -> ApprovalCheck:
    state = definition.state(task.state)
    if not isinstance(state, Approval) or task.terminal:
        raise Refused(
            f"task {task.task_id} is in {task.state!r}, not awaiting approval",
            code=Code.TASK_NOT_AWAITING_APPROVAL,
            task_id=task.task_id,
            state=task.state,
        )
    candidates = definition.candidates(task.state, verdict)
    if not candidates:
        raise Refused(
            f"state {task.state!r} has no {verdict!r} decision",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task.task_id,
            allowed=definition.triggers(task.state),
        )
    role = decision_role(definition, task.state, verdict)
    if AUDITOR in roles or not holds(roles, role):
        raise Refused(
            f"{actor!r} does not hold the role {role!r} this decision needs",
            code=Code.APPROVAL_FORBIDDEN,
            task_id=task.task_id,
            role=role,
            actor=actor,
        )
    if verdict == "approve" and self_approval(definition, task, actor):
        raise Refused(
            f"{actor!r} started this task or proposed the call and may not approve it",
            code=Code.APPROVAL_FORBIDDEN,
            task_id=task.task_id,
            actor=actor,
            reason="self_approval",
        )
    current = task.prepared["digest"] if task.prepared else None
    if current is not None and digest is None:
        raise Refused(
            "an approval names the digest of the prepared call the approver was shown (railyard approvals lists it)",
            code=Code.APPROVAL_STALE,
            task_id=task.task_id,
            current=current,
        )
    if current is not None and digest != current:
        raise Refused(
            "the prepared call changed since it was shown: review it again",
            code=Code.APPROVAL_STALE,
            task_id=task.task_id,
            named=digest,
            current=current,
        )
    record: ApprovalRecord = {"actor": actor, "role": role, "decision": verdict, "comment": comment, "digest": current}
    return ApprovalCheck(trigger=verdict, record=record)


def pending_view(definition: Workflow, task: TaskState) -> dict[str, Any]:
    """What an approver is shown: the task, the role it needs, and the prepared call (not the model's JSON)."""
    state = definition.state(task.state)
    assert isinstance(state, Approval)
    return {
        "task_id": task.task_id,
        "workflow": task.ref,
        "state": task.state,
        "role": state.role,
        "started_by": task.started_by,
        "proposed_by": task.prepared_by,
        "prepared": task.prepared,
        "digest": task.prepared["digest"] if task.prepared else None,
        "input": task.input,
        "decisions": definition.triggers(task.state),
    }


def approval_places(
    definitions: Iterable[Workflow], role: str | None = None, workflows: Set[str] | None = None
) -> list[tuple[str, int, str]]:
    """Every approval state (workflow, version, state) of `definitions` that `role` decides (None: any role), of
    the workflows named in `workflows` (None: all): the places whose blocked tasks wait for a decision."""
    return [
        (definition.name, definition.version, state.name)
        for definition in definitions
        if workflows is None or definition.name in workflows
        for state in definition.states
        if isinstance(state, Approval) and (role is None or state.role == role)
    ]
