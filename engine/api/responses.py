"""The responses each route declares in the OpenAPI document: the errors (all share one body), and the ETag."""

from __future__ import annotations

from typing import Any

from engine.api.schemas import ErrorBody

_WHY = {
    401: "No bearer token, or one this server does not know (ACTOR_REQUIRED).",
    403: "The token may not do this: read-only (auditor), or a role the transition needs (FORBIDDEN, "
    "APPROVAL_FORBIDDEN).",
    404: "No such task, workflow or version (TASK_NOT_FOUND, WORKFLOW_UNKNOWN, VERSION_UNKNOWN).",
    409: "The task is not where this needs it (TASK_TERMINAL, TRIGGER_NOT_ALLOWED, TASK_NOT_AWAITING_APPROVAL), "
    "moved past the body's expected_seq or meanwhile (CONCURRENCY_CONFLICT), the approved call changed "
    "(APPROVAL_STALE), or is pinned to a version this server does not run (DEFINITION_MISSING, "
    "DEFINITION_CHANGED).",
    412: "If-Match named a seq the task is no longer at (CONCURRENCY_CONFLICT; details.state and details.actual "
    "say where it is now). Nothing was written.",
    413: "The request body is larger than the server's limit (PAYLOAD_INVALID; details.limit); it was not read.",
    422: "The request or its payload is invalid (PAYLOAD_INVALID, DOMAIN_INVALID, IDENTITY_OVERRIDE).",
}

ETAG_HEADER = {
    "ETag": {
        "description": 'The task\'s seq as a strong entity tag, e.g. "7": send it back as If-Match.',
        "schema": {"type": "string", "pattern": '^"[1-9][0-9]*"$'},
    }
}


def errors(*statuses: int, tagged: int | None = None) -> dict[int | str, dict[str, Any]]:
    """The error responses of a route; `tagged`: its success status, whose response carries the task's ETag."""
    out: dict[int | str, dict[str, Any]] = {
        status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses
    }
    if tagged is not None:
        out[tagged] = {"headers": ETAG_HEADER}
    return out
