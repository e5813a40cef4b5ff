"""Task ids typed short: the one place a prefix becomes the id it names.

A task id is a UUID, 36 characters that wrap in a narrow terminal and are tiresome to copy. Every interface
that takes a task id (the CLI's arguments, the API's paths, the pages' search) accepts its first
`TASK_ID_PREFIX` characters or more, as long as they name one task: two tasks that start with them are
TASK_ID_AMBIGUOUS (naming both), none leaves the text as typed, for the caller's TASK_NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.errors import Code, Refused
from engine.store import Store

#: The fewest characters of a task id that name it (what tables show): 32 bits of a UUID4, and one dash short of
#: the first group, so that a prefix reads the same as the id's start.
TASK_ID_PREFIX = 8
#: A whole task id (a UUID): looked up as it is, never as a prefix.
TASK_ID_LENGTH = 36


def resolve_task_id(
    store: Store, text: str, workflows: Sequence[str] | None = None, tenants: Sequence[str] | None = None
) -> str:
    """The id of the one task whose id is `text` or starts with it (`TASK_ID_PREFIX` characters or more).

    `text` as given when it is shorter than a prefix, as long as a whole id, or names no task: the caller's own
    look-up then refuses it as TASK_NOT_FOUND. TASK_ID_AMBIGUOUS when it starts two tasks' ids (and is neither).
    `workflows`, `tenants`: only tasks of these count (what the caller may read: a task they may not see neither
    makes a prefix ambiguous nor is named to them).
    """
    if not isinstance(text, str) or len(text) < TASK_ID_PREFIX or len(text) >= TASK_ID_LENGTH:
        return text
    # A whole id sorts before those it starts.
    found = store.task_ids_starting(text, limit=2, workflows=workflows, tenants=tenants)
    if not found or text in found:
        return text
    if len(found) == 1:
        return found[0]
    raise Refused(
        f"task id {text!r} is the start of more than one task's id ({found[0]}, {found[1]}): give more of it",
        code=Code.TASK_ID_AMBIGUOUS,
        task_id=text,
        matches=found,
    )
