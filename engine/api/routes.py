"""The routes: the JSON API under /api (tasks, approvals, workflows) and the back-office pages.

Every handler is a plain function run in the server's thread pool: the engine
is synchronous and thread-safe, and each call is one short database round trip
or two. The actor is the bearer token's (API) or the session's (pages), never a
field of the request.

Human commands act on the state the human saw. Every API response whose body
is a task carries `ETag: "<seq>"`, the task's seq as a strong entity tag. A
command (signal, cancel, approve, reject, settle) sent with `If-Match: "<seq>"`
is applied only if the task still stands at that seq: the engine checks it
when it decides and again when it appends, and a task that moved meanwhile is
refused with 412 (code CONCURRENCY_CONFLICT) and nothing is written. Without
the header, a body `expected_seq` does the same with 409; with neither, the
command is decided on the state read when it runs, and a write that lands
between that read and the append is still a 409. `If-Match: *` is "any seq": no
precondition.

An approval names the digest of the prepared call the approver reviewed; if the
call changed since, the approval is refused (APPROVAL_STALE) rather than
applied to something nobody saw. The approver's roles come from the tokens file.

The lists (`GET /api/tasks`, `GET /api/approvals`, the /tasks page) are keyset
pages with an opaque cursor naming the last task shown (`views.list_tasks`,
`Store.list_tasks`): a stated page size, a stable order, a `next` link, and no
task seen twice or skipped while others are created.

The pages are server-rendered, without JavaScript. Every POST passes the
origin and CSRF checks of `auth.page_post` before its fields are read;
decisions are made by the same `Engine.approve` / `Engine.reject` the API
calls, as the session's actor. Every command answers 303 (Post/Redirect/Get):
what it did, or why it was refused with the code, is the session's flash on the
page it redirects to, so a reload sends nothing again. Every decision form
carries the seq the page was rendered at (`seq`): if the task moved since, the
decision is refused (CONCURRENCY_CONFLICT, naming the state it is in now)
instead of landing on a task the person did not see.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, Form, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.api.auth import (
    LOGIN_COOKIE,
    LOGIN_SECONDS,
    OIDC_COOKIE,
    OIDC_SECONDS,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Context,
    Ctx,
    Flash,
    PagePost,
    PageSession,
    Reader,
    Session,
    Writer,
    context,
    refuse_foreign,
    require_writer,
    same_token,
    throttled,
)
from engine.api.csv_export import (
    CSV_FORMAT,
    approvals_csv,
    csv_response,
    deliveries_csv,
    queue_csv,
    tasks_csv,
    trail_csv,
)
from engine.api.oidc import Flow, OidcClient, sync_person
from engine.api.paths import TaskId, TaskIdText
from engine.api.schemas import (
    BODY_TOO_LARGE,
    IF_MATCH_FAILED,
    MAX_SEQ,
    NAME_PATTERN,
    STATE_PATTERN,
    TASK_ID_PATTERN,
    AccessTrailPage,
    ApprovalPage,
    ApproveRequest,
    CancelRequest,
    ClaimBody,
    ClaimRequest,
    DiagramBody,
    EventBody,
    ForkRequest,
    NoteRequest,
    PreconditionFailed,
    RedriveRequest,
    RejectRequest,
    ReplayBody,
    SettleRequest,
    SignalRequest,
    StartRequest,
    TaskBody,
    TaskPage,
    WhoAmI,
    WorkflowBody,
    WorkKind,
    WorkQueueBody,
    refusals,
    status_for,
)
from engine.api.views import (
    AGES,
    MAX_LIMIT,
    PAGE_SIZE,
    SORT_LABELS,
    WORK_MAX_LIMIT,
    WORK_PAGE_SIZE,
    TaskFilter,
    WorkPage,
    decode_cursor,
    encode_cursor,
    list_tasks,
    payload_from_form,
    public_states,
    render,
    task_diagram,
    task_page,
    work_queue,
    workflow_diagram,
    workflow_page,
)
from engine.api.webhooks_page import STATUSES as WEBHOOK_STATUSES
from engine.api.webhooks_page import send_again, webhooks_page
from engine.core.access import AUDITOR, Caller
from engine.core.approvals import DECISIONS
from engine.core.canonical import format_instant
from engine.core.definition import StateKind, Workflow
from engine.core.errors import Code, ConcurrencyConflict, RailyardError, Refused
from engine.core.task import Status, TaskState
from engine.runtime import queries, shown
from engine.runtime.engine import Engine
from engine.runtime.queries import WorkClaim, readable, require_visible
from engine.runtime.registry import Registry

log = logging.getLogger("railyard.api")

#: What a generated client names each operation (`client.approve_task(...)`): a verb and the thing it acts on.
#: A route not listed is named after its function.
OPERATION_IDS = {
    "whoami": "who_am_i",
    "tasks": "list_tasks",
    "history": "get_task_history",
    "signal": "signal_task",
    "cancel": "cancel_task",
    "settle": "settle_task",
    "replay": "replay_task",
    "fork": "fork_task",
    "redrive": "redrive_task",
    "task_diagram_body": "get_task_diagram",
    "approvals": "list_approvals",
    "approve": "approve_task",
    "reject": "reject_task",
    "claim": "claim_work",
    "release": "release_work",
    "work": "list_work",
    "workflows": "list_workflows",
    "workflow": "get_workflow",
    "workflow_diagram_body": "get_workflow_diagram",
}


def operation_id(route: APIRoute) -> str:
    name = getattr(route.endpoint, "__name__", route.name)
    return OPERATION_IDS.get(name, name)


def known_query(request: Request) -> None:
    """Refuse a query parameter the endpoint does not take (422 PAYLOAD_INVALID): a misspelt filter
    (`?stat=blocked`) would otherwise be ignored, and the answer look like the one asked for."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    known = {p.alias for p in route.dependant.query_params}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise Refused(
            f"unknown query parameter {', '.join(repr(u[:40]) for u in unknown[:5])}: this endpoint takes "
            + (", ".join(sorted(known)) or "none"),
            code=Code.PAYLOAD_INVALID,
            unknown=[u[:40] for u in unknown[:5]],
        )


def api_router(tag: str) -> APIRouter:
    return APIRouter(
        prefix="/api", tags=[tag], generate_unique_id_function=operation_id, dependencies=[Depends(known_query)]
    )


task_api, approval_api, workflow_api = api_router("tasks"), api_router("approvals"), api_router("workflows")
access_api = api_router("access")
pages = APIRouter(include_in_schema=False)
#: Every router, in the order the application includes them.
ROUTERS = (task_api, approval_api, workflow_api, access_api, pages)


def visible_task(task_id: TaskIdText, ctx: Ctx, who: Reader) -> str:
    """The path's task, if the caller may read it: one they may not is answered as one that does not exist. A
    prefix is resolved among the tasks the caller may read: one they may not see neither makes it ambiguous nor
    is named to them."""
    return queries.resolve(ctx.engine, task_id, who.caller)


#: A task id in an API path, checked against what the caller may read before the route runs.
VisibleTask = Annotated[str, Depends(visible_task)]


def workflow_names(engine: Engine, caller: Caller) -> list[str]:
    """The workflows a page's filter menu offers: those whose tasks the person may read, in registry order."""
    names = readable(engine, caller)
    return [n for n in dict.fromkeys(wf.name for wf in engine.registry) if names is None or n in names]


def awaits_approval(engine: Engine, task_id: str) -> bool:
    """Whether the task stands at an approval gate, where `approve` and `reject` are decisions on a prepared call
    (they take the digest shown); elsewhere they are ordinary actions (an agent's `reject`, fired in its place)."""
    task = engine.load(task_id)
    return engine.definition_of(task).state(task.state).kind is StateKind.APPROVAL


# -- preconditions: ETags on task reads, If-Match (or expected_seq) on commands --------------------
#: `*`, or one strong entity tag holding a seq: `"7"`. Weak tags (`W/"7"`) and lists are not accepted.
IF_MATCH_PATTERN = r'^(\*|"[1-9][0-9]{0,9}")$'

IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        pattern=IF_MATCH_PATTERN,
        description='The task\'s ETag as a read gave it (`"7"`): refuse with 412 if the task has moved since. '
        "`*` is no precondition.",
    ),
]


