"""The one table from refusal codes to HTTP statuses, and the JSON error body every API error uses.

Clients branch on `code`, never on the status or the message; the status only
tells generic HTTP machinery (proxies, retry policies) what kind of answer it
is. The table is total over `Code` (a test checks), so a new code cannot reach
a caller as an unmapped 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from engine.core.errors import Code, RailyardError

_STATUS: dict[Code, int] = {
    # The thing named does not exist here.
    Code.TASK_NOT_FOUND: 404,
    Code.WORKFLOW_UNKNOWN: 404,
    Code.VERSION_UNKNOWN: 404,
    # The request is fine but the task is not where it would have to be (or someone else moved it first).
    Code.CONCURRENCY_CONFLICT: 409,
    Code.LEASE_LOST: 409,
    Code.APPROVAL_STALE: 409,
    Code.TASK_NOT_AWAITING_APPROVAL: 409,
    Code.TASK_TERMINAL: 409,
    Code.TRIGGER_NOT_ALLOWED: 409,
    Code.STATE_NOT_AGENT: 409,
    # A write's outcome is open: the task waits for it to settle (a retry reconciles, or an operator settles it).
    Code.OUTCOME_UNSETTLED: 409,
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
    # The request's content is wrong.
    Code.PAYLOAD_INVALID: 422,
    Code.DOMAIN_INVALID: 422,
    Code.IDENTITY_OVERRIDE: 422,
    Code.MIGRATION_INVALID: 422,
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
    # The server is misconfigured, or a log does not hold together: the operator's problem, not the caller's.
    Code.MODEL_NOT_CONFIGURED: 500,
    Code.CONFIG_INVALID: 500,
    Code.DEFINITION_INVALID: 500,
    Code.INTERNAL_ERROR: 500,
    Code.HASH_MISMATCH: 500,
    Code.SEQ_GAP: 500,
    Code.ILLEGAL_TRANSITION: 500,
    Code.INTENT_UNSETTLED: 500,
    Code.OUTCOME_WITHOUT_INTENT: 500,
    Code.STATE_MISMATCH: 500,
    Code.SNAPSHOT_MISMATCH: 500,
    Code.ARCHIVE_MISSING: 500,
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


def error_body(error: RailyardError) -> dict[str, Any]:
    """`{code, message, details}`, the shape the CLI prints too."""
    return error.to_dict()


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
