"""The JSON API over approvals: what waits for a decision, and the decision itself.

An approval names the digest of the prepared call the approver reviewed; if the
call changed since, the approval is refused (APPROVAL_STALE) rather than
applied to something nobody saw. The approver is the token's actor and its
roles come from the tokens file.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from engine.api.auth import Ctx, Reader, Writer
from engine.api.preconditions import IfMatch, acting_on, precondition, task_body
from engine.api.responses import errors
from engine.api.schemas import TASK_ID_PATTERN, ApproveRequest, PendingApproval, RejectRequest, TaskBody

router = APIRouter(prefix="/api", tags=["approvals"])

TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="Task id.")]


@router.get("/approvals", response_model=list[PendingApproval], responses=errors(401, 422))
def approvals(
    ctx: Ctx,
    _who: Reader,
    role: Annotated[str | None, Query(max_length=200, description="Only decisions this role takes.")] = None,
) -> list[dict[str, Any]]:
    """Tasks waiting at an approval state, each with the prepared call and its digest."""
    return ctx.engine.approvals(role=role)


DECISION_ERRORS = errors(401, 403, 404, 409, 412, 413, 422, tagged=200)


@router.post("/tasks/{task_id}/approve", response_model=TaskBody, responses=DECISION_ERRORS)
def approve(
    task_id: TaskId, body: ApproveRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Approve the prepared call whose digest the body names. Two approvers at once: one decision, the other 409
    (412 if it sent If-Match)."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.approve(
            task_id, actor=who.actor, prepared_digest=body.digest, comment=body.comment, expected_seq=pre.expected_seq
        )
    return task_body(response, ctx.engine.view(task))


@router.post("/tasks/{task_id}/reject", response_model=TaskBody, responses=DECISION_ERRORS)
def reject(
    task_id: TaskId, body: RejectRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Reject the decision the task waits on; the reason is recorded with it."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.reject(task_id, actor=who.actor, reason=body.reason, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine.view(task))