def etag(seq: int) -> str:
    """The ETag of a task at `seq`: the seq in double quotes, a strong tag."""
    return f'"{seq}"'


def task_body(
    response: Response, engine: Engine, task: TaskState, caller: Caller | None, *, quota: bool = False
) -> dict[str, Any]:
    """The task as the response body (without the fields its workflow restricts from `caller`), with its ETag on
    the response; `quota`: with its place in the queue for quota, if it waits in one (a read of the flow rows,
    made for GET only: a command's answer is about what the command did)."""
    seen = shown.task(engine, task, caller)
    response.headers["ETag"] = etag(seen.seq)
    view = engine.view(seen)
    if quota:
        view = queries.waiting_for_quota(engine, view)
    return {**view.to_dict(), "prepared": seen.prepared}


@dataclass(frozen=True, slots=True)
class Precondition:
    """The seq a command must find the task at (None: whatever it is), and whether If-Match named it."""

    expected_seq: int | None = None
    from_header: bool = False


def precondition(if_match: str | None, expected_seq: int | None = None) -> Precondition:
    """From the If-Match header and the body's `expected_seq`; both may be given only if they agree."""
    named = _seq_of(if_match)
    if named is not None and expected_seq is not None and named != expected_seq:
        raise Refused(
            f"If-Match names seq {named} but the body's expected_seq is {expected_seq}: send one",
            code=Code.PAYLOAD_INVALID,
            header="If-Match",
            if_match=named,
            expected_seq=expected_seq,
        )
    if named is not None:
        return Precondition(named, from_header=True)
    return Precondition(expected_seq)


def _seq_of(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() == "*":
        return None
    text = if_match.strip()
    # The route's Header pattern already refused anything else; this is for callers that bypass it.
    if (
        len(text) < 3
        or text[0] != '"'
        or text[-1] != '"'
        or not text[1:-1].isascii()
        or not text[1:-1].isdigit()
        or text[1] == "0"
    ):
        raise Refused(
            'If-Match must be a task\'s ETag, a seq in double quotes such as "7", or *',
            code=Code.PAYLOAD_INVALID,
            header="If-Match",
        )
    seq = int(text[1:-1])
    if seq > MAX_SEQ:
        raise Refused(
            f"If-Match names seq {seq}, larger than any seq ({MAX_SEQ})", code=Code.PAYLOAD_INVALID, header="If-Match"
        )
    return seq


@contextmanager
def acting_on(engine: Engine, task_id: str, pre: Precondition) -> Iterator[None]:
    """Around an engine command: a ConcurrencyConflict becomes the answer that names where the task is now, as
    a 412 if If-Match carried the seq and the table's 409 otherwise."""
    try:
        yield
    except ConcurrencyConflict as conflict:
        if conflict.code is not Code.CONCURRENCY_CONFLICT:  # LEASE_LOST is a worker's, and keeps its own code
            raise
        raise moved(engine, task_id, conflict, pre) from None


def moved(engine: Engine, task_id: str, conflict: ConcurrencyConflict, pre: Precondition) -> RailyardError:
    details = dict(conflict.details)
    state, actual = details.get("state"), details.get("actual")
    if state is None or actual is None:  # an engine that does not say: read where the task is now
        try:
            now = engine.load(task_id)
        except RailyardError:
            now = None
        if now is not None:
            state, actual = now.state, now.seq
    expected = pre.expected_seq if pre.expected_seq is not None else details.get("expected")
    details.update(task_id=task_id, state=state, actual=actual, expected=expected)
    where = f"it is now in {state!r} at seq {actual}" if state is not None else "it moved"
    if details.get("changed_by"):  # who changed it and how: what the person refused needs to hear, not only a seq
        where = (
            f"{details['changed_by']} changed it meanwhile ({details.get('changed_with')} to "
            f"{details.get('changed_to')!r}); {where}"
        )
    if pre.from_header:
        message = (
            f"task {task_id} is no longer at the seq If-Match named ({expected}): {where}. "
            "Read it again and decide on what it is now."
        )
        return PreconditionFailed(message, **details)
    if pre.expected_seq is not None:
        message = (
            f"task {task_id} is no longer at the expected seq {expected}: {where}. "
            "Read it again and decide on what it is now."
        )
    else:
        message = f"task {task_id} moved while this command was decided: {where}. Read it again and decide again."
    return RailyardError(message, code=Code.CONCURRENCY_CONFLICT, **details)


def one_name(body: dict[str, Any]) -> dict[str, Any]:
    """A body naming its workflow the one way the API does: `workflow` (the name) and `version`, never the
    `name@version` the CLI prints."""
    name, _, version = str(body["workflow"]).partition("@")
    return {**body, "workflow": name, "version": int(version)} if version.isdigit() else body


# -- what each operation can refuse with: its `responses`, declared once at the route -----------------------------
# Each route lists the codes it can answer with (these groups and its own); `refusals` turns the list into the
# document's error responses, a status per code (`STATUS_BY_CODE`), with the codes as an enum and an example each.
# tests/test_api_errors.py checks every code listed is one the route can give, and that what a request provokes is
# listed; schemathesis checks every answer against the document.

#: A call that reads or writes the database: away, not there, failing, or without the schema (503). Every call
#: does: who holds a token, and whether a token's person is still enabled, is the database's too.
DATABASE = (Code.DATABASE_UNREACHABLE, Code.DATABASE_NOT_FOUND, Code.DATABASE_ERROR, Code.SCHEMA_MISSING)
#: Every API call: no token (401); a query, path, header or body that does not match its schema, or a query
#: parameter the route does not take (422); a bug (500); the database, asked who is calling (503).
API = (Code.ACTOR_REQUIRED, Code.PAYLOAD_INVALID, Code.INTERNAL_ERROR, *DATABASE)
STORED = API
#: Every write: a read-only (auditor) token (403), a body over the limit (413).
WRITE = (Code.FORBIDDEN, BODY_TOO_LARGE)
#: A task's events that do not hold together, or an archived task whose file is gone (500).
EVENTS_BROKEN = (Code.HASH_MISMATCH, Code.ARCHIVE_MISSING)
#: ... and, loading the task, folded to another state than its row's (500).
LOG_BROKEN = (*EVENTS_BROKEN, Code.SEQ_GAP, Code.STATE_MISMATCH)
#: Loading a task: none by that id (404), pinned to a version this server's code does not run (409), a broken log.
TASK = (Code.TASK_NOT_FOUND, Code.TASK_ID_AMBIGUOUS, Code.DEFINITION_MISSING, Code.DEFINITION_CHANGED, *LOG_BROKEN)
#: A command on a task, decided on the state its sender saw: the task moved past the seq named (409), or past the
#: one If-Match named (412).
COMMAND = (*STORED, *WRITE, *TASK, Code.CONCURRENCY_CONFLICT, IF_MATCH_FAILED)
#: What the engine's checks of a trigger refuse (`engine.core.decide`) beyond a role (403) and its payload's model
#: (422): not allowed in this state, a guard, a write whose outcome is open.
TRIGGER = (Code.TRIGGER_NOT_ALLOWED, Code.DOMAIN_INVALID, Code.OUTCOME_UNSETTLED)
#: A trigger fired on a task that ended (a decision says TASK_NOT_AWAITING_APPROVAL instead).
ENDED = (Code.TASK_TERMINAL,)
#: A remark (a note, a claim) refused while a worker runs the task's step.
BUSY = (Code.TASK_BUSY,)
#: An approval's decision (`engine.core.approvals.check_decision`, then the trigger's own checks): the task is not
#: at an approval, the state has no such decision, the role or separation of duties.
DECISION = (Code.TASK_NOT_AWAITING_APPROVAL, Code.APPROVAL_FORBIDDEN, *TRIGGER)


# -- the API over tasks ----------------------------------------------------------------------------
@task_api.get("/me", response_model=WhoAmI, responses=refusals(API))
def whoami(who: Reader) -> dict[str, Any]:
    """The actor, roles and tenants the bearer token stands for (the database is asked too: a token may be kept
    there, and a person's token carries the person's roles)."""
    tenants = sorted(who.tenants) if who.tenants is not None else None
    return {"actor": who.actor, "roles": sorted(who.roles), "read_only": who.read_only, "tenants": tenants}


@task_api.post(
    "/tasks",
    status_code=201,
    response_model=TaskBody,
    responses=refusals(STORED, WRITE, Code.WORKFLOW_UNKNOWN, Code.VERSION_UNKNOWN, Code.TENANT_REQUIRED, tagged=201),
)
def start_task(body: StartRequest, ctx: Ctx, who: Writer, response: Response) -> dict[str, Any]:
    """Start a task on a workflow (its newest version unless `version`); the token's actor starts it, in the
    token's tenant (`tenant` chooses among the token's tenants)."""
    task_id = ctx.engine.start(body.workflow, body.input, actor=who.actor, version=body.version, tenant=body.tenant)
    response.headers["Location"] = f"/api/tasks/{task_id}"
    return task_body(response, ctx.engine, ctx.engine.load(task_id), who.caller)


#: The filters of a task list, the API's and the page's alike (unset: any; the page sends empty fields for "any",
#: a generated client sends nothing).
WorkflowFilter = Annotated[str | None, Query(pattern=f"^$|{NAME_PATTERN}", description="Only tasks of this workflow.")]
State = Annotated[
    str | None,
    Query(
        pattern=f"^$|{STATE_PATTERN}",
        description="Only tasks in this state; a public state matches its internal `~` sub-states too.",
    ),
]
StatusFilter = Annotated[
    str | None, Query(pattern="^(|runnable|blocked|terminal)$", description="Only tasks of this status.")
]
#: Text filters: no control characters (PostgreSQL refuses NUL in a string; nobody types the others).
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"
StartedBy = Annotated[
    str | None, Query(max_length=200, pattern=TEXT_PATTERN, description="Only tasks this actor started.")
]
CreatedFrom = Annotated[
    str | None, Query(max_length=40, description="Created at or after: a date (UTC) or an ISO 8601 date-time.")
]
CreatedTo = Annotated[
    str | None,
    Query(max_length=40, description="Created on or before this date (UTC), or before this ISO 8601 date-time."),
]
Search = Annotated[
    str | None,
    Query(
        max_length=200,
        pattern=TEXT_PATTERN,
        description="A task id prefix, or the value of a searchable input field (a customer id).",
    ),
]
Cursor = Annotated[str | None, Query(max_length=200, description="The `next_cursor` of the previous page.")]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Page size.")]
#: `csv`: the whole list (every page, the same filters) as a CSV download, streamed; the page's and the API's.
Format = Annotated[
    str | None,
    Query(pattern=f"^(|json|{CSV_FORMAT})$", description="`csv`: every page of the list as one CSV file."),
]
#: How the API's lists say they can also answer with CSV (`?format=csv`).
CSV_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"text/csv": {"schema": {"type": "string"}}},
        "description": "The list, or with `format=csv` the whole list as CSV.",
    }
}


