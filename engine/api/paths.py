"""The path parameters routes share, each read once for every route that takes it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path

from engine.api.auth import Ctx
from engine.api.schemas import TASK_ID_PATTERN


def task_id_of(
    task_id: Annotated[str, Path(pattern=TASK_ID_PATTERN, description="Task id, or its first 8 characters or more.")],
    ctx: Ctx,
) -> str:
    """The id of the task a path names, by its whole id or a unique prefix of it (`engine.runtime.task_ids`):
    409 TASK_ID_AMBIGUOUS when the prefix starts two tasks' ids; a prefix of none is the route's TASK_NOT_FOUND."""
    return ctx.engine.resolve_task_id(task_id)


#: A route's `task_id` path parameter, resolved: what the handler gets is a whole task id (or one of no task).
TaskId = Annotated[str, Depends(task_id_of)]
