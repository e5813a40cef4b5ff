"""What the inbox and the task page show of a task: read through the engine, shaped by `present`.

The inbox repeats the checks `engine.core.approvals.check_decision` will make (role,
separation of duties, read-only token) only to decide whether to offer the
buttons; the engine makes them again when the form is posted, and its answer
is the one that counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.api.diagrams import task_diagram
from engine.api.tokens import Principal
from engine.api.views import (
    Evidence,
    Reason,
    Row,
    Shown,
    display_arguments,
    evidence,
    model_reason,
    schema_of,
    timeline,
)
from engine.core.approvals import decision_role, pending_view, self_approval
from engine.core.definition import Approval, Workflow
from engine.core.events import Event
from engine.core.fold import TaskState
from engine.runtime.engine import Engine, TaskView


@dataclass(frozen=True, slots=True)
class ApprovalView:
    task_id: str
    workflow: str
    state: str
    #: The seq the page was rendered at: the forms send it back, so a decision lands only on the task as shown.
    seq: int
    role: str
    started_by: str
    proposed_by: str | None
    digest: str | None
    tool: str | None
    kind: str | None
    arguments: list[Shown]
    evidence: list[Evidence]
    reason: Reason
    timeline: list[Row]
    decisions: list[str]
    can_decide: bool
    why_not: str | None = None


@dataclass(frozen=True, slots=True)
class TaskPage:
    view: TaskView
    timeline: list[Row]
    diagram: dict[str, Any]
    approval: ApprovalView | None
    input: list[Shown] = field(default_factory=list)


def why_not(principal: Principal, definition: Workflow, task: TaskState) -> str | None:
    """Why this principal will be refused an approval of `task` (None: the buttons are offered)."""
    if principal.read_only:
        return "your token is read-only (auditor)"
    role = decision_role(definition, task.state, "approve")
    if role not in principal.roles:
        return f"deciding needs the role {role!r}, which you do not hold"
    if self_approval(definition, task, principal.actor):
        return "you started this task or proposed the call: someone else must approve it (you may reject it)"
    return None


def approval_view(
    engine: Engine, definition: Workflow, task: TaskState, events: list[Event], principal: Principal
) -> ApprovalView | None:
    state = definition.state(task.state)
    if not isinstance(state, Approval) or task.terminal:
        return None
    prepared: Mapping[str, Any] = task.prepared or {}
    tool_args = None
    if prepared and definition.tools is not None and prepared.get("tool") in definition.tools:
        tool_args = definition.tools.get(str(prepared["tool"])).args
    pending = pending_view(definition, task)  # what `railyard approvals` and GET /api/approvals show
    digest = pending["digest"]
    refusal = why_not(principal, definition, task)
    return ApprovalView(
        task_id=pending["task_id"],
        workflow=pending["workflow"],
        state=pending["state"],
        seq=task.seq,
        role=pending["role"],
        started_by=pending["started_by"],
        proposed_by=pending["proposed_by"],
        digest=digest,
        tool=prepared.get("tool"),
        kind=prepared.get("kind"),
        arguments=display_arguments(prepared.get("arguments") or {}, schema_of(tool_args)),
        evidence=evidence(task.facts),
        reason=model_reason(events, digest),
        timeline=timeline(events),
        decisions=pending["decisions"],
        can_decide=refusal is None,
        why_not=refusal,
    )


def inbox(engine: Engine, principal: Principal, role: str | None = None) -> list[ApprovalView]:
    out = []
    for definition, task in engine.awaiting_approval(role=role):
        view = approval_view(engine, definition, task, engine.events_of(task), principal)
        if view is not None:
            out.append(view)
    return out


def task_page(engine: Engine, task_id: str, principal: Principal) -> TaskPage:
    task = engine.load(task_id)
    definition = engine.definition_of(task)
    events = engine.events_of(task)
    return TaskPage(
        view=engine.view(task),
        timeline=timeline(events),
        diagram=task_diagram(definition, events),
        approval=approval_view(engine, definition, task, events, principal),
        input=display_arguments(task.input, schema_of(definition.input)),
    )