def list_link(path: str, params: dict[str, Any], cursor: str | None = None) -> str:
    """A list's path and query with the filters given (empty ones left out) and, if any, the cursor."""
    kept = {k: v for k, v in params.items() if v not in (None, "") and k != "cursor"}
    if cursor:
        kept["cursor"] = cursor
    return f"{path}?{urlencode(kept)}" if kept else path


def next_link(path: str, params: dict[str, Any], cursor: str | None) -> str | None:
    """The next page's link: the same filters, the new cursor (None on the last page)."""
    return list_link(path, params, cursor) if cursor else None


@task_api.get("/tasks", response_model=TaskPage, responses={**refusals(STORED), **CSV_ANSWER})
def tasks(
    request: Request,
    ctx: Ctx,
    who: Reader,
    workflow: WorkflowFilter = None,
    state: State = None,
    status: StatusFilter = None,
    started_by: StartedBy = None,
    created_from: CreatedFrom = None,
    created_to: CreatedTo = None,
    q: Search = None,
    cursor: Cursor = None,
    limit: Limit = PAGE_SIZE,
    format: Format = None,
) -> Any:
    """Tasks, newest first (by creation time, then id), a page at a time: follow `next` (or send `next_cursor`
    as `cursor` with the same filters) until it is null. Tasks created meanwhile never shift a page. With
    `format=csv`, every task the filters select as one CSV file (`cursor` and `limit` do not apply)."""
    where = TaskFilter(workflow, state, status, started_by, created_from, created_to, q, cursor, limit)
    if format == CSV_FORMAT:
        return csv_response(tasks_csv(ctx.engine, where, who), "tasks")
    found = list_tasks(ctx.engine, where, who.caller)
    return {
        "tasks": [
            {**asdict(t), "created_at": format_instant(t.created_at), "updated_at": format_instant(t.updated_at)}
            for t in found.tasks
        ],
        "limit": found.limit,
        "next_cursor": found.next_cursor,
        "next": next_link(request.url.path, {**asdict(where), "limit": found.limit}, found.next_cursor),
    }


@task_api.get("/tasks/{task_id}", response_model=TaskBody, responses=refusals(STORED, TASK, tagged=200))
def get_task(task_id: VisibleTask, ctx: Ctx, who: Reader, response: Response) -> dict[str, Any]:
    """Where the task stands: state, status, seq and the triggers it allows now. The ETag is the seq."""
    return task_body(response, ctx.engine, ctx.engine.load(task_id), who.caller, quota=True)


@task_api.get(
    "/tasks/{task_id}/history",
    response_model=list[EventBody],
    responses=refusals(STORED, Code.TASK_NOT_FOUND, Code.TASK_ID_AMBIGUOUS, EVENTS_BROKEN),
)
def history(task_id: VisibleTask, ctx: Ctx, who: Reader) -> list[dict[str, Any]]:
    """Every event of the task's log, in order, with its hashes (stored hashes: a value the workflow restricts
    from the caller is shown as `[restricted]`, so only an unrestricted read recomputes them)."""
    return [e.to_dict() for e in shown.events(ctx.engine, task_id, who.caller)]


