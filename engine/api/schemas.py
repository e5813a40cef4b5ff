"""What crosses the wire: the request and response bodies, the one error body, and the HTTP status of every code.

The OpenAPI document is generated from the models here. Request bodies forbid
unknown fields: an `actor` (or any identity) in a body is refused, because the
actor is always the bearer token's. JSON values are checked to be finite
numbers so nothing the JSON parser let through can break the canonical encoding
of an event later.

Clients branch on an error's `code`, never on the status or the message; the
status only tells generic HTTP machinery (proxies, retry policies) what kind of
answer it is. `STATUS_BY_CODE` is total over `Code` (a test checks), so a new
code cannot reach a caller as an unmapped 500.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.core.access import TENANT_NAME
from engine.core.definition import StateKind
from engine.core.errors import Code, RailyardError

#: Workflow and trigger names (as `engine.definition` requires); states may also be generated (`S~force`).
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
TENANT_PATTERN = TENANT_NAME.pattern
STATE_PATTERN = r"^[a-z][a-z0-9_~]{0,127}$"
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
MAX_TEXT = 2000


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite")
    if isinstance(value, dict):
        for v in value.values():
            _finite(v)
    elif isinstance(value, list):
        for v in value:
            _finite(v)
    return value


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartRequest(_Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "workflow": "refund",
                    "input": {"customer_id": "C-100", "order_id": "O-1001", "message": "It arrived broken."},
                }
            ]
        },
    )
    workflow: str = Field(pattern=NAME_PATTERN, description="Workflow name.")
    version: int | None = Field(default=None, ge=1, le=2**31 - 1, description="Version; the newest if omitted.")
    input: dict[str, Any] | None = Field(default=None, description="The task input, checked against the workflow's.")
    tenant: str | None = Field(
        default=None,
        pattern=TENANT_PATTERN,
        description="The tenant the task is for: one of the token's tenants, required when it has several; a token "
        "confined to none may name any, or none.",
    )

    @field_validator("input")
    @classmethod
    def _finite_input(cls, value: Any) -> Any:
        return _finite(value)


MAX_SEQ = 2**31 - 1


def _expected_seq() -> Any:
    return Field(
        default=None,
        ge=1,
        le=MAX_SEQ,
        description="Refuse (409) unless the task is at this seq; the If-Match header does the same with 412.",
    )


class SignalRequest(_Request):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"trigger": "retry_refund", "payload": {}, "expected_seq": 9}]}
    )
    trigger: str = Field(pattern=NAME_PATTERN, description="A trigger the task's current state allows.")
    payload: dict[str, Any] | None = Field(default=None, description="The trigger's arguments.")
    expected_seq: int | None = _expected_seq()

    @field_validator("payload")
    @classmethod
    def _finite_payload(cls, value: Any) -> Any:
        return _finite(value)


class CancelRequest(_Request):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "The customer withdrew."}]})
    reason: str = Field(min_length=1, max_length=500, description="Why; recorded in the log.")
    expected_seq: int | None = _expected_seq()


class NoteRequest(_Request):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"text": "Customer called: the photo is in the ticket too."}]}
    )
    text: str = Field(
        max_length=2000,
        description="The note, for colleagues: recorded in the log as a `comment` event and shown in the timeline; "
        "sent to the model only when the workflow says so. Empty once trimmed: 422 PAYLOAD_INVALID.",
    )


class ClaimRequest(_Request):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{}, {"take_over": "Dana is out today; I take her refunds."}]}
    )
    take_over: str | None = Field(
        default=None,
        min_length=1,
        max_length=500,
        description="Why you take the item over from whoever is on it (without it, their claim is refused with "
        "WORK_CLAIMED, naming them).",
    )


class ClaimBody(BaseModel):
    """Who is on a work item: a claim lasts until `expires_at` and only while the task stays at `seq`."""

    task_id: str
    actor: str
    seq: int = Field(description="The seq the task stood at when claimed: a decision (any move) ends the claim.")
    claimed_at: DateTime
    expires_at: DateTime
    taken_from: str | None = Field(description="Whom it was taken over from (null: nobody held it).")
    reason: str | None = Field(description="Why it was taken over (null: not a take-over).")


class ApproveRequest(_Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"digest": "0c99c2817f45c22a" * 4, "comment": "Photo checked.", "expected_seq": 8}]
        },
    )
    digest: str | None = Field(
        max_length=64,
        description="The digest of the prepared call the approver reviewed (null only if the task has none).",
    )
    comment: str = Field(default="", max_length=MAX_TEXT, description="Recorded with the decision.")
    expected_seq: int | None = _expected_seq()


class RejectRequest(_Request):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "Outside the return window."}]}
    )
    reason: str = Field(min_length=1, max_length=MAX_TEXT, description="Why; recorded with the decision.")
    expected_seq: int | None = _expected_seq()


class SettleRequest(_Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"outcome": "not_executed", "evidence": "PSP dashboard: no refund R-17"}]},
    )
    outcome: Literal["executed", "not_executed"] = Field(
        description="What the operator established happened to the unsettled write call."
    )
    evidence: str = Field(
        min_length=1,
        max_length=500,
        description="What the assertion rests on (the provider's record, a ticket); recorded.",
    )
    expected_seq: int | None = _expected_seq()


class ForkRequest(_Request):
    at_seq: int = Field(ge=1, le=MAX_SEQ, description="The seq of the source's event the fork starts after.")
    reason: str = Field(min_length=1, max_length=500, description="Why; recorded in the fork's first event.")
    version: int | None = Field(
        default=None, ge=1, le=MAX_SEQ, description="The version it runs on; the newest if omitted."
    )


class RedriveRequest(_Request):
    to_state: str = Field(pattern=STATE_PATTERN, description="An agent or tool state the task was in before.")
    reason: str = Field(min_length=1, max_length=500, description="Why; recorded in the log.")
    expected_seq: int | None = _expected_seq()


#: A time as the API writes it: ISO 8601 in UTC (`2026-12-01T06:23:18.123456Z`), kept as the text the log holds
#: (an event's `at` is hashed as written), declared `format: date-time` for clients.
DateTime = Annotated[str, Field(json_schema_extra={"format": "date-time"}, examples=["2026-12-01T06:23:18.123456Z"])]
#: What a state is, and what a task's status is: the same closed sets as `engine.StateKind` and `engine.Status`.
StateKindName = StateKind
StatusName = Literal["runnable", "blocked", "terminal"]


class WorkKind(StrEnum):
    """Why a task waits on a person, as the work queue groups it: one enum wherever a kind of work is named (a work
    item, a count, the `kind` filter), so a generated client has one type for it."""

    APPROVAL = "approval"
    HANDOFF = "handoff"
    FAILURE = "failure"
    LIMIT = "limit"
    CANCEL_REVIEW = "cancel_review"
    WAIT = "wait"


WorkKindName = WorkKind


class ToolKind(StrEnum):
    """Whether a prepared call only reads, or changes something outside (a write: approved, run once)."""

    READ = "read"
    WRITE = "write"


class PreparedCallBody(BaseModel):
    """A prepared tool call: exactly what will run, sealed by its digest, which an approval names."""

    task_id: str
    action_id: str = Field(description="The idempotency key: the same for every attempt of this call.")
    tool: str
    kind: ToolKind
    arguments: dict[str, Any] = Field(description="The normalised arguments.")
    catalog: str
    catalog_digest: str
    policy_version: str
    required_role: str | None = Field(description="The role an approver of this call needs.")
    digest: str = Field(description="What `POST /api/tasks/{id}/approve` names: the sha256 of the call.")


class ErrorBody(BaseModel):
    """Every refusal's body: branch on `code`. Each operation's responses narrow `code` to the codes it can give
    at that status (`refusals`). (A path or method the API does not have answers `code: null`; it is no
    operation's.)"""

    code: Code = Field(description="A stable code from engine.Code.")
    message: str = Field(description="For people; never branch on it.")
    details: dict[str, Any] = Field(description="What the code is about (the state now, the seq, the role...).")


class CancelRequested(BaseModel):
    actor: str
    reason: str
    seq: int = Field(description="The event that recorded the request.")
    at: DateTime


class Unsettled(BaseModel):
    action_id: str
    tool: str
    state: str
    status: Literal["pending", "unknown", "running"] = Field(
        description="pending: the call is in flight (or the child is being started); unknown: it ended without a "
        "known outcome (settle it); running: a child task the parent waits for (its cancel waits for the child's end)."
    )


class QuotaPlace(BaseModel):
    """A task's place in the queue for a quota every worker shares. Waiting is not an event: nothing happened to
    the task, and it holds no lease meanwhile."""

    quota: str = Field(description="The quota: `provider:model`, and `#key` when kept per API key.")
    position: int = Field(description="How many are served before it (0: it is next).")
    waiting: int = Field(description="How many tasks wait for this quota.")
    priority: int
    since: DateTime
    looks_again_at: DateTime


class ParentBody(BaseModel):
    task_id: str = Field(description="The parent task, which started this one from a child state.")
    seq: int = Field(description="The seq of the parent's `spawn` event: the intent this task fulfils.")
    action_id: str
    workflow: str = Field(description="The parent's name@version.")
    state: str = Field(description="The parent's child state, which waits for this task's end.")


class ChildEnd(BaseModel):
    state: str | None = Field(description="The terminal state the child ended in, as the parent recorded it.")
    result: dict[str, Any] | None = Field(description="The typed result the parent read from the child.")


class ChildBody(BaseModel):
    task_id: str
    workflow: str | None = Field(description="The name@version the child is pinned to.")
    state_of_parent: str | None = Field(description="The parent's child state that started it.")
    spawn_seq: int = Field(description="The seq of the parent's intent to start it.")
    state: str | None = Field(description="The child's state now (null: not found).")
    status: StatusName | None = None
    ended: ChildEnd | None = Field(description="Where it ended, once the parent recorded it.")


class TaskBody(BaseModel):
    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    kind: StateKindName
    status: StatusName
    seq: int = Field(description='The ETag of the response is this seq in double quotes ("7").')
    allowed: list[str]
    input: dict[str, Any]
    facts: dict[str, Any]
    cancel_requested: CancelRequested | None = Field(
        default=None,
        description="A cancel recorded while a write tool call is in flight: it takes effect when the call settles.",
    )
    unsettled: Unsettled | None = Field(
        default=None, description="The write tool call whose outcome is not settled, if any."
    )
    tenant: str | None = Field(default=None, description="The tenant the task belongs to (null: none).")
    parent: ParentBody | None = Field(default=None, description="The task that started this one, if one did.")
    children: list[ChildBody] = Field(
        default_factory=list, description="The tasks this one started from its child states, in order."
    )
    prepared: PreparedCallBody | None = Field(
        default=None,
        description="The newest prepared tool call: at an approval, the call to approve; send its `digest` with "
        "the task's `seq` (the ETag) to /approve.",
    )
    next_try_at: DateTime | None = Field(
        default=None,
        description="After a provider error retried later (a `backoff` event): when the next model call is due.",
    )
    waiting_for_quota: QuotaPlace | None = Field(
        default=None,
        description="A worker put its model call off for quota (GET only): which quota and its place in line.",
    )


class TaskSummary(BaseModel):
    task_id: str
    workflow: str
    version: int
    state: str
    status: StatusName
    seq: int
    created_at: DateTime
    updated_at: DateTime
    started_by: str = Field(description="The actor who started the task.")
    fields: dict[str, str] = Field(
        description="The task's searchable input fields (the workflow's `searchable`), e.g. its customer id."
    )


class _Page(BaseModel):
    limit: int = Field(description="The page size this answer used: at most this many items.")
    next_cursor: str | None = Field(
        description="Opaque: pass it as `cursor` (with the same filters) for the next page; null on the last page."
    )
    next: str | None = Field(description="The next page's path and query, ready to GET; null on the last page.")


class TaskPage(_Page):
    tasks: list[TaskSummary] = Field(description="Newest first, by creation time then task id.")


class EventBody(BaseModel):
    task_id: str
    seq: int
    at: DateTime
    actor: str
    from_state: str | None
    trigger: str
    to_state: str
    data: dict[str, Any]
    prev_hash: str
    hash: str


class PendingApproval(BaseModel):
    task_id: str
    workflow: str
    version: int
    state: str
    role: str
    started_by: str
    proposed_by: str | None
    prepared: PreparedCallBody | None
    digest: str | None
    input: dict[str, Any]
    decisions: list[str]


class ApprovalPage(_Page):
    approvals: list[PendingApproval] = Field(description="Oldest first, by creation time then task id.")


class WorkItemBody(BaseModel):
    task_id: str
    workflow: str
    version: int
    state: str
    kind: WorkKindName = Field(description="Why it waits on a person.")
    seq: int = Field(description="The seq to send back (If-Match or expected_seq) with a command.")
    started_by: str
    created_at: DateTime
    waiting_since: DateTime = Field(description="When it came to this state.")
    deadline: DateTime | None = Field(description="Null: no deadline.")
    at_deadline: str | None = Field(description="What happens at the deadline.")
    triggers: list[str] = Field(
        description="The triggers the caller may fire here (the engine checks again): `approve` and `reject` at "
        "/approve and /reject, `redrive` at /redrive, the others at /signal."
    )
    digest: str | None = Field(
        description="The digest of the prepared call awaiting approval, to send with /approve (null: none)."
    )
    asked: str = Field(description="What the caller is asked, in words (the call and its amount, for an approval).")
    fields: dict[str, str] = Field(description="The task's searchable input fields (its customer id, ...).")
    claimed_by: str | None = Field(description="Who is on the item (a live claim; null: nobody).")
    claimed_until: DateTime | None = Field(description="When that claim ends unless renewed (null: no claim).")


class WorkCountBody(BaseModel):
    kind: WorkKindName
    workflow: str
    yours: int = Field(description="Waiting on a trigger the caller may fire.")
    others: int = Field(description="Waiting on roles the caller does not hold (not listed).")


class WorkTotalBody(BaseModel):
    yours: int = Field(description="What the filters select and the caller may act on: every page's items.")
    others: int = Field(
        description="What the filters select that waits on roles the caller does not hold: counted, never listed."
    )


class WorkQueueBody(_Page):
    items: list[WorkItemBody] = Field(
        description="Nearest deadline first (none: last), then oldest, by creation time then task id."
    )
    counts: list[WorkCountBody] = Field(
        description="The tasks the request's filters (kind, workflow, older_than) select, by kind and workflow; "
        "without filters, every task waiting on a person."
    )
    total: WorkTotalBody = Field(description="The counts added up: the filtered set, yours and others.")


class WorkflowVersion(BaseModel):
    version: int
    ref: str
    digest: str
    initial: str
    states: list[str]
    description: str


class WorkflowBody(BaseModel):
    name: str
    newest: int
    versions: list[WorkflowVersion]


class AccessEntry(BaseModel):
    """One change of a person or a database token, as the access trail keeps it (never a password or its hash)."""

    id: int
    at: str
    by: str
    action: str
    subject: str
    details: dict[str, Any]


class AccessTrailPage(BaseModel):
    entries: list[AccessEntry]
    #: The `after` of the next page (None: this page is the last).
    next: int | None


class Step(BaseModel):
    seq: int
    from_state: str
    trigger: str
    to_state: str


class DiagramChild(BaseModel):
    state: str = Field(description="A child state of the workflow.")
    workflow: str = Field(description="The workflow it starts a task of (its page: /workflows/NAME).")
    version: int | None = Field(default=None, description="The version it pins; null: the newest at the start.")


class DiagramBody(BaseModel):
    workflow: str
    version: int
    format: Literal["mermaid"] = "mermaid"
    diagram: str = Field(description="Mermaid state diagram source.")
    current: str | None = Field(default=None, description="The task's state (task diagrams only).")
    path: list[Step] = Field(default_factory=list, description="The transitions the task took, in order.")
    children: list[DiagramChild] = Field(
        default_factory=list, description="The child states drawn, each with the workflow it starts."
    )


class ReplayBody(BaseModel):
    task_id: str
    workflow: str
    version: int
    events: int
    ok: bool
    findings: list[dict[str, Any]]


class WhoAmI(BaseModel):
    actor: str
    roles: list[str]
    read_only: bool
    tenants: list[str] | None = Field(description="The tenants the token is confined to (null: none).")


# -- errors: the status of every code, the error body, the responses each route declares -----------
_STATUS: dict[Code, int] = {
    # The thing named does not exist here.
    Code.TASK_NOT_FOUND: 404,
    Code.WORKFLOW_UNKNOWN: 404,
    Code.VERSION_UNKNOWN: 404,
    # People and database tokens are managed with the CLI, not over HTTP: were one of these ever raised to an HTTP
    # caller, it would say what `railyard users` and `railyard tokens` say.
    Code.USER_NOT_FOUND: 404,
    Code.TOKEN_NOT_FOUND: 404,
    Code.USER_EXISTS: 409,
    # Webhooks are managed with the CLI (`railyard webhooks`); were one of these raised to an HTTP caller.
    Code.WEBHOOK_NOT_FOUND: 404,
    Code.WEBHOOK_KIND_UNKNOWN: 422,
    Code.WEBHOOK_URL_INVALID: 422,
    Code.WEBHOOK_FORMAT_UNKNOWN: 422,
    Code.WEBHOOK_SECRET_INVALID: 422,
    # The request is fine but the task is not where it would have to be (or someone else moved it first).
    Code.CONCURRENCY_CONFLICT: 409,
    Code.LEASE_LOST: 409,
    Code.APPROVAL_STALE: 409,
    Code.DIGEST_AMBIGUOUS: 409,
    Code.TASK_ID_AMBIGUOUS: 409,
    Code.TASK_NOT_AWAITING_APPROVAL: 409,
    Code.TASK_TERMINAL: 409,
    Code.TASK_BUSY: 409,
    Code.WORK_CLAIMED: 409,
    Code.TRIGGER_NOT_ALLOWED: 409,
    Code.STATE_NOT_AGENT: 409,
    # A write's outcome is open: the task waits for it to settle (a retry reconciles, or an operator settles it).
    Code.OUTCOME_UNSETTLED: 409,
    # A child state's code reads what it cannot: the workflow's, not the caller's, mistake.
    Code.CHILD_INPUT_INVALID: 500,
    Code.CHILD_BUDGET_EXCEEDED: 500,
    Code.CHILD_RESULT_INVALID: 500,
    # A task pinned to a version this server's code does not define (or defines differently): a deployment
    # conflict, not a client error; another server that runs that version can answer it.
    Code.DEFINITION_MISSING: 409,
    Code.DEFINITION_CHANGED: 409,
    # The caller is known but may not do this.
    Code.FORBIDDEN: 403,
    Code.APPROVAL_FORBIDDEN: 403,
    Code.TOOL_FORBIDDEN: 403,
    # No actor: a missing or unknown bearer token (or session). Every write names its actor; so does every read here.
    Code.ACTOR_REQUIRED: 401,
    # Too many failed page logins from an address or for an account: try again after Retry-After.
    Code.LOGIN_THROTTLED: 429,
    # A sign-in through OpenID Connect refused (a token of another audience, expired, a wrong state or nonce), or
    # its provider unreachable: the login page says which.
    Code.OIDC_REFUSED: 401,
    Code.OIDC_UNAVAILABLE: 502,
    # The request's content is wrong.
    Code.PAYLOAD_INVALID: 422,
    Code.TENANT_REQUIRED: 422,
    Code.DIGEST_TOO_SHORT: 422,
    Code.DIGEST_INVALID: 422,
    Code.EXPORT_INVALID: 422,
    Code.EVAL_INVALID: 422,
    Code.EVAL_REGRESSION: 422,
    Code.USAGE_INVALID: 422,
    Code.DOMAIN_INVALID: 422,
    Code.IDENTITY_OVERRIDE: 422,
    Code.MIGRATION_INVALID: 422,
    Code.FORK_INVALID: 422,
    Code.REDRIVE_INVALID: 422,
    Code.WRITE_WOULD_REPEAT: 409,
    Code.TOOL_ARGUMENT_INVALID: 422,
    Code.TOOL_NOT_ALLOWED: 422,
    Code.TOOL_NOT_FOUND: 422,
    # Model proposal codes are recorded in events, not raised to HTTP callers; if one ever is, it is bad input.
    Code.NO_ACTION: 422,
    Code.OUTPUT_NOT_JSON: 422,
    Code.OUTPUT_SCHEMA_INVALID: 422,
    Code.ACTION_UNKNOWN: 422,
    Code.ACTION_NOT_ALLOWED: 422,
    Code.MULTIPLE_ACTIONS: 422,
    Code.REPAIRS_EXHAUSTED: 422,
    Code.AGENT_STEP_LIMIT_EXCEEDED: 422,
    # An upstream (model provider, tool remote) failed or is slow.
    Code.TOOL_CHOICE_UNSUPPORTED: 502,
    Code.SCHEMA_UNSUPPORTED: 502,
    Code.CONTEXT_OVERFLOW: 502,
    Code.PROVIDER_AUTH: 502,
    Code.CONTENT_FILTERED: 502,
    Code.TRUNCATED: 502,
    Code.EMPTY_RESPONSE: 502,
    Code.PROVIDER_ERROR: 502,
    Code.TOOL_REMOTE_ERROR: 502,
    Code.TOOL_RESULT_INVALID: 502,
    Code.TOOL_EXECUTION_UNKNOWN: 502,
    Code.RATE_LIMITED: 503,
    Code.PROVIDER_TIMEOUT: 504,
    Code.TOOL_TIMEOUT: 504,
    # The server cannot serve right now: the database failed or has no schema.
    Code.DATABASE_ERROR: 503,
    Code.SCHEMA_MISSING: 503,
    Code.SCHEMA_NOT_AT_HEAD: 503,
    Code.DATABASE_UNREACHABLE: 503,
    Code.DATABASE_NOT_FOUND: 503,
    Code.DATABASE_READ_ONLY: 503,
    # The server is misconfigured, or a log does not hold together: the operator's problem, not the caller's.
    Code.MODEL_NOT_CONFIGURED: 500,
    Code.CONFIG_INVALID: 500,
    Code.DATABASE_URL_INVALID: 500,
    Code.DATABASE_FILE_INVALID: 500,
    Code.UNEXPECTED_ERROR: 500,
    Code.DEFINITION_INVALID: 500,
    Code.INTERNAL_ERROR: 500,
    Code.HASH_MISMATCH: 500,
    Code.SEQ_GAP: 500,
    Code.ILLEGAL_TRANSITION: 500,
    Code.INTENT_UNSETTLED: 500,
    Code.OUTCOME_WITHOUT_INTENT: 500,
    Code.FORK_ORIGIN_MISMATCH: 500,
    Code.FORK_ORIGIN_MISSING: 500,
    Code.CHILD_LINK_MISMATCH: 500,
    Code.CHILD_MISSING: 500,
    Code.CHILD_RESULT_MISMATCH: 500,
    Code.STATE_MISMATCH: 500,
    Code.SNAPSHOT_MISMATCH: 500,
    Code.ARCHIVE_MISSING: 500,
    Code.FIELDS_WITHHELD: 500,
    Code.TASK_MISSING: 500,
    Code.TASK_TRUNCATED: 500,
    Code.HEAD_REWRITTEN: 500,
    Code.CHECKPOINT_INVALID: 500,
    Code.CHECKPOINT_NOT_EXTENDING: 500,
}

#: Code -> HTTP status, for every code (read-only).
STATUS_BY_CODE: Mapping[Code, int] = MappingProxyType(_STATUS)


def status_of(code: Code) -> int:
    return STATUS_BY_CODE.get(code, 500)


class PreconditionFailed(RailyardError):
    """A command sent with `If-Match` found the task at another seq than the ETag named: 412, not the table's
    409 for CONCURRENCY_CONFLICT, because the client's own precondition failed (RFC 9110, 13.1.1). The code is
    the same, so a client that branches on the code needs no new case."""

    status = 412

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message, code=Code.CONCURRENCY_CONFLICT, **details)


