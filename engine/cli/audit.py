"""The audit commands: replay logs, export them, verify an export offline, archive ended tasks.

A finding is exit 3, each with a stable code; a clean run is 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine.cli import render
from engine.cli.exits import EXIT_AUDIT, fail, open_engine, registry
from engine.cli.options import JsonFlag, PublicKeys, ReaderOpt, instant
from engine.core.errors import Code, IntegrityError, RailyardError, Refused

#: What `replay` and `export` read: one TASK, or --all of them narrowed by --workflow and --since.
OneTask = Annotated[str | None, typer.Argument(help="Task id, or its first 8 characters or more (or --all).")]
AllTasks = Annotated[bool, typer.Option("--all", help="Every task, streamed.")]
OnlyWorkflow = Annotated[str | None, typer.Option("--workflow", help="With --all: only this workflow.")]
ChangedSince = Annotated[
    str | None, typer.Option("--since", help="With --all: only tasks changed at or after this date (ISO 8601).")
]


def _one_or_all(task_id: str | None, all_tasks: bool, *scoped: tuple[str, object]) -> None:
    """TASK and --all exclude each other; --workflow and --since only narrow --all."""
    if (task_id is None) == (not all_tasks):
        raise typer.BadParameter("give a TASK or --all (not both)")
    for option, value in scoped:
        if task_id is not None and value is not None:
            raise typer.BadParameter(f"{option} goes with --all, not with a TASK", param_hint=option)


def replay(
    task_id: OneTask = None,
    all_tasks: AllTasks = False,
    workflow: OnlyWorkflow = None,
    since: ChangedSince = None,
    jobs: Annotated[
        int, typer.Option("--jobs", min=0, help="Processes that check (0: one per CPU available; 1: this one only).")
    ] = 0,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="With --all: also judge the database against this signed checkpoint."),
    ] = None,
    public_key: PublicKeys | None = None,
    tree: Annotated[
        bool,
        typer.Option("--tree", help="With TASK: also every task it started (child states), and theirs, links checked."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Check task logs without calling any model or tool: hash chain, seq, legal transitions, row and snapshots.

    The links between a parent and its children are checked both ways (CHILD_LINK_MISMATCH, CHILD_MISSING,
    CHILD_RESULT_MISMATCH); --tree replays a task and all its descendants.

    With --checkpoint, also that every task the signed checkpoint lists is still there and still holds, at the
    checkpointed seq, the checkpointed head (TASK_MISSING, TASK_TRUNCATED, HEAD_REWRITTEN, CHECKPOINT_INVALID).
    Exit 3 when anything is found (each finding has a stable code), 0 when the logs prove their state.
    """
    from engine.audit.parallel import available_jobs

    _one_or_all(task_id, all_tasks, ("--workflow", workflow), ("--since", since), ("--checkpoint", checkpoint))
    if (checkpoint is None) != (not public_key):
        raise typer.BadParameter("--checkpoint and --public-key go together", param_hint="--public-key")
    if checkpoint is not None and (workflow is not None or since is not None):
        raise typer.BadParameter("a checkpoint covers every task: not with --workflow or --since")
    if tree and task_id is None:
        raise typer.BadParameter("--tree replays one task and its descendants: name the TASK", param_hint="--tree")
    since_at = instant(since, "--since")
    jobs = jobs or available_jobs()
    with open_engine() as engine:
        if task_id is not None and tree:
            found = render.audit_totals(
                engine.audit.replay_tree(engine.resolve_task_id(task_id), jobs=jobs), as_json, "replayed"
            )
        elif task_id is not None:
            report = engine.replay(engine.resolve_task_id(task_id), jobs=jobs)
            render.replayed(report, as_json)
            found = not report.ok
        else:
            against = None
            if checkpoint is not None and public_key:
                header, judged = engine.audit.judge_checkpoint(checkpoint, public_key)
                against = (checkpoint, header, judged)
            reports = engine.audit.replay_all(workflow=workflow, since=since_at, jobs=jobs)
            found = render.audit_totals(reports, as_json, "replayed", against)
    if found:
        raise typer.Exit(EXIT_AUDIT)


def export(
    task_id: OneTask = None,
    all_tasks: AllTasks = False,
    workflow: OnlyWorkflow = None,
    since: ChangedSince = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only the tasks of this tenant.")] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint",
            help="Embed, after each task it lists, the inclusion proof of the task's head in this signed checkpoint.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    reader: ReaderOpt = None,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree", help="With TASK: also every task it started (child states), and theirs; the end line names it."
        ),
    ] = False,
) -> None:
    """Write task logs to stdout as JSON Lines (railyard-export/1) for `verify-export` and auditors' tools.

    With --tree, the task and its descendants, parent first: verify-export then checks every parent-child link
    both ways and that no child is missing (CHILD_MISSING, CHILD_LINK_MISMATCH, CHILD_RESULT_MISMATCH).

    With --checkpoint, the checkpoint's heads must hash to its root (CHECKPOINT_INVALID otherwise) before any
    proof is drawn from it; its signature is the verifier's to check. With --as, only the tasks that person may
    read, and the values their roles may not see shown as [restricted], each event line naming what it withholds
    (`withheld`): such an export cannot prove those events (verify-export reports FIELDS_WITHHELD).
    """
    from engine.audit.checkpoint import proofs, read
    from engine.audit.export import export_lines
    from engine.cli.tasks import reading
    from engine.runtime import queries, shown

    _one_or_all(task_id, all_tasks, ("--workflow", workflow), ("--since", since), ("--tenant", tenant))
    if tree and task_id is None:
        raise typer.BadParameter("--tree exports one task and its descendants: name the TASK", param_hint="--tree")
    since_at = instant(since, "--since")
    with open_engine() as engine:
        caller = None
        if task_id is not None and reader is not None:
            caller, task_id = reading(engine, reader, task_id)
        elif task_id is not None:
            task_id = engine.resolve_task_id(task_id)
        elif reader is not None:
            caller = engine.caller(reader)
        if task_id is not None and not queries.exists(engine, task_id):
            fail(Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id))
        try:
            proof_of = proofs(read(checkpoint)) if checkpoint is not None else None
        except RailyardError as error:
            fail(error)
        ids = None if task_id is None else engine.audit.tree(task_id) if tree else [task_id]
        root = task_id if tree else None
        items = engine.audit.logs(ids, workflow=workflow, since=since_at, tenant=tenant)
        if reader is None:
            render.jsonl(export_lines(items, proof_of, tree=root))
        else:
            bounds = queries.scope(engine, caller)
            render.jsonl(
                export_lines(
                    shown.readable_logs(items, bounds),
                    proof_of,
                    lambda row: shown.withholding_for(engine, caller, row),
                    tree=root,
                )
            )