@task_api.post(
    "/tasks/{task_id}/signal",
    response_model=TaskBody,
    responses=refusals(COMMAND, ENDED, TRIGGER, Code.IDENTITY_OVERRIDE, tagged=200),
)
def signal(
    task_id: VisibleTask, body: SignalRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Fire a trigger the current state allows (a customer's reply, an operator's resume). System triggers (tool
    outcomes, deadlines, repairs) are refused with FORBIDDEN; approval decisions go through /approve and /reject.
    With If-Match (the task's ETag) a task that moved since is 412; with `expected_seq` in the body, 409."""
    if body.trigger in DECISIONS and awaits_approval(ctx.engine, task_id):  # /approve and /reject take the digest
        raise Refused(
            f"{body.trigger!r} is an approval decision: POST /api/tasks/{{id}}/{body.trigger} instead",
            code=Code.TRIGGER_NOT_ALLOWED,
            task_id=task_id,
            trigger=body.trigger,
        )
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.fire(task_id, body.trigger, body.payload, actor=who.actor, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine, task, who.caller)


@task_api.post(
    "/tasks/{task_id}/cancel",
    response_model=TaskBody,
    responses=refusals(COMMAND, ENDED, tagged=200),
)
def cancel(
    task_id: VisibleTask, body: CancelRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Cancel the task from any non-terminal state; the reason is recorded. While a write tool call is in flight
    the cancel is recorded as requested (`cancel_requested`) and takes effect when the call settles."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.cancel(task_id, actor=who.actor, reason=body.reason, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine, task, who.caller)


@task_api.post(
    "/tasks/{task_id}/notes",
    response_model=TaskBody,
    responses=refusals(STORED, *WRITE, *TASK, ENDED, BUSY, tagged=200),
)
def note(task_id: VisibleTask, body: NoteRequest, ctx: Ctx, who: Writer, response: Response) -> dict[str, Any]:
    """Add a note to the task: a `comment` event where it stands, shown in its timeline. It takes no If-Match: a
    note decides nothing, and it makes no pending decision stale (a decision sent with the seq before it still
    goes through). Nothing is recorded on a task that ended (409 TASK_TERMINAL), nor while a worker runs its step
    (409 TASK_BUSY: the worker would throw its step away and pay for it again)."""
    task = ctx.engine.note(task_id, who.actor, body.text)
    return task_body(response, ctx.engine, task, who.caller)


@task_api.post(
    "/tasks/{task_id}/settle",
    response_model=TaskBody,
    responses=refusals(COMMAND, Code.TRIGGER_NOT_ALLOWED, Code.OUTCOME_UNSETTLED, tagged=200),
)
def settle(
    task_id: VisibleTask, body: SettleRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Record what happened to the write tool call whose outcome is unknown (`unsettled`): an operator's assertion,
    with the evidence it rests on, that the call was executed or not. The engine checks the operator's role."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.settle(
            task_id, actor=who.actor, outcome=body.outcome, evidence=body.evidence, expected_seq=pre.expected_seq
        )
    return task_body(response, ctx.engine, task, who.caller)


@task_api.post(
    "/tasks/{task_id}/fork",
    status_code=201,
    response_model=TaskBody,
    responses=refusals(
        STORED,
        WRITE,
        TASK,
        Code.FORK_INVALID,
        Code.WRITE_WOULD_REPEAT,
        Code.WORKFLOW_UNKNOWN,
        Code.VERSION_UNKNOWN,
        tagged=201,
    ),
)
def fork(task_id: VisibleTask, body: ForkRequest, ctx: Ctx, who: Writer, response: Response) -> dict[str, Any]:
    """Start a new task from this task's state as of `at_seq` (`railyard fork`); the source is only read. Refused
    with 409 WRITE_WOULD_REPEAT where the fork could make a write the source made, or may make, a second time."""
    new_id = ctx.engine.fork(task_id, body.at_seq, actor=who.actor, reason=body.reason, version=body.version)
    response.headers["Location"] = f"/api/tasks/{new_id}"
    return task_body(response, ctx.engine, ctx.engine.load(new_id), who.caller)


@task_api.post(
    "/tasks/{task_id}/redrive",
    response_model=TaskBody,
    responses=refusals(COMMAND, Code.REDRIVE_INVALID, Code.WRITE_WOULD_REPEAT, tagged=200),
)
def redrive(
    task_id: VisibleTask, body: RedriveRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Send a handed-off or limit-state task back to an agent or tool state it was in (`railyard redrive`); its
    budgets start again. The engine checks the role (the workflow's redrive, settle or cancel role)."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.redrive(
            task_id, body.to_state, actor=who.actor, reason=body.reason, expected_seq=pre.expected_seq
        )
    return task_body(response, ctx.engine, task, who.caller)


@task_api.get(
    "/tasks/{task_id}/replay",
    response_model=ReplayBody,
    responses=refusals(STORED, Code.TASK_NOT_FOUND, Code.TASK_ID_AMBIGUOUS),
)
def replay(task_id: VisibleTask, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """Check the task's whole log without calling any model or tool: the hash chain, that every transition was
    legal in its pinned definition, and that the fold matches the stored state. `ok` is false with findings."""
    report: dict[str, Any] = ctx.engine.replay(task_id).to_dict()
    return one_name(report)


@task_api.get(
    "/tasks/{task_id}/diagram",
    name="diagram",
    response_model=DiagramBody,
    responses=refusals(STORED, TASK),
)
def task_diagram_body(task_id: VisibleTask, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """The task's workflow version as a Mermaid state diagram, with the path the task took highlighted."""
    task = ctx.engine.load(task_id)
    return task_diagram(ctx.engine.definition_of(task), ctx.engine.events_of(task))


# -- the API over approvals ------------------------------------------------------------------------
@approval_api.get("/approvals", response_model=ApprovalPage, responses={**refusals(STORED, LOG_BROKEN), **CSV_ANSWER})
def approvals(
    request: Request,
    ctx: Ctx,
    who: Reader,
    role: Annotated[str | None, Query(max_length=200, description="Only decisions this role takes.")] = None,
    cursor: Cursor = "",
    limit: Limit = PAGE_SIZE,
    format: Format = None,
) -> Any:
    """Tasks waiting at an approval state, oldest first, each with the prepared call and its digest; a page at
    a time, like the task list. With `format=csv`, every approval the filters select as one CSV file, with a
    totals row per currency where the cards declare money (`cursor` and `limit` do not apply)."""
    if format == CSV_FORMAT:
        return csv_response(approvals_csv(ctx.engine, who, role), "approvals")
    after = decode_cursor(cursor) if cursor else None
    if after is not None and not queries.exists(ctx.engine, after, who.caller):
        raise Refused("the cursor names no task here: start from the first page", code=Code.PAYLOAD_INVALID)
    found, last = queries.approvals(ctx.engine, who.caller, role=role, after=after, limit=limit)
    page = [one_name(a) for a in found]
    more = encode_cursor(last) if last is not None else None
    return {
        "approvals": page,
        "limit": limit,
        "next_cursor": more,
        "next": next_link(request.url.path, {"role": role, "limit": limit}, more),
    }


def work_body(queue: WorkPage) -> dict[str, Any]:
    return {
        "items": [
            {
                "task_id": w.task_id,
                "workflow": w.workflow.partition("@")[0],
                "version": w.version,
                "state": w.state,
                "kind": str(w.kind),
                "seq": w.seq,
                "started_by": w.started_by,
                "created_at": format_instant(w.created_at),
                "waiting_since": format_instant(w.waiting_since),
                "deadline": format_instant(w.deadline) if w.deadline is not None else None,
                "at_deadline": w.at_deadline,
                "triggers": w.triggers,
                "digest": w.digest,
                "asked": w.asked,
                "fields": w.fields,
                "claimed_by": w.claim.actor if w.claim is not None else None,
                "claimed_until": format_instant(w.claim.expires_at) if w.claim is not None else None,
            }
            for w in queue.rows
        ],
        "counts": [
            {"kind": str(c.kind), "workflow": c.workflow, "yours": c.yours, "others": c.others} for c in queue.counts
        ],
        "total": dict(zip(("yours", "others"), queue.total(), strict=True)),
        "limit": queue.limit,
        "next_cursor": queue.next_cursor,
    }


@approval_api.get("/work", response_model=WorkQueueBody, responses={**refusals(STORED, LOG_BROKEN), **CSV_ANSWER})
def work(
    request: Request,
    ctx: Ctx,
    who: Reader,
    kind: WorkKindFilter = None,
    workflow: WorkflowFilter = None,
    older_than: OlderThan = None,
    cursor: Cursor = None,
    limit: WorkLimit = WORK_PAGE_SIZE,
    format: Format = None,
) -> Any:
    """Every task waiting on a trigger the token's actor may fire (approvals, hand-offs, failures to retry,
    limits reached, effects after a cancel, waits on a person), nearest deadline first and then oldest, a page
    at a time, with the counts per kind and workflow of what the same filters select; tasks waiting on roles the
    token lacks are only counted. With `format=csv`, every item the filters select as one CSV file, with a
    totals row per currency where the cards declare money (`cursor` and `limit` do not apply)."""
    if format == CSV_FORMAT:
        lines = queue_csv(ctx.engine, who, kind=kind, workflow=workflow, older_than=older_than)
        return csv_response(lines, "work")
    queue = work_queue(ctx.engine, who, kind=kind, workflow=workflow, older_than=older_than, cursor=cursor, limit=limit)
    params = {"kind": kind, "workflow": workflow, "older_than": older_than, "limit": queue.limit}
    return {**work_body(queue), "next": next_link(request.url.path, params, queue.next_cursor)}


@approval_api.post(
    "/tasks/{task_id}/approve",
    response_model=TaskBody,
    responses=refusals(
        COMMAND,
        DECISION,
        Code.APPROVAL_STALE,
        Code.DIGEST_INVALID,
        Code.DIGEST_TOO_SHORT,
        Code.DIGEST_AMBIGUOUS,
        tagged=200,
    ),
)
def approve(
    task_id: VisibleTask, body: ApproveRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Approve the prepared call whose digest the body names. Two approvers at once: one decision, the other 409
    (412 if it sent If-Match)."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.approve(
            task_id, actor=who.actor, prepared_digest=body.digest, comment=body.comment, expected_seq=pre.expected_seq
        )
    return task_body(response, ctx.engine, task, who.caller)


@approval_api.post(
    "/tasks/{task_id}/reject", response_model=TaskBody, responses=refusals(COMMAND, DECISION, tagged=200)
)
def reject(
    task_id: VisibleTask, body: RejectRequest, ctx: Ctx, who: Writer, response: Response, if_match: IfMatch = None
) -> dict[str, Any]:
    """Reject the decision the task waits on; the reason is recorded with it."""
    pre = precondition(if_match, body.expected_seq)
    with acting_on(ctx.engine, task_id, pre):
        task = ctx.engine.reject(task_id, actor=who.actor, reason=body.reason, expected_seq=pre.expected_seq)
    return task_body(response, ctx.engine, task, who.caller)


def claim_body(claim: WorkClaim) -> dict[str, Any]:
    return {
        "task_id": claim.task_id,
        "actor": claim.actor,
        "seq": claim.seq,
        "claimed_at": format_instant(claim.claimed_at),
        "expires_at": format_instant(claim.expires_at),
        "taken_from": claim.taken_from,
        "reason": claim.reason,
    }


#: What a claim can refuse: the task (404), an ended one, someone else on it (409), a reason that is not one.
CLAIM = (
    *STORED,
    *WRITE,
    Code.TASK_NOT_FOUND,
    Code.TASK_ID_AMBIGUOUS,
    Code.TASK_TERMINAL,
    Code.WORK_CLAIMED,
    Code.TASK_BUSY,
)


@approval_api.post("/tasks/{task_id}/claim", response_model=ClaimBody, responses=refusals(CLAIM, tagged=200))
def claim(task_id: VisibleTask, body: ClaimRequest, ctx: Ctx, who: Writer) -> dict[str, Any]:
    """Put the token's actor on the task's work item for 30 minutes (again: renewed), so that others see who has
    it (`claimed_by` in GET /api/work). Someone else's claim is refused (409 WORK_CLAIMED, naming them) unless
    `take_over` says why you take it. A claim ends when it expires or the task moves (a decision)."""
    return claim_body(ctx.engine.claim_work(task_id, who.actor, take_over=body.take_over))


@approval_api.delete(
    "/tasks/{task_id}/claim",
    status_code=204,
    responses=refusals(STORED, Code.FORBIDDEN, Code.TASK_NOT_FOUND, Code.TASK_ID_AMBIGUOUS),
)
def release(task_id: VisibleTask, ctx: Ctx, who: Writer) -> Response:
    """Take the token's actor off the item (nothing happens if they were not on it)."""
    ctx.engine.release_work(task_id, who.actor)
    return Response(status_code=204)


# -- the API over definitions ----------------------------------------------------------------------
Name = Annotated[str, Path(pattern=NAME_PATTERN, description="Workflow name.")]


def version_body(wf: Workflow) -> dict[str, Any]:
    return {
        "version": wf.version,
        "ref": wf.ref,
        "digest": wf.digest,
        "initial": wf.initial_state,
        "states": [s.name for s in wf.states],
        "description": wf.description,
    }


def workflow_body(registry: Registry, name: str) -> dict[str, Any]:
    newest = registry.get(name)  # WORKFLOW_UNKNOWN if there is none
    return {
        "name": name,
        "newest": newest.version,
        "versions": [version_body(registry.get(name, v)) for v in registry.versions(name)],
    }


@workflow_api.get("/workflows", response_model=list[WorkflowBody], responses=refusals(API))
def workflows(ctx: Ctx, _who: Reader) -> list[dict[str, Any]]:
    """Every workflow this server's code defines, with all its versions."""
    registry = ctx.engine.registry
    names = list(dict.fromkeys(wf.name for wf in registry))
    return [workflow_body(registry, name) for name in names]


@workflow_api.get("/workflows/{name}", response_model=WorkflowBody, responses=refusals(API, Code.WORKFLOW_UNKNOWN))
def workflow(name: Name, ctx: Ctx, _who: Reader) -> dict[str, Any]:
    """One workflow's versions."""
    return workflow_body(ctx.engine.registry, name)


@workflow_api.get(
    "/workflows/{name}/diagram",
    name="diagram",
    response_model=DiagramBody,
    responses=refusals(API, Code.WORKFLOW_UNKNOWN, Code.VERSION_UNKNOWN),
)
def workflow_diagram_body(
    name: Name,
    ctx: Ctx,
    _who: Reader,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1, description="Version (default: newest).")] = None,
) -> dict[str, Any]:
    """The version's state diagram (Mermaid)."""
    return workflow_diagram(ctx.engine.registry.get(name, version))


# -- the access trail ------------------------------------------------------------------------------
#: The largest page of the access trail.
TRAIL_MAX_LIMIT = 1000


@access_api.get(
    "/access/trail", response_model=AccessTrailPage, responses={**refusals(API, Code.FORBIDDEN), **CSV_ANSWER}
)
def access_trail(
    ctx: Ctx,
    who: Reader,
    after: Annotated[int, Query(ge=0, description="The id of the last entry of the previous page.")] = 0,
    limit: Annotated[int, Query(ge=1, le=TRAIL_MAX_LIMIT, description="Page size.")] = 100,
    format: Format = None,
) -> Any:
    """Every change of people, roles, tenants, passwords and database tokens, oldest first: who made it, when,
    what. For callers holding the `auditor` role; anyone else is refused (403 FORBIDDEN). With `format=csv`, the
    whole trail as one CSV file (`after` and `limit` do not apply)."""
    if AUDITOR not in who.roles:
        raise Refused(
            f"{who.actor!r} may not read the access trail: role {AUDITOR!r} required",
            code=Code.FORBIDDEN,
            actor=who.actor,
            role=AUDITOR,
        )
    if format == CSV_FORMAT:
        return csv_response(trail_csv(ctx.engine), "access-trail")
    found = ctx.engine.people.trail(after=after or None, limit=limit + 1)
    page = found[:limit]
    return {
        "entries": [c.to_dict() for c in page],
        "next": page[-1].id if len(found) > limit and page else None,
    }


# -- the pages -------------------------------------------------------------------------------------
#: The seq a decision form was rendered at. Optional only so a hand-made post still gets the engine's own refusal;
#: the pages always send it.
Seq = Annotated[int | None, Form(ge=1, le=MAX_SEQ)]
#: Where to go after logging in: a path of this server, as `safe_next` accepts it.
Next = Annotated[str, Form(max_length=2000)]
#: Where a login goes when it was asked for nothing else (or for somewhere not on this server).
HOME = "/inbox"


def _cookie(response: Response, ctx: Context, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, httponly=True, samesite="strict", secure=ctx.secure_cookies, path="/"
    )


def safe_next(target: str | None) -> str:
    """`target` if it is a path on this server (`/tasks?state=x`), else HOME: a login never redirects off-site.

    Refused: absolute URLs, scheme-relative `//host`, backslashes (`/\\host`, which browsers read as `//`),
    control characters and whitespace, and the login and logout pages themselves."""
    text = target or ""
    if (
        not text.startswith("/")
        or text.startswith("//")
        or "\\" in text
        or any(ord(c) < 0x21 or ord(c) == 0x7F for c in text)
    ):
        return HOME
    parts = urlsplit(text)
    if parts.scheme or parts.netloc or parts.path in ("/login", "/logout"):
        return HOME
    return text


@dataclass
class Outcome:
    """What a page command came to, for where it redirects: refused (and shown so in the flash), or done."""

    refused: bool = False


@contextmanager
def flashed(session: Session, done: str) -> Iterator[Outcome]:
    """Around a page command: what happened goes to the session's flash, shown by the page redirected to. A
    refusal is shown there too (with its code), so the answer to every command is a redirect (Post/Redirect/Get)
    and a reload never sends it again; a server failure (5xx) is still the error page."""
    outcome = Outcome()
    try:
        yield outcome
    except RailyardError as error:
        if status_for(error) >= 500:
            raise
        outcome.refused = True
        session.flash(Flash("refused", error.message, str(error.code)))
    else:
        session.flash(Flash("done", done))


#: Where a decision made from the work queue goes next: the queue with the next item opened (a path here).
Then = Annotated[str, Form(max_length=2000)]


def decided(task_id: str, outcome: Outcome, then: str) -> Response:
    """The redirect after a command on a task: done from the queue, to the queue's next item (`then`, if it is a
    path of this server); refused, or from the task page, to the task, which shows why and where it is now."""
    if then and not outcome.refused:
        return RedirectResponse(safe_next(then), status_code=303)
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)


@pages.get("/")
def home() -> Response:
    return RedirectResponse(HOME, status_code=303)


def _login_form(request: Request, ctx: Ctx, status: int, next_path: str, error: str | None) -> Response:
    cookie, csrf = ctx.signer.login()
    provider = ctx.oidc.settings.display_name if ctx.oidc is not None else None
    response = render(
        request, "login.html", status, session=None, csrf=csrf, error=error, next=next_path, provider=provider
    )
    _cookie(response, ctx, LOGIN_COOKIE, cookie, LOGIN_SECONDS)
    return response


@pages.get("/login", response_class=HTMLResponse)
def login_page(request: Request, ctx: Ctx, next: Annotated[str, Query(max_length=2000)] = "") -> Response:
    return _login_form(request, ctx, 200, safe_next(next), None)


async def login_post(request: Request) -> None:
    """The login form's checks before its fields: this server's origin, and the login cookie's CSRF token."""
    refuse_foreign(request)
    presented = (await request.form()).get("csrf")
    expected = context(request).signer.read_login(request.cookies.get(LOGIN_COOKIE))
    if not same_token(expected, presented if isinstance(presented, str) else None):
        raise Refused("the login form expired: reload the page and try again", code=Code.FORBIDDEN, reason="csrf")


@pages.post("/login", dependencies=[Depends(login_post)])
def login(
    request: Request,
    ctx: Ctx,
    token: Annotated[str, Form(max_length=500)] = "",
    user: Annotated[str, Form(max_length=200, pattern=TEXT_PATTERN)] = "",
    password: Annotated[str, Form(max_length=1000)] = "",
    next: Next = "",
) -> Response:
    """A name and password (a person of the people table), or a token. A failed login answers the form again (401,
    or 429 LOGIN_THROTTLED with Retry-After), in the same words whatever was wrong (no such name, a wrong password,
    a disabled person): it changed nothing but the failure count, so a reload only tries again. A login redirects
    (303) to where it was asked for."""
    address = request.client.host if request.client is not None else None
    named = user.strip() or None
    target = safe_next(next)
    principal = None
    with ctx.throttle.lock:  # the check and the count together: a burst sent at once is counted one by one
        wait = ctx.throttle.retry_after(address=address, account=named)
        if wait is None:
            if password:
                principal = ctx.directory.verify(named, password) if named is not None else None
            else:
                principal = ctx.directory.authenticate(token.strip()) if token.strip() else None
            if principal is None or named not in (None, principal.actor):  # unknown, or someone else's token
                ctx.throttle.failed(address=address, account=named)
                return _login_form(
                    request, ctx, 401, target, "That name and password (or token) are not one this server knows."
                )
            wait = ctx.throttle.retry_after(address=address, account=principal.actor)
    if wait is not None or principal is None:
        refusal = throttled(wait or 1)
        again = _login_form(request, ctx, 429, target, f"{refusal.message} ({refusal.code}).")
        again.headers["Retry-After"] = str(wait or 1)
        return again
    ctx.throttle.succeeded(address=address, account=principal.actor)
    previous = ctx.sessions.read(request.cookies.get(SESSION_COOKIE))
    if previous is not None:  # a login replaces this browser's session: a copy of the old cookie dies with it
        ctx.sessions.end(previous)
    cookie, _row = ctx.sessions.open(principal)
    response = RedirectResponse(target, status_code=303)
    _cookie(response, ctx, SESSION_COOKIE, cookie, SESSION_SECONDS)
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


@pages.post("/logout")
def logout(ctx: Ctx, session: PagePost) -> Response:
    """Ends the session in the database: this cookie, and every copy of it, stops working now."""
    ctx.sessions.end(session.row)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


# -- sign-in through OpenID Connect (engine.api.oidc) -----------------------------------------------------------
def _oidc(ctx: Context) -> OidcClient:
    """The configured sign-in; without one, its pages do not exist (404, as any unknown path)."""
    if ctx.oidc is None:
        raise StarletteHTTPException(404, "Not Found")
    return ctx.oidc


@pages.get("/login/oidc")
def oidc_login(request: Request, ctx: Ctx, next: Annotated[str, Query(max_length=2000)] = "") -> Response:
    """Sends the browser to the provider (code flow, PKCE S256, state and nonce kept in a signed cookie)."""
    client = _oidc(ctx)
    target = safe_next(next)
    scheme = "https" if ctx.secure_cookies else request.url.scheme
    try:
        url, flow = client.begin(client.redirect_uri(f"{scheme}://{request.url.netloc}"), target)
    except RailyardError as error:  # the provider is not answering: say so on the login page
        log.warning("OIDC sign-in not started: %s", error)
        return _login_form(request, ctx, status_for(error), target, f"{error.message} ({error.code}).")
    response = RedirectResponse(url, status_code=303)
    # SameSite=Lax, not Strict: the provider's redirect back is a navigation from another site.
    response.set_cookie(
        OIDC_COOKIE,
        ctx.signer.oidc(flow.to_cookie()),
        max_age=OIDC_SECONDS,
        httponly=True,
        samesite="lax",
        secure=ctx.secure_cookies,
        path="/login/oidc",
    )
    return response


@pages.get("/login/oidc/callback")
def oidc_callback(request: Request, ctx: Ctx) -> Response:
    """Where the provider sends the browser back: the state, the code's exchange and the ID token are checked
    (`OidcClient.finish`), the person is made to match what their groups give them in the people table
    (`sync_person`: source oidc, every change in the access trail), and a person's session is opened, which reads
    them again on every request.

    A refusal (OIDC_REFUSED) is a failed login (`LoginThrottle`, counted against the address: the provider's
    answer names no account this server may trust yet) and answers the login page, 401; a provider that does not
    answer is 502 OIDC_UNAVAILABLE and counts nothing. The answer to a sign-in is a page that moves on to where
    the person was going: a redirect would still be part of the navigation that came from the provider's site,
    and the browser would not send the session's SameSite=Strict cookie with it."""
    client = _oidc(ctx)
    address = request.client.host if request.client is not None else None
    flow = Flow.from_cookie(ctx.signer.read_oidc(request.cookies.get(OIDC_COOKIE)))
    target = safe_next(flow.next) if flow is not None else HOME
    wait = ctx.throttle.retry_after(address=address, account=None)
    if wait is not None:
        refusal = throttled(wait)
        again = _login_form(request, ctx, 429, target, f"{refusal.message} ({refusal.code}).")
        again.headers["Retry-After"] = str(wait)
        again.delete_cookie(OIDC_COOKIE, path="/login/oidc")
        return again
    try:
        person = client.finish(flow, {k: v[:2000] for k, v in request.query_params.items()})
        name = sync_person(ctx.directory.people, person, client.settings).name
    except RailyardError as error:
        if error.code not in (Code.OIDC_REFUSED, Code.OIDC_UNAVAILABLE):
            raise  # the database failed: the error page, as for any page
        if error.code is Code.OIDC_REFUSED:
            with ctx.throttle.lock:
                ctx.throttle.failed(address=address, account=None)
        log.warning("OIDC sign-in refused (%s): %s", error.details.get("reason", "-"), error.message[:300])
        again = _login_form(request, ctx, status_for(error), target, f"{error.message} ({error.code}).")
        again.delete_cookie(OIDC_COOKIE, path="/login/oidc")
        return again
    ctx.throttle.succeeded(address=address, account=name)
    previous = ctx.sessions.read(request.cookies.get(SESSION_COOKIE))
    if previous is not None:  # a sign-in replaces this browser's session, as a login does
        ctx.sessions.end(previous)
    cookie, _row = ctx.sessions.open_person(name)
    response = render(request, "signed_in.html", session=None, next=target, actor=name)
    _cookie(response, ctx, SESSION_COOKIE, cookie, SESSION_SECONDS)
    response.delete_cookie(OIDC_COOKIE, path="/login/oidc")
    response.delete_cookie(LOGIN_COOKIE, path="/")
    return response


#: The work queue's filters, the page's and the API's alike (empty: any).
KindFilter = Annotated[
    str | None, Query(pattern="^(|" + "|".join(WorkKind) + ")$", description="Only work of this kind.")
]
WorkLimit = Annotated[int, Query(ge=1, le=WORK_MAX_LIMIT, description="Page size.")]
OlderThan = Annotated[
    str | None,
    Query(
        pattern="^(|" + "|".join(AGES) + ")$", description="Only work waiting (since its last event) longer than this."
    ),
]


#: The API's kind of work: the one `WorkKind` enum (the page's menu sends an empty value for "any" instead).
WorkKindFilter = Annotated[WorkKind | None, Query(description="Only work of this kind.")]


SortBy = Annotated[str, Query(pattern="^(|" + "|".join(SORT_LABELS) + ")$", description="What the queue is sorted by.")]
Order = Annotated[str, Query(pattern="^(|asc|desc)$", description="asc (the default) or desc.")]
PageNumber = Annotated[int, Query(ge=1, le=1_000_000, description="The number of the page the cursor starts.")]
Opened = Annotated[str, Query(max_length=64, pattern=f"^$|{TASK_ID_PATTERN}", description="The item opened in place.")]


@pages.get("/inbox", response_class=HTMLResponse)
def inbox_page(
    request: Request,
    ctx: Ctx,
    session: PageSession,
    kind: KindFilter = None,
    workflow: WorkflowFilter = None,
    older_than: OlderThan = None,
    q: Search = None,
    sort: SortBy = "",
    order: Order = "",
    cursor: Cursor = None,
    page: PageNumber = 1,
    open: Opened = "",
    format: Format = None,
) -> Response:
    """Every task waiting on a trigger this person may fire, one row each, in the order asked (nearest deadline
    first by default), a page at a time; the ones waiting on roles they lack are only counted. `open` draws one
    item's full card in place, with its buttons, each of which comes back here to the next item. `format=csv`
    downloads every row the same filters, sort and search select."""
    if format == CSV_FORMAT:
        lines = queue_csv(
            ctx.engine,
            session.principal,
            kind=kind,
            workflow=workflow,
            older_than=older_than,
            q=q,
            sort=sort or "deadline",
            descending=order == "desc",
        )
        return csv_response(lines, "work")
    queue = work_queue(
        ctx.engine,
        session.principal,
        kind=kind,
        workflow=workflow,
        older_than=older_than,
        q=q,
        sort=sort or "deadline",
        descending=order == "desc",
        cursor=cursor,
        page=page if cursor else 1,
        opened=open or None,
    )
    chosen = {
        "kind": kind or "",
        "workflow": workflow or "",
        "older_than": older_than or "",
        "q": q or "",
        "sort": sort,
        "order": order,
    }
    here: dict[str, str] = {**chosen, "cursor": cursor or "", "page": str(page) if cursor else ""}
    after_opened = queue.after(open) if open else None
    return render(
        request,
        "inbox.html",
        session=session,
        queue=queue,
        chosen=chosen,
        workflows=workflow_names(ctx.engine, session.principal.caller),
        first=list_link("/inbox", chosen) if cursor else None,
        next=list_link("/inbox", {**chosen, "page": queue.page + 1}, queue.next_cursor) if queue.next_cursor else None,
        here=list_link("/inbox", here, cursor),
        link=lambda **changed: list_link("/inbox", {**here, **changed}, cursor or None),
        sorted_by=lambda column: list_link(
            "/inbox", {**chosen, "sort": column, "order": "desc" if sort == column and order != "desc" else ""}
        ),
        download=list_link("/inbox", {**chosen, "format": CSV_FORMAT}),
        then=list_link("/inbox", {**here, "open": after_opened or ""}, cursor) + ("#opened" if after_opened else ""),
    )


@pages.get("/tasks", response_class=HTMLResponse)
def tasks_page(
    request: Request,
    ctx: Ctx,
    session: PageSession,
    workflow: WorkflowFilter = None,
    state: State = None,
    status: StatusFilter = None,
    started_by: StartedBy = None,
    created_from: CreatedFrom = None,
    created_to: CreatedTo = None,
    q: Search = None,
    cursor: Cursor = None,
    format: Format = None,
) -> Response:
    where = TaskFilter(workflow, state, status, started_by, created_from, created_to, q, cursor, PAGE_SIZE)
    if format == CSV_FORMAT:
        return csv_response(tasks_csv(ctx.engine, where, session.principal), "tasks")
    found = list_tasks(ctx.engine, where, session.principal.caller)
    chosen = {k: v or "" for k, v in asdict(where).items() if k not in ("cursor", "limit")}
    return render(
        request,
        "tasks.html",
        session=session,
        found=found,
        workflows=workflow_names(ctx.engine, session.principal.caller),
        states=public_states(ctx.engine.registry),
        statuses=[str(s) for s in Status],
        chosen=chosen,
        first=list_link("/tasks", chosen) if cursor else None,
        next=next_link("/tasks", chosen, found.next_cursor),
        download=list_link("/tasks", {**chosen, "format": CSV_FORMAT}),
    )


@pages.get("/workflows/{name}", response_class=HTMLResponse)
def workflow_page_view(request: Request, name: str, ctx: Ctx, session: PageSession) -> Response:
    caller = session.principal.caller
    if name not in workflow_names(ctx.engine, caller):
        # Unknown, or not theirs to read: the same words either way (what they may not read is absent).
        raise Refused(f"no workflow named {name!r} that you may read", code=Code.WORKFLOW_UNKNOWN, workflow=name)
    page = workflow_page(ctx.engine, name, caller, datetime.now(UTC))
    return render(request, "workflow.html", session=session, page=page)


@pages.get("/webhooks", response_class=HTMLResponse)
def webhooks_view(
    request: Request,
    ctx: Ctx,
    session: PageSession,
    status: Annotated[str, Query(max_length=20)] = "",
    subscription: Annotated[str, Query(max_length=64, pattern=TEXT_PATTERN)] = "",
    format: Format = None,
) -> Response:
    """The install's webhook subscriptions and newest deliveries (`engine.api.webhooks_page`); with
    `format=csv`, the deliveries listed as a CSV file."""
    if format == CSV_FORMAT:
        lines = deliveries_csv(ctx.engine, session.principal, status=status, subscription=subscription)
        return csv_response(lines, "webhook-deliveries")
    page = webhooks_page(ctx.engine, session.principal, status=status, subscription=subscription)
    download = list_link("/webhooks", {"status": status, "subscription": subscription, "format": CSV_FORMAT})
    return render(request, "webhooks.html", session=session, page=page, statuses=WEBHOOK_STATUSES, download=download)


@pages.post("/webhooks/replay")
def webhooks_replay(
    ctx: Ctx,
    session: PagePost,
    message: Annotated[list[str], Form(max_length=64)] = [],  # noqa: B006  (FastAPI reads the default, never mutates it)
) -> Response:
    """Send the chosen deliveries again: back to the page, whose flash says how many."""
    n = len(message)
    with flashed(session, f"{n} {'delivery' if n == 1 else 'deliveries'} to send again."):
        send_again(ctx.engine, session.principal, message)  # every id known, or none is sent again
    return RedirectResponse("/webhooks", status_code=303)


@pages.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page_view(
    request: Request,
    task_id: TaskId,
    ctx: Ctx,
    session: PageSession,
    internal: Annotated[bool, Query(description="Draw internal states (`~force`, `~handoff`) apart.")] = False,
) -> Response:
    require_visible(ctx.engine, task_id, session.principal.caller)
    page = task_page(ctx.engine, task_id, session.principal, internal=internal)
    return render(request, "task.html", session=session, page=page)


@pages.post("/tasks/{task_id}/approve")
def approve_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    digest: Annotated[str, Form(max_length=64)] = "",
    comment: Annotated[str, Form(max_length=2000)] = "",
    seq: Seq = None,
    then: Then = "",
) -> Response:
    with flashed(session, "Your decision (approved) is recorded.") as outcome:
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        pre = precondition(None, seq)
        with acting_on(ctx.engine, task_id, pre):
            ctx.engine.approve(
                task_id,
                actor=session.principal.actor,
                prepared_digest=digest or None,
                comment=comment,
                expected_seq=pre.expected_seq,
            )
    return decided(task_id, outcome, then)


@pages.post("/tasks/{task_id}/reject")
def reject_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    reason: Annotated[str, Form(min_length=1, max_length=2000)],
    seq: Seq = None,
    then: Then = "",
) -> Response:
    with flashed(session, "Your decision (rejected) is recorded.") as outcome:
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        pre = precondition(None, seq)
        with acting_on(ctx.engine, task_id, pre):
            ctx.engine.reject(task_id, actor=session.principal.actor, reason=reason, expected_seq=pre.expected_seq)
    return decided(task_id, outcome, then)


@pages.post("/tasks/{task_id}/redrive")
def redrive_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    to_state: Annotated[str, Form(pattern=STATE_PATTERN)],
    reason: Annotated[str, Form(min_length=1, max_length=500)],
    seq: Seq = None,
    then: Then = "",
) -> Response:
    """Send a handed-off or limit-state task back to a state it was in (the engine checks the role and that no
    write would run twice)."""
    with flashed(session, f"Sent back to {to_state}: the redrive is recorded.") as outcome:
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        pre = precondition(None, seq)
        with acting_on(ctx.engine, task_id, pre):
            ctx.engine.redrive(
                task_id, to_state, actor=session.principal.actor, reason=reason, expected_seq=pre.expected_seq
            )
    return decided(task_id, outcome, then)


