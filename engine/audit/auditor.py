"""The `Auditor`: what an auditor asks of a database and its archive directory, without calling any model or tool.

Replay (one task, every task, in parallel jobs), the archive, signed checkpoints
(take, judge, extend), the state as of a point, the logs an export streams and a
task's path on its diagram. It holds the one cache an audit keeps (the event
hashes of the archive files last read, so judging a checkpoint reads each file
once). `Engine` builds one and exposes it as `engine.audit`; `Engine.replay` is
the façade's one audit verb, handed here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

from engine.audit import checkpoint as checkpoints
from engine.audit import parallel as replay_jobs
from engine.audit.archive import (
    ArchiveRun,
    archive_ended,
    archived_events,
    archived_hashes,
    replay_archived,
    replay_archives,
)
from engine.audit.checkpoint import Taken
from engine.audit.reads import AsOf, origin_check, replay_task, replay_tasks, state_as_of, task_logs, task_path
from engine.core.canonical import parse_instant
from engine.core.chain import Finding
from engine.core.checkpoints import Head, Header, descends, extends
from engine.core.definition import SPAWN, Workflow
from engine.core.errors import Code, IntegrityError, RailyardError, Refused
from engine.core.events import Event
from engine.core.fanout import child_records
from engine.core.replay import OriginCheck, ReplayReport
from engine.core.rows import TaskRow
from engine.core.task import TaskState
from engine.observability import hooks
from engine.store.protocol import Store

#: How many archive files' event hashes `_archived_hash` keeps (a checkpoint lists tasks in id order, not by file).
ARCHIVE_FILES_KEPT = 8


class Auditor:
    """Replay, archive, checkpoints, as-of, logs and paths over one store and archive directory."""

    def __init__(
        self,
        store: Store,
        find: Callable[[str, int], Workflow | None],
        archive_dir: Path,
        definition: Callable[[str, int, str], Workflow],
        *,
        signing_key: Callable[[], str | None] = lambda: None,
        checkpoint_dir: Callable[[], str | Path] = lambda: "checkpoints",
    ) -> None:
        self.store = store
        #: The definition of `name@version` the code holds (None: not defined); replay judges by it.
        self.find = find
        self.archive_dir = archive_dir
        #: The definition a task is pinned to, refused when missing or changed (DEFINITION_MISSING/CHANGED).
        self._definition = definition
        self._signing_key = signing_key
        self._checkpoint_dir = checkpoint_dir
        #: Event hashes of the archive files last read (`_archived_hash`), by (file, sha256), oldest first.
        self._archive_hashes: dict[tuple[str, str], dict[tuple[str, int], str]] = {}

    def replay(self, task_id: str, *, jobs: int = 1) -> ReplayReport:
        """Check the task's whole log from zero, without calling any model or tool (see `engine.core.replay`).

        With `jobs` > 1, a long log is checked in stretches by that many processes (`engine.audit.parallel`).
        """
        if not hooks.active:
            return self._replay(task_id, jobs)
        started = time.perf_counter()
        report = self._replay(task_id, jobs)
        hooks.replayed(report, started)
        return report

    def _replay(self, task_id: str, jobs: int) -> ReplayReport:
        if jobs > 1:
            row = self.store.row(task_id)
            if row is not None and row.seq >= replay_jobs.LONG_LOG and replay_jobs.can_fork(self.store):
                report = replay_jobs.replay_long(self.store, self.find, row, jobs, self.archived_events)
                if report is not None:
                    return report
        return self._from_archive(replay_task(self.store, self.find, task_id, self.archived_events))

    def replay_tree(self, task_id: str, *, jobs: int = 1) -> Iterator[ReplayReport]:
        """`replay` of a task and of every task it started from its child states, and theirs, parent first (each
        child after its parent, in the order they were started). A child the parent's log names and the database
        lacks is reported on the parent (CHILD_MISSING), not here."""
        for current in self.tree(task_id):
            yield self.replay(current, jobs=jobs)

    def tree(self, task_id: str) -> list[str]:
        """A task and every task it started from its child states, and theirs: parent first, each child after its
        parent in the order they were started, as their `spawn` events name them (in the database or an archive).
        A child named and not stored is left out: replay and an export's verification report it."""
        seen: set[str] = set()
        order: list[str] = []
        todo = [task_id]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.add(current)
            order.append(current)
            for event in self.store.events(current) or self.archived_events(current):
                if event.trigger != SPAWN:
                    continue
                for record in child_records(event.data):  # a single child, or each of a fan-out's
                    if self.store.row(record["task_id"]) is not None:
                        todo.append(record["task_id"])
        return order

    def replay_all(
        self, workflow: str | None = None, since: datetime | None = None, *, jobs: int = 1
    ) -> Iterator[ReplayReport]:
        """`replay` of every task (of `workflow`, changed since `since`), streamed: memory stays flat.

        Reports come in task id order, archived tasks last, file by file.

        With `jobs` > 1, pages of tasks are checked by that many processes; the reports come in the same order.
        """
        if jobs > 1 and replay_jobs.can_fork(self.store):
            reports = replay_jobs.replay_pages(
                self.store, self.find, jobs, workflow=workflow, since=since, archived=self.archived_events
            )
        else:
            reports = replay_tasks(self.store, self.find, workflow=workflow, since=since, archived=self.archived_events)
        reports = self._then_archives(reports, workflow, since)
        return hooks.replays(reports) if hooks.active else reports

    def _then_archives(
        self, reports: Iterator[ReplayReport], workflow: str | None, since: datetime | None
    ) -> Iterator[ReplayReport]:
        """The database's reports, then the archived tasks' from their files, file by file (each read once).

        An archived task has no events left in the database: its report there is left out, and the
        archive's comes after the others (a task archived while this runs may be reported twice).
        """
        for report in reports:
            if report.events or not report.task_id or self.store.archive_of(report.task_id) is None:
                yield report
        yield from replay_archives(
            self.store.archived(workflow=workflow, since=since), self.archive_dir, self.find, self._origin()
        )

    def archive(self, before: datetime, *, batch: int = 500) -> ArchiveRun:
        """Move the logs of tasks that ended before `before` to verified files in `archive_dir` (`audit.archive`)."""
        return archive_ended(self.store, self.find, before, self.archive_dir, batch=batch)

    # -- signed checkpoints (engine.audit.checkpoint) ---------------------------------------------------
    def checkpoint(self, key_file: str | Path | None = None, directory: str | Path | None = None) -> Taken:
        """Sign every task's head now and write the checkpoint to `directory` (RAILYARD_CHECKPOINT_DIR), with the key
        in `key_file` (RAILYARD_SIGNING_KEY). Its predecessor is the newest checkpoint in that directory."""
        key_path = key_file if key_file is not None else self._signing_key()
        if key_path is None:
            raise RailyardError(
                "no signing key: set RAILYARD_SIGNING_KEY to a key file (`railyard checkpoint keygen FILE` makes one)",
                code=Code.CONFIG_INVALID,
            )
        target = Path(directory if directory is not None else self._checkpoint_dir())
        return checkpoints.take(self.store, checkpoints.load_signing_key(Path(key_path)), target)

    def judge_checkpoint(self, path: str | Path, public_keys: str | Sequence[str]) -> tuple[Header, list[ReplayReport]]:
        """The database against a signed checkpoint: a report per task that no longer holds what it committed to,
        or one report (task id "") if the checkpoint itself does not verify with one of `public_keys`."""
        keys = checkpoints.Keys.load([public_keys] if isinstance(public_keys, str) else public_keys)
        self._archive_hashes.clear()  # archive files are read afresh by each judgement
        try:
            return checkpoints.judge_store(self.store, Path(path), keys, self._archived_hash)
        finally:
            self._archive_hashes.clear()

    def checkpoint_extends(
        self,
        older: str | Path,
        newer: str | Path,
        public_keys: str | Sequence[str],
        directories: Sequence[str | Path] = (),
    ) -> list[Finding]:
        """Whether checkpoint `newer` extends `older`: both verify (each with the key it names, among `public_keys`),
        `newer`'s chain of predecessors reaches `older` (the files looked up in `directories`, default the two
        files' own), and every task of `older` is in `newer` at a head whose log (in this database, or its
        archive) holds the older head at its seq."""
        keys = checkpoints.Keys.load([public_keys] if isinstance(public_keys, str) else public_keys)
        try:
            old, new = checkpoints.read(Path(older), keys), checkpoints.read(Path(newer), keys)
        except IntegrityError as error:
            if error.code is not Code.CHECKPOINT_INVALID:
                raise
            return [Finding(Code.CHECKPOINT_INVALID, 0, error.message)]
        if parse_instant(new.header.at) < parse_instant(old.header.at):
            return [Finding(Code.CHECKPOINT_NOT_EXTENDING, 0, "the newer checkpoint was taken before the older one")]
        places = [Path(d) for d in directories] or list(dict.fromkeys([Path(newer).parent, Path(older).parent]))
        found = checkpoints.chain_findings(old.header, new.header, places, keys)
        unreadable: list[Finding] = []

        def log_descends(a: Head, b: Head) -> bool:
            try:
                log = self.store.events(a.task_id, after_seq=a.seq - 1, upto_seq=b.seq) or [
                    e for e in self.archived_events(a.task_id) if a.seq <= e.seq <= b.seq
                ]
            except IntegrityError as error:  # an archive file gone: said as such, not as a head that moved
                unreadable.append(Finding(error.code, a.seq, f"task {a.task_id}: {error.message}"))
                return True
            return descends(log, a, b)

        return [*found, *extends(old, new, log_descends), *unreadable]

    def _archived_hash(self, task_id: str, seq: int) -> str | None:
        """The hash of event `seq` of an archived task, from its file; None if the task is not archived. An archived
        task whose file is gone or changed raises IntegrityError (ARCHIVE_MISSING, HASH_MISMATCH). The files last
        read are kept, so judging a checkpoint reads each archive file once, not once per task."""
        ref = self.store.archive_of(task_id)
        if ref is None:
            return None
        key = (ref.file, ref.sha256)
        hashes = self._archive_hashes.pop(key, None)
        if hashes is None:
            hashes = archived_hashes(ref, self.archive_dir)
        self._archive_hashes[key] = hashes  # the newest at the end
        while len(self._archive_hashes) > ARCHIVE_FILES_KEPT:
            self._archive_hashes.pop(next(iter(self._archive_hashes)))
        return hashes.get((task_id, seq))

    def archived_events(self, task_id: str) -> list[Event]:
        """The events of an archived task, from its file (checked against the sha256 on its row); [] if not archived."""
        ref = self.store.archive_of(task_id)
        return archived_events(ref, self.archive_dir) if ref is not None else []

    def _from_archive(self, report: ReplayReport) -> ReplayReport:
        """A task without events in the database may be archived: then its file is what replay proves."""
        if report.events or not report.task_id:
            return report
        ref = self.store.archive_of(report.task_id)
        row = self.store.row(report.task_id)
        if ref is None or row is None:
            return report
        return replay_archived(row, ref, self.archive_dir, self.find, self._origin())

    def _origin(self) -> OriginCheck:
        """How replay checks a fork against its source here: the source in this database, or its archive file."""
        return origin_check(self.store, self.find, self.archived_events)

    def as_of(self, task_id: str, seq: int | None = None, at: datetime | None = None) -> TaskState:
        """The task's state right after event `seq`, or after the last event written at or before `at`."""
        return self.as_of_event(task_id, seq, at).task

    def as_of_event(self, task_id: str, seq: int | None = None, at: datetime | None = None) -> AsOf:
        """`as_of`, with the event it stops at (its time and actor): what `show --as-of` prints."""
        row = self.store.row(task_id)
        if row is None:
            raise Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)
        return state_as_of(self.store, self._definition, self.archived_events, row, seq=seq, at=at)

    def logs(
        self,
        task_ids: list[str] | None = None,
        *,
        workflow: str | None = None,
        since: datetime | None = None,
        tenant: str | None = None,
    ) -> Iterator[TaskRow | Event]:
        """Task rows each followed by its events, streamed; archived tasks' events come from their files. With
        `tenant`, only that tenant's tasks (the others are read and passed over: an export is one pass anyway)."""
        found = task_logs(self.store, self.archived_events, task_ids=task_ids, workflow=workflow, since=since)
        return found if tenant is None else _of_tenant(found, tenant)

    def path(self, task_id: str) -> tuple[TaskRow, Counter[tuple[str, str, str]], str | None]:
        """The task's row, how often it took each (source, trigger, target) edge, and where it is now."""
        return task_path(self.store, self.archived_events, task_id)


def _of_tenant(items: Iterator[TaskRow | Event], tenant: str) -> Iterator[TaskRow | Event]:
    """The rows (each followed by its events) of the tasks of `tenant`, of a stream of every task's."""
    keep = False
    for item in items:
        if isinstance(item, TaskRow):
            keep = item.tenant == tenant
        if keep:
            yield item
