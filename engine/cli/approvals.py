"""The commands over human decisions: what waits for one, approve, reject."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from engine.cli import render
from engine.cli.exits import open_engine
from engine.cli.options import ActorOpt, ExpectedSeq, JsonFlag, ReaderOpt, ReasonOpt, TaskId
from engine.cli.tasks import act

if TYPE_CHECKING:  # the runtime is imported when a command runs, not for `railyard --help`
    from engine.runtime.engine import Engine


def approvals(
    role: Annotated[str | None, typer.Option("--role", help="Only decisions this role may take.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Show each task id and digest whole as well.")] = False,
    reader: ReaderOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Tasks waiting for a human decision, with the prepared call each one would approve.

    The table names each task and digest by its first 8 and 12 characters, which `approve` and the other commands
    take as they are; --wide adds them whole, --json gives them whole."""
    from engine.runtime import queries

    with open_engine() as engine:
        caller = engine.caller(reader) if reader is not None else None
        pending, _ = queries.approvals(engine, caller, role=role)
    render.approvals(pending, as_json, wide)


def approve(
    task_id: TaskId,
    actor: ActorOpt,
    digest: Annotated[
        str | None,
        typer.Option(
            "--digest",
            help="Digest of the prepared call you reviewed, or its first 12 or more characters (railyard approvals).",
        ),
    ] = None,
    comment: Annotated[str, typer.Option("--comment", help="Recorded with the decision.")] = "",
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve the prepared call a task is waiting on. Without --digest, the one shown now is approved."""

    def decide_now(engine: Engine, task_id: str) -> Any:
        named, seen, prepared = digest, expected_seq, None
        if named is None:
            task = engine.load(task_id)
            prepared = task.prepared
            named = prepared["digest"] if prepared else None
            # Approving what was just shown: decided on that seq, so nothing that changed since is approved.
            seen = task.seq if seen is None else seen
        decided = engine.approve(task_id, actor=actor, prepared_digest=named, comment=comment, expected_seq=seen)
        if prepared:  # said once it is done: a refusal is the only line a refused approval prints
            render.approved(prepared)
        return decided

    act(task_id, decide_now, as_json, actor)


def reject(
    task_id: TaskId,
    actor: ActorOpt,
    reason: ReasonOpt,
    expected_seq: ExpectedSeq = None,
    as_json: JsonFlag = False,
) -> None:
    """Reject the decision a task is waiting on."""
    act(task_id, lambda e, t: e.reject(t, actor=actor, reason=reason, expected_seq=expected_seq), as_json, actor)