def verify_export_command(
    path: Annotated[
        Path,
        typer.Argument(help="An export file (railyard export ... > FILE).", exists=True, dir_okay=False, readable=True),
    ],
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--checkpoint", help="Also hold the export to this signed checkpoint.", exists=True, dir_okay=False
        ),
    ] = None,
    public_key: PublicKeys | None = None,
    partial: Annotated[
        bool,
        typer.Option("--partial", help="With --checkpoint: the export holds some tasks only (no TASK_MISSING)."),
    ] = False,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            help="With --checkpoint: the export is this tenant's (export --tenant): every task the checkpoint signed "
            "as the tenant's must be in it, and no other.",
        ),
    ] = None,
    tree: Annotated[
        bool,
        typer.Option(
            "--tree", help="The export must be of a whole tree (export --tree): no child missing, every link checked."
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Check an export offline, with only the file and the workflow definitions (RAILYARD_WORKFLOWS).

    Every hash, the chain, seq, each transition's legality and each task's final state, and each proof line
    against the root it names. With --checkpoint, each task's log must also reach the head the signed
    checkpoint committed to, with a proof line that verifies against its signed root, and (unless --partial)
    no task it lists may be missing. The checkpoint may be its header line alone (`head -1 FILE`) with
    --partial. Links between a parent and a child both in the file are checked both ways; an export of a tree
    (export --tree, or demanded with --tree) must also hold every child. Exit 3 on any finding.
    """
    from engine.audit.checkpoint import Keys, Reading
    from engine.audit.export import ExportCheck, is_export, verify_export
    from engine.core.chain import Finding
    from engine.core.replay import ReplayReport

    if (checkpoint is None) != (not public_key):
        raise typer.BadParameter("--checkpoint and --public-key go together", param_hint="--public-key")
    if tenant is not None and checkpoint is None:
        raise typer.BadParameter("--tenant goes with --checkpoint", param_hint="--tenant")
    with path.open("rb") as lines:
        if not is_export(lines):
            fail(
                RailyardError(
                    f"{path} is not a Railyard export (no line of it is one): give the file `railyard export` wrote",
                    code=Code.EXPORT_INVALID,
                )
            )
    definitions = registry()
    against = ExportCheck.unanchored()
    try:
        if checkpoint is not None and public_key:
            with Reading(checkpoint, Keys.load(public_key)) as reading:
                if reading.header_only and not partial:
                    raise typer.BadParameter(
                        "this checkpoint is its header alone: it proves heads, not which tasks it lists; add --partial",
                        param_hint="--checkpoint",
                    )
                try:
                    if reading.unsigned is not None:
                        raise IntegrityError(f"{checkpoint.name}: {reading.unsigned}", code=Code.CHECKPOINT_INVALID)
                    heads = None if reading.header_only else {h.task_id: h for h in reading.heads()}
                except IntegrityError as error:
                    invalid = ReplayReport("", "", 0, (Finding(Code.CHECKPOINT_INVALID, 0, error.message),))
                    render.audit_totals([], as_json, "verified", (checkpoint, reading.header, [invalid]))
                    raise typer.Exit(EXIT_AUDIT) from None
            against = ExportCheck(reading.header, heads, complete=not partial, tenant=tenant)
    except RailyardError as error:
        fail(error)
    with path.open("rb") as lines:
        found = render.audit_totals(verify_export(lines, definitions.find, against, tree=tree), as_json, "verified")
    render.proofs_reached(against)
    if found:
        raise typer.Exit(EXIT_AUDIT)


def archive(
    before: Annotated[str, typer.Option("--before", help="Archive tasks that ended before this date (ISO 8601).")],
    batch: Annotated[int, typer.Option("--batch", min=1, help="Tasks per archive file.")] = 500,
    as_json: JsonFlag = False,
) -> None:
    """Move ended tasks' events to JSON Lines files in RAILYARD_ARCHIVE_DIR, verified before anything is deleted.

    Each task keeps its row as a tombstone naming its file and the file's sha256;
    `show`, `history` and `replay` read archived tasks from their file.
    """
    cutoff = instant(before, "--before")
    assert cutoff is not None
    with open_engine() as engine:
        try:
            done = engine.audit.archive(cutoff, batch=batch)
        except RailyardError as error:
            fail(error)
        directory = str(engine.archive_dir)
    render.archived(done, directory, as_json)
