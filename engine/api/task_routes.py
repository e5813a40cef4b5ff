"""The JSON API over tasks: start, list, get, history, signal, cancel, settle, replay, diagram.

Every handler is a plain function run in the server's thread pool: the engine
is synchronous and thread-safe, and each call is one short database round trip
or two. The actor is the bearer token's. A task in a response carries its seq
as the ETag, and every command takes it back as If-Match (`preconditions`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from engine.api.auth import Ctx, Reader, Writer
from engine.api.diagrams import task_diagram
from engine.api.listing import MAX_LIMIT, TaskFilter, list_tasks
from engine.api.preconditions import IfMatch, acting_on, precondition, task_body
from engine.api.responses import errors
from engine.api.schemas import (
    NAME_PATTERN,
    STATE_PATTERN,
    TASK_ID_PATTERN,
    CancelRequest,
    DiagramBody,
    EventBody,
    ReplayBody,
    SettleRequest,
    SignalRequest,
    StartRequest,
    TaskBody,
    TaskSummary,
    WhoAmI,
)
from engine.core.approvals import DECISIONS
from engine.core.errors import Code, Refused

router = APIRouter(prefix="/api", tags=["tasks"])

TaskId = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="Task id.")]


@router.get("/me", response_model=WhoAmI, responses=errors(401))
def whoami(who: Reader) -> dict[str, Any]:
    """The actor and roles the bearer token stands for."""
    return {"actor": who.actor, "roles": sorted(who.roles), "read_only": who.read_only}


@router.post(
    "/tasks", status_code=201, response_model=TaskBody, responses=errors(401, 403, 404, 409, 413, 422, tagged=201)
)
def start_task(body: StartRequest, ctx: Ctx, who: Writer, response: Response) -> dict[str, Any]:
    """Start a task on a workflow (its newest version unless `version`); the token's actor starts it."""
    task_id = ctx.engine.start(body.workflow, body.input, actor=who.actor, version=body.version)
    response.headers["Location"] = f"/api/tasks/{task_id}"
    return task_body(response, ctx.engine.get(task_id))


@router.get("/tasks", response_model=list[TaskSummary], responses=errors(401, 422))
def tasks(
    ctx: Ctx,
    _who: Reader,
    workflow: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    state: Annotated[str | None, Query(pattern=STATE_PATTERN)] = None,
    status: Annotated[str | None, Query(pattern="^(runnable|blocked|terminal)$")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
) -> list[dict[str, Any]]:
    """Tasks, most recently changed first, filtered by workflow, state and status."""
    found = list_tasks(ctx.engine.store, TaskFilter(workflow, state, status, limit))
    return [asdict(t) for t in found]


@router.get("/tasks/{task_id}", response_model=TaskBody, responses=errors(401, 404, 409, 422, tagged=200))
def get_task(task_id: TaskId, ctx: Ctx, _who: Reader, response: Response) -> dict[str, Any]:
    """Where the task stands: state, status, seq and the triggers it allows now. The ETag is the seq."""
    return task_body(response, ctx.engine.get(task_id))


@router.get("/tasks/{task_id}/history", response_model=list[EventBody], responses=errors(401, 404, 422))
def history(task_id: TaskId, ctx: Ctx, _who: Reader) -> list[dict[str, Any]]:
    """Every event of the task's log, in order, with its hashes."""
    return [e.to_dict() for e in ctx.engine.history(task_id)]


COMMAND_ERRORS = errors(401, 403, 404, 409, 412, 413, 422, tagged=200)


@router.post("/tasks/{task_id}/signal", response_model=TaskBody, responses=COMMAND_ERRORS)
def signal(
    task_id: TaskId, body: SignalRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Fire a trigger the current state allows (a customer's reply, an operator's resume). System triggers (tool
    outcomes, deadlines, repairs) are refused with FORBIDDEN; approval decisions go through /approve and /reject.
    With If-Match (the task's ETag) a task that moved since is 412; with `expected_seq` in the body, 409."""
    if body.trigger in DECISIONS:  # they go through /approve and /reject, which take the digest shown
        raise Refused(
            f"{body.trigger!r} is an approval decision: POST /api/tasks/{{id}}/{body.trigger} instead",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task_id,
            trigger=body.trigger,
        )
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.fire(task_id, body.trigger, body.payload, actor=who.actor, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine.view(task))


@router.post("/tasks/{task_id}/cancel", response_model=TaskBody, responses=COMMAND_ERRORS)
def cancel(
    task_id: TaskId, body: CancelRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Cancel the task from any non-terminal state; the reason is recorded. While a write tool call is in flight
    the cancel is recorded as requested (`cancel_requested`) and takes effect when the call settles."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.cancel(task_id, actor=who.actor, reason=body.reason, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine.view(task))


@router.post("/tasks/{task_id}/settle", response_model=TaskBody, responses=COMMAND_ERRORS)
def settle(
    task_id: TaskId, body: SettleRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Record what happened to the write tool call whose outcome is unknown (`unsettled`): an operator's assertion,
    with the evidence it rests on, that the call was executed or not. The engine checks the operator's role."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.settle(
            task_id, actor=who.actor, outcome=body.outcome, evidence=body.evidence, expected_seq=pre.expected_seq
        )
    return task_body(response, ctx.engine.view(task))


@router.get("/tasks/{task_id}/replay", response_model=ReplayBody, responses=errors(401, 404, 422))
def replay(task_id: TaskId, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """Check the task's whole log without calling any model or tool: the hash chain, that every transition was
    legal in its pinned definition, and that the fold matches the stored state. `ok` is false with findings."""
    report: dict[str, Any] = ctx.engine.replay(task_id).to_dict()
    return report


@router.get("/tasks/{task_id}/diagram", response_model=DiagramBody, responses=errors(401, 404, 409, 422))
def diagram(task_id: TaskId, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """The task's workflow version as a Mermaid state diagram, with the path the task took highlighted."""
    task = ctx.engine.load(task_id)
    return task_diagram(ctx.engine.definition_of(task), ctx.engine.events_of(task))