@pages.post("/tasks/{task_id}/note")
def note_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    text: Annotated[str, Form(max_length=2000)] = "",
    then: Then = "",
) -> Response:
    """Add a note from the task page: back to the page, whose timeline shows it."""
    with flashed(session, "Your note is recorded."):
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        ctx.engine.note(task_id, session.principal.actor, text)
    return RedirectResponse(safe_next(then) if then else f"/tasks/{task_id}", status_code=303)


@pages.post("/tasks/{task_id}/claim")
def claim_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    take_over: Annotated[str, Form(max_length=500)] = "",
    then: Then = "",
) -> Response:
    """Claim the item (or take it over, with a reason): back to where the form was, which shows who has it now;
    when someone else won, the flash says who (WORK_CLAIMED)."""
    with flashed(session, "You are on it: the others see that you have it."):
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        ctx.engine.claim_work(task_id, session.principal.actor, take_over=take_over.strip() or None)
    return RedirectResponse(safe_next(then) if then else f"/tasks/{task_id}", status_code=303)


@pages.post("/tasks/{task_id}/release")
def release_page(task_id: TaskId, ctx: Ctx, session: PagePost, then: Then = "") -> Response:
    with flashed(session, "You are off it: anyone may take it."):
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        ctx.engine.release_work(task_id, session.principal.actor)
    return RedirectResponse(safe_next(then) if then else f"/tasks/{task_id}", status_code=303)


