"""Request and response bodies of the JSON API: the OpenAPI document is generated from these.

Request bodies forbid unknown fields: an `actor` (or any identity) in a body is
refused, because the actor is always the bearer token's. JSON values are
checked to be finite numbers so nothing the JSON parser let through can break
the canonical encoding of an event later.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Workflow and trigger names (as `engine.definition` requires); states may also be generated (`S~force`).
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
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
    workflow: str = Field(pattern=NAME_PATTERN, description="Workflow name.")
    version: int | None = Field(default=None, ge=1, le=2**31 - 1, description="Version; the newest if omitted.")
    input: dict[str, Any] | None = Field(default=None, description="The task input, checked against the workflow's.")

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
    trigger: str = Field(pattern=NAME_PATTERN, description="A trigger the task's current state allows.")
    payload: dict[str, Any] | None = Field(default=None, description="The trigger's arguments.")
    expected_seq: int | None = _expected_seq()

    @field_validator("payload")
    @classmethod
    def _finite_payload(cls, value: Any) -> Any:
        return _finite(value)


class CancelRequest(_Request):
    reason: str = Field(min_length=1, max_length=500, description="Why; recorded in the log.")
    expected_seq: int | None = _expected_seq()


class ApproveRequest(_Request):
    digest: str | None = Field(
        max_length=64,
        description="The digest of the prepared call the approver reviewed (null only if the task has none).",
    )
    comment: str = Field(default="", max_length=MAX_TEXT, description="Recorded with the decision.")
    expected_seq: int | None = _expected_seq()


class RejectRequest(_Request):
    reason: str = Field(min_length=1, max_length=MAX_TEXT, description="Why; recorded with the decision.")
    expected_seq: int | None = _expected_seq()


class SettleRequest(_Request):
    outcome: Literal["executed", "not_executed"] = Field(
        description="What the operator established happened to the unsettled write call."
    )
    evidence: str = Field(
        min_length=1,
        max_length=500,
        description="What the assertion rests on (the provider's record, a ticket); recorded.",
    )
    expected_seq: int | None = _expected_seq()


class ErrorBody(BaseModel):
    code: str | None = Field(description="A stable code from engine.Code (null for an unknown URL or method).")
    message: str
    details: dict[str, Any] = Field(default_factory=dict)


class CancelRequested(BaseModel):
    actor: str
    reason: str
    seq: int = Field(description="The event that recorded the request.")
    at: str


class Unsettled(BaseModel):
    action_id: str
    tool: str
    state: str
    status: Literal["pending", "unknown"] = Field(
        description="pending: the call is in flight; unknown: it ended without a known outcome (settle it)."
    )


class TaskBody(BaseModel):
    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    kind: str
    status: str
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


class TaskSummary(BaseModel):
    task_id: str
    workflow: str
    version: int
    state: str
    status: str
    seq: int
    created_at: str
    updated_at: str


class EventBody(BaseModel):
    task_id: str
    seq: int
    at: str
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
    state: str
    role: str
    started_by: str
    proposed_by: str | None
    prepared: dict[str, Any] | None
    digest: str | None
    input: dict[str, Any]
    decisions: list[str]


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


class Step(BaseModel):
    seq: int
    from_state: str
    trigger: str
    to_state: str


class DiagramBody(BaseModel):
    workflow: str
    version: int
    format: Literal["mermaid"] = "mermaid"
    diagram: str = Field(description="Mermaid state diagram source.")
    current: str | None = Field(default=None, description="The task's state (task diagrams only).")
    path: list[Step] = Field(default_factory=list, description="The transitions the task took, in order.")


class ReplayBody(BaseModel):
    task_id: str
    workflow: str
    events: int
    ok: bool
    findings: list[dict[str, Any]]


class WhoAmI(BaseModel):
    actor: str
    roles: list[str]
    read_only: bool
