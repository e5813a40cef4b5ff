"""The commands that re-run a stretch of a task's path: `fork` (a new task from a seq), `redrive` (back to a state)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import open_engine
from engine.cli.options import ActorOpt, ExpectedSeq, JsonFlag, ReasonOpt, TaskId
from engine.cli.tasks import act


def fork(
    task_id: TaskId,
    at_seq: Annotated[int, typer.Option("--at", min=1, help="The seq of the source's event the fork starts after.")],
    actor: ActorOpt,
    reason: ReasonOpt,
    version: Annotated[
        int | None, typer.Option("--version", help="The version the fork runs on (default: newest).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Start a new task from a task's state as of a seq; prints the new task's id. The source is not changed.

    Refused (WRITE_WOULD_REPEAT) where the fork could make a write a second time: fork after its outcome.
    """
    from engine.runtime import shown

    with open_engine() as engine:
        new_id = engine.fork(engine.resolve_task_id(task_id), at_seq, actor=actor, reason=reason, version=version)
        view = shown.view(engine, engine.load(new_id), engine.caller(actor))
    render.started(view, as_json)


def redrive(
    task_id: TaskId,
    to_state: Annotated[str, typer.Option("--to", help="An agent or tool state the task was in before.")],
    actor: ActorOpt,
    reason: ReasonOpt,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Send a handed-off or limit-state task back to an agent or tool state it visited; its budgets start again.

    The actor needs the workflow's redrive role (else its settle role, else its cancel role).
    """
    act(
        task_id,
        lambda e, t: e.redrive(t, to_state, actor=actor, reason=reason, expected_seq=expected_seq),
        as_json,
        actor,
    )
