"""Human commands act on the state the human saw: ETags on task reads, If-Match (or `expected_seq`) on commands.

Every response whose body is a task carries `ETag: "<seq>"`, the task's seq as
a strong entity tag. A command (signal, cancel, approve, reject, settle) sent
with `If-Match: "<seq>"` is applied only if the task still stands at that seq:
the engine checks it when it decides and again when it appends, and a task
that moved meanwhile is refused with 412 (code CONCURRENCY_CONFLICT) and
nothing is written. Without the header, a body `expected_seq` does the same
with 409; with neither, the command is decided on the state read when it runs,
and a write that lands between that read and the append is still a 409.
`If-Match: *` is "any seq": no precondition.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, Response

from engine.api.http_errors import PreconditionFailed
from engine.api.schemas import MAX_SEQ
from engine.core.errors import Code, ConcurrencyConflict, RailyardError, Refused
from engine.runtime.engine import Engine, TaskView

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


def task_body(response: Response, view: TaskView) -> dict[str, Any]:
    """The task as the response body, with its ETag on the response."""
    response.headers["ETag"] = etag(view.seq)
    return view.to_dict()


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
