"""What the store hands back, as typed records: a task's row, its snapshots, a claim, an archive reference.

They are vocabulary, not I/O: replay checks a log against a `TaskRow` and its
`Snapshot`s whether they came from the database or from an export file, so they
live in the core, and the store (`engine.store`) builds them from its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.core.events import Event
from engine.core.records import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class TaskRow:
    """The `tasks` row: the head of a task's log as the last append left it."""

    task_id: str
    workflow: str
    version: int
    digest: str
    state: str
    status: str
    seq: int
    last_hash: str
    created_at: datetime
    updated_at: datetime
    next_run_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    lease_epoch: int = 0
    failures: int = 0
    #: The tenant the task belongs to (its first event says; None: none).
    tenant: str | None = None
    #: Its own priority for quota, given at start (None: its workflow's, `engine.core.flow`); a scheduling
    #: hint kept on the row, not a fact of the log.
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease a worker just took: the epoch is its fencing token; `due_at` is when the task became due."""

    task_id: str
    epoch: int
    due_at: datetime


@quick_init
@dataclass(frozen=True, slots=True)
class Snapshot:
    task_id: str
    seq: int
    hash: str
    doc: str


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """A worker process as the `workers` table shows it to operators."""

    name: str
    host: str
    pid: int
    concurrency: int
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None
    counts: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Loaded:
    """What `load` read in one consistent view: the row, the newest snapshot, and the events after it."""

    row: TaskRow
    snapshot: Snapshot | None
    events: list[Event]


@dataclass(frozen=True, slots=True)
class ArchiveRef:
    """Where an archived task's events are: the file's name (in the archive directory) and its sha256."""

    task_id: str
    file: str
    sha256: str
    archived_at: datetime