def status_for(error: RailyardError) -> int:
    """The HTTP status of a raised error: the table's, except for a failed If-Match precondition."""
    return PreconditionFailed.status if isinstance(error, PreconditionFailed) else status_of(error.code)


#: Codes whose message names the server's own infrastructure (a host, a database user, a path): an HTTP caller gets
#: the code, the operator reads the message in the server log, where the store logged it.
_OPERATOR_ONLY = frozenset(
    {
        Code.DATABASE_URL_INVALID,
        Code.DATABASE_UNREACHABLE,
        Code.DATABASE_NOT_FOUND,
        Code.DATABASE_FILE_INVALID,
        Code.DATABASE_READ_ONLY,
    }
)


def error_body(error: RailyardError) -> dict[str, Any]:
    """`{code, message, details}`, the shape the CLI prints too."""
    body = error.to_dict()
    if error.code in _OPERATOR_ONLY:
        body["message"] = "the server cannot use its database (the server log says why)"
    return body


def validation_body(exc: ValidationError | Any) -> dict[str, Any]:
    """A request that does not match its schema: where and why, never the rejected values (they may be secrets)."""
    raw = exc.errors() if hasattr(exc, "errors") else []
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in raw[:20]
    ]
    return {
        "code": str(Code.PAYLOAD_INVALID),
        "message": "the request does not match its schema",
        "details": {"errors": errors},
    }