#: What a bulk decision may be, and how many rows one may decide.
BULK_DECISIONS = ("approve", "reject", "retry", "cancel")
BULK_MAX = 100
_PICK = re.compile(rf"^({TASK_ID_PATTERN[1:-1]}):([1-9][0-9]{{0,9}}):([0-9a-f]{{64}})?$")


async def picked_rows(request: Request) -> list[str]:
    """The rows a bulk form selected (`pick`, once per row: task id, seq and digest as the page showed them)."""
    return [v for k, v in (await request.form()).multi_items() if k == "pick" and isinstance(v, str)]


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What one selected row came to: done, or refused with its code and why."""

    task_id: str
    seq: str
    done: bool
    code: str | None
    message: str


def bulk_one(engine: Engine, actor: str, caller: Caller, decision: str, pick: str, reason: str) -> BulkResult:
    """Decide one row on the seq (and, to approve, the digest) the page showed it at: a row that moved since is
    refused (CONCURRENCY_CONFLICT, naming where it is now), never applied to what the person did not see."""
    found = _PICK.match(pick)
    if found is None:
        return BulkResult(pick[:40], "", False, str(Code.PAYLOAD_INVALID), "not a row of the queue")
    task_id, seq_text, digest = found.group(1), found.group(2), found.group(3)
    pre = precondition(None, int(seq_text))
    try:
        require_visible(engine, task_id, caller)
        with acting_on(engine, task_id, pre):
            if decision == "approve":
                engine.approve(
                    task_id, actor, digest or None, reason or "Approved in bulk.", expected_seq=pre.expected_seq
                )
            elif decision == "reject":
                engine.reject(task_id, actor, reason, expected_seq=pre.expected_seq)
            elif decision == "cancel":
                engine.cancel(task_id, actor, reason, expected_seq=pre.expected_seq)
            else:
                task = engine.load(task_id)
                retries = [t for t in engine.definition_of(task).triggers(task.state) if t.startswith("retry")]
                if len(retries) != 1:
                    raise Refused(
                        f"task {task_id} in {task.state!r} has no one retry to fire", code=Code.TRIGGER_NOT_ALLOWED
                    )
                engine.fire(task_id, retries[0], {}, actor=actor, expected_seq=pre.expected_seq)
    except RailyardError as error:
        if status_for(error) >= 500:
            raise
        return BulkResult(task_id, seq_text, False, str(error.code), error.message)
    return BulkResult(task_id, seq_text, True, None, f"{decision}: done")


@pages.post("/inbox/bulk", response_class=HTMLResponse)
def bulk_page(
    request: Request,
    ctx: Ctx,
    session: PagePost,
    picks: Annotated[list[str], Depends(picked_rows)],
    decision: Annotated[str, Form(pattern="^(" + "|".join(BULK_DECISIONS) + ")$")],
    reason: Annotated[str, Form(max_length=2000)] = "",
    then: Then = "",
) -> Response:
    """Approve, reject, retry or cancel the selected rows, each on its own seq (and digest), one at a time; the
    answer is the result of each row. A reload sends the same seqs again, which have moved: every row is refused,
    none decided twice."""
    require_writer(session.principal)
    if not picks or len(picks) > BULK_MAX:
        raise Refused(f"select between 1 and {BULK_MAX} rows", code=Code.PAYLOAD_INVALID, selected=len(picks))
    if decision in ("reject", "cancel") and not reason.strip():
        raise Refused(f"to {decision}, say why (the reason is recorded with each)", code=Code.PAYLOAD_INVALID)
    caller = session.principal.caller
    results = [bulk_one(ctx.engine, session.principal.actor, caller, decision, p, reason.strip()) for p in picks]
    return render(request, "bulk.html", session=session, decision=decision, results=results, back=safe_next(then))


async def trigger_form(request: Request) -> dict[str, str]:
    """The posted form's text fields (the page's CSRF check has read and cached it already)."""
    return {k: v for k, v in (await request.form()).items() if isinstance(v, str)}


@pages.post("/tasks/{task_id}/fire")
def fire_page(
    task_id: TaskId,
    ctx: Ctx,
    session: PagePost,
    form: Annotated[dict[str, str], Depends(trigger_form)],
    trigger: Annotated[str, Form(pattern=NAME_PATTERN)],
    seq: Seq = None,
    then: Then = "",
) -> Response:
    """Any human trigger the state allows but an approval's decisions (those post to /approve and /reject, with
    the digest shown): its payload is the form's `arg.*` fields, typed by the action's model."""
    with flashed(session, f"Done: {trigger.replace('_', ' ')} is recorded.") as outcome:
        require_writer(session.principal)
        require_visible(ctx.engine, task_id, session.principal.caller)
        if trigger in DECISIONS and awaits_approval(ctx.engine, task_id):
            raise Refused(
                f"{trigger!r} is an approval decision: use its own form", code=Code.TRIGGER_NOT_ALLOWED, trigger=trigger
            )
        task = ctx.engine.load(task_id)
        definition = ctx.engine.definition_of(task)
        candidates = definition.candidates(task.state, trigger)
        payload = payload_from_form(candidates[0].args if candidates else None, form)
        pre = precondition(None, seq)
        with acting_on(ctx.engine, task_id, pre):
            ctx.engine.fire(task_id, trigger, payload, actor=session.principal.actor, expected_seq=pre.expected_seq)
    return decided(task_id, outcome, then)
