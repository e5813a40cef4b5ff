"""Retention: move ended tasks' events to verified JSON Lines files, leaving a tombstone row; read them back.

The archive file is an export (`engine.audit.export`, format `railyard-export/1`).
Nothing is deleted until that file is written, synced to disk and verified with
`verify_export` against the definitions, and until its sha256 is on the task
row in the same transaction that deletes the events. The row stays (state,
seq, last hash: the tombstone), so replay of an archived task proves the file
(its sha256), the log in it (chain, legality, fold) and the row together.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from pathlib import Path
from typing import Any, BinaryIO

from engine.audit.export import export_lines, read_events, verify_export
from engine.core.canonical import now
from engine.core.chain import Finding
from engine.core.errors import Code, IntegrityError
from engine.core.events import Event
from engine.core.replay import Lookup, OriginCheck, ReplayReport
from engine.core.rows import ArchiveRef, TaskRow
from engine.store import Store

#: Tasks per archive file: each file is verified before its tasks' events are deleted.
DEFAULT_BATCH = 500


@dataclass
class ArchiveRun:
    """What one `archive` run moved: the files written and how many tasks and events they hold."""

    files: list[str] = field(default_factory=list)
    tasks: int = 0
    events: int = 0


def archive_ended(
    store: Store, lookup: Lookup, before: datetime, directory: Path, *, batch: int = DEFAULT_BATCH
) -> ArchiveRun:
    """Archive every task that ended before `before`, `batch` tasks per file.

    A file that does not verify stops the run before anything of it is deleted
    (IntegrityError with the first finding's code); the file stays for inspection.
    """
    directory.mkdir(parents=True, exist_ok=True)
    run = ArchiveRun()
    stamp = now().strftime("%Y%m%dT%H%M%SZ")
    while True:
        rows = store.archivable(before, limit=batch)
        if not rows:
            return run
        path = directory / f"railyard-archive-{stamp}-{len(run.files) + 1:04d}.jsonl"
        _write(path, export_lines(store.audit_stream(task_ids=[r.task_id for r in rows], with_snapshots=False)))
        _verify(path, rows, lookup)
        moved = store.mark_archived([(r.task_id, r.seq) for r in rows], path.name, file_sha256(path))
        run.files.append(path.name)
        run.tasks += moved
        run.events += sum(r.seq for r in rows)
        if moved == 0:  # every row moved under us: do not loop on the same tasks
            return run


def _write(path: Path, lines: Iterator[str]) -> None:
    """Write to a temporary name, sync, then rename: a crash never leaves a half file under the real name."""
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", encoding="utf-8", newline="\n") as out:
        for line in lines:
            out.write(line)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)


def _verify(path: Path, rows: list[TaskRow], lookup: Lookup) -> None:
    expected = {r.task_id: r.seq for r in rows}
    found: dict[str, int] = {}
    with path.open("rb") as lines:
        for report in verify_export(lines, lookup):
            if not report.ok:
                first = report.findings[0]
                raise IntegrityError(
                    f"{path.name} does not verify ({report.task_id or 'the file'}: "
                    f"{first.message}); nothing was deleted",
                    code=first.code,
                    file=path.name,
                )
            if report.task_id:
                found[report.task_id] = report.events
    if found != expected:
        raise IntegrityError(
            f"{path.name} holds other tasks or events than the rows say; nothing was deleted",
            code=Code.SEQ_GAP,
            file=path.name,
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _open_checked(ref: ArchiveRef, directory: Path) -> Path:
    path = directory / ref.file
    if not path.is_file():
        raise IntegrityError(
            f"task {ref.task_id} was archived to {ref.file}, which is not in {directory}",
            code=Code.ARCHIVE_MISSING,
            task_id=ref.task_id,
            file=ref.file,
        )
    if file_sha256(path) != ref.sha256:
        raise IntegrityError(
            f"{ref.file} changed since task {ref.task_id} was archived to it (sha256 differs)",
            code=Code.HASH_MISMATCH,
            task_id=ref.task_id,
            file=ref.file,
        )
    return path


def archived_hashes(ref: ArchiveRef, directory: Path) -> dict[tuple[str, int], str]:
    """Every event hash of the file `ref` names, by (task id, seq), from a file whose sha256 is still the one on
    the tombstone: what a checkpoint's judgement reads once per file, not once per task."""
    path = _open_checked(ref, directory)
    found: dict[tuple[str, int], str] = {}
    with path.open("rb") as lines:
        for raw in lines:
            value = json.loads(raw)
            if value.get("kind") == "event":
                found[(str(value["task_id"]), int(value["seq"]))] = str(value["hash"])
    return found


def archived_events(ref: ArchiveRef, directory: Path) -> list[Event]:
    """The archived task's events, from a file whose sha256 is still the one on its tombstone."""
    path = _open_checked(ref, directory)
    with path.open("rb") as lines:
        return list(read_events(lines, ref.task_id))


def replay_archived(
    row: TaskRow, ref: ArchiveRef, directory: Path, lookup: Lookup, origin: OriginCheck | None = None
) -> ReplayReport:
    """Replay an archived task from its file: the file unchanged, its log proven, its end equal to the tombstone."""
    return next(replay_archives([(row, ref)], directory, lookup, origin))


def replay_archives(
    archived: Iterable[tuple[TaskRow, ArchiveRef]], directory: Path, lookup: Lookup, origin: OriginCheck | None = None
) -> Iterator[ReplayReport]:
    """Replay archived tasks, each from its file, reading each file once for the tasks that come together.

    `Store.archived` hands them over file by file, so `replay --all` reads each archive
    once, not once per task (a file holds a batch of tasks, and task ids do not follow files).
    A file is hashed in the same read that replays it: what is proven is the bytes hashed.
    """
    for (name, sha256), group in groupby(archived, key=lambda pair: (pair[1].file, pair[1].sha256)):
        path = directory / name
        checked: dict[str, tuple[ReplayReport, tuple[Any, ...] | None]] = {}
        problem: Finding | None = None
        if not path.is_file():
            problem = Finding(Code.ARCHIVE_MISSING, 0, f"the task was archived to {name}, which is not in {directory}")
        else:
            digest, checked = _check_file(path, lookup, origin)
            if digest != sha256:
                problem = Finding(
                    Code.HASH_MISMATCH, 0, f"{name} changed since the task was archived to it (sha256 differs)"
                )
        for row, _ref in group:
            yield _archived_report(row, name, problem, checked)


def _archived_report(
    row: TaskRow, name: str, problem: Finding | None, checked: dict[str, tuple[ReplayReport, tuple[Any, ...] | None]]
) -> ReplayReport:
    ref = f"{row.workflow}@{row.version}"
    if problem is not None:
        return ReplayReport(row.task_id, ref, 0, (problem,))
    report, last = checked.get(row.task_id, (None, None))
    if report is None:
        return ReplayReport(
            row.task_id, ref, 0, (Finding(Code.ARCHIVE_MISSING, 0, f"{name} holds no log of this task"),)
        )
    findings = list(report.findings)
    if last != (row.state, row.seq, row.last_hash):
        findings.append(Finding(Code.STATE_MISMATCH, row.seq, "the tombstone row disagrees with the archived log"))
    return ReplayReport(report.task_id, report.workflow, report.events, tuple(findings))


def _check_file(
    path: Path, lookup: Lookup, origin: OriginCheck | None = None
) -> tuple[str, dict[str, tuple[ReplayReport, tuple[Any, ...] | None]]]:
    """One read of an archive file: its sha256, each task's report, and each task's newest (state, seq, hash)."""
    digest = hashlib.sha256()
    newest: dict[str, tuple[Any, ...]] = {}

    def lines(source: BinaryIO) -> Iterator[bytes]:
        for raw in source:
            digest.update(raw)
            try:
                value = json.loads(raw)
            except ValueError:
                value = None  # verify_export reports the line
            if isinstance(value, dict) and value.get("kind") == "event":
                newest[str(value.get("task_id"))] = (value.get("to_state"), value.get("seq"), value.get("hash"))
            yield raw

    with path.open("rb") as source:
        read = lines(source)
        reports = {r.task_id: r for r in verify_export(read, lookup, origin=origin) if r.task_id}
        for _ in read:  # whatever verification did not need is still part of the file's hash
            pass
    return digest.hexdigest(), {task_id: (report, newest.get(task_id)) for task_id, report in reports.items()}
