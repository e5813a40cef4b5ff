"""The error responses each route declares in the OpenAPI document (all share one body)."""

from __future__ import annotations

from typing import Any

from engine.api.schemas import ErrorBody

_WHY = {
    401: "No bearer token, or one this server does not know (ACTOR_REQUIRED).",
    403: "The token may not do this: read-only (auditor), or a role the transition needs (FORBIDDEN, "
         "APPROVAL_FORBIDDEN).",
    404: "No such task, workflow or version (TASK_NOT_FOUND, WORKFLOW_UNKNOWN, VERSION_UNKNOWN).",
    409: "The task is not where this needs it (TASK_TERMINAL, TRIGGER_NOT_ALLOWED, TASK_NOT_AWAITING_APPROVAL), "
         "moved meanwhile (CONCURRENCY_CONFLICT), the approved call changed (APPROVAL_STALE), or is pinned to a "
         "version this server does not run (DEFINITION_MISSING, DEFINITION_CHANGED).",
    422: "The request or its payload is invalid (PAYLOAD_INVALID, DOMAIN_INVALID, IDENTITY_OVERRIDE).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody, "description": _WHY[status]} for status in statuses}