#: What each status says, whatever the operation: the first sentence of a response's description in the document.
_MEANING = {
    401: "No bearer token, or one this server does not know.",
    403: "The token may not do this.",
    404: "What the request names does not exist here.",
    409: "The task is not where this needs it, or it moved meanwhile; nothing was written.",
    412: "If-Match named a seq the task is no longer at (details.state and details.actual say where it is now); "
    "nothing was written.",
    413: "The request body is larger than the server reads (details.limit); it was not read.",
    422: "The request, or what it carries, is invalid (details.errors says where, never the rejected values).",
    500: "A stored log does not hold together, or the server failed (its log says more).",
    503: "The database failed or has no schema.",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """A code answered with another status than `STATUS_BY_CODE` gives it: a failed If-Match, a body too large."""

    status: int
    code: Code


#: `CONCURRENCY_CONFLICT` for a command whose If-Match named another seq (`PreconditionFailed`), and
#: `PAYLOAD_INVALID` for a body over the limit (`app.RequestLimits`, before the body is read).
IF_MATCH_FAILED = Answer(412, Code.CONCURRENCY_CONFLICT)
BODY_TOO_LARGE = Answer(413, Code.PAYLOAD_INVALID)

Refusal = Code | Answer

ETAG_HEADER = {
    "ETag": {
        "description": 'The task\'s seq as a strong entity tag, e.g. "7": send it back as If-Match.',
        "schema": {"type": "string", "pattern": '^"[1-9][0-9]*"$'},
    }
}


def _answers(refusals: Iterable[Refusal | Iterable[Refusal]]) -> dict[int, list[Code]]:
    """The codes by status, each once, in the order declared (groups flattened)."""
    by_status: dict[int, list[Code]] = {}
    for item in refusals:
        for one in (item,) if isinstance(item, Code | Answer) else item:
            status, code = (one.status, one.code) if isinstance(one, Answer) else (status_of(one), one)
            codes = by_status.setdefault(status, [])
            if code not in codes:
                codes.append(code)
    return dict(sorted(by_status.items()))


def narrowed(codes: Sequence[Code]) -> dict[str, Any]:
    """What an operation's error body is at one status: an `ErrorBody` (the `$ref` FastAPI adds beside it) whose
    `code` is one of `codes`. OpenAPI 3.1 schemas are JSON Schema 2020-12, where `$ref` and its sibling keywords
    both apply; a generator that reads only the `$ref` still gets the one `ErrorBody` class and the `Code` enum."""
    return {"properties": {"code": {"enum": [str(c) for c in codes]}}}


def refusals(*declared: Refusal | Iterable[Refusal], tagged: int | None = None) -> dict[int | str, dict[str, Any]]:
    """An operation's error responses, from the one list of codes it can answer with: each status those codes
    have (`STATUS_BY_CODE`, or the `Answer`'s), and per status its codes as an enum, the error body's schema, and
    one example per code. `tagged`: the success status, whose response carries the task's ETag."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, codes in _answers(declared).items():
        listed = ", ".join(f"`{c}`" for c in codes)
        examples = {
            str(c): {"summary": c.reference, "value": {"code": str(c), "message": c.reference, "details": {}}}
            for c in codes
        }
        out[status] = {
            "description": f"{_MEANING[status]} Codes: {listed} (each example says what its code means).",
            "model": ErrorBody,
            "content": {"application/json": {"schema": narrowed(codes), "examples": examples}},
        }
    if tagged is not None:
        out[tagged] = {"headers": ETAG_HEADER}
    return out
