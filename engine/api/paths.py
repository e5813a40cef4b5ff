"""The path parameters routes share, each read once for every route that takes it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path

from engine.api.auth import Ctx
from engine.api.schemas import TASK_ID_PATTERN
from engine.core.errors import Code, Refused

#: A task id in a path, as typed: the whole id or its first 8 characters or more.
TaskIdText = Annotated[str, Path(pattern=TASK_ID_PATTERN, description="Task id, or its first 8 characters or more.")]


def task_id_of(task_id: TaskIdText, ctx: Ctx) -> str:
    """The id of the task a page's path names, by its whole id or a unique prefix of it (`engine.runtime.task_ids`):
    409 TASK_ID_AMBIGUOUS when the prefix starts two tasks' ids, without naming them (a page resolves before it
    knows what its person may read; the API's routes resolve among what the caller may read, `routes.visible_task`);
    a prefix of none is the route's TASK_NOT_FOUND."""
    try:
        return ctx.engine.resolve_task_id(task_id)
    except Refused as refusal:
        if refusal.code is not Code.TASK_ID_AMBIGUOUS:
            raise
        raise Refused(
            f"task id {task_id!r} is the start of more than one task's id: give more of it",
            code=Code.TASK_ID_AMBIGUOUS,
            task_id=task_id,
        ) from None


#: A route's `task_id` path parameter, resolved: what the handler gets is a whole task id (or one of no task).
TaskId = Annotated[str, Depends(task_id_of)]
