"""What a store is to the rest of Railyard: the verbs the runtime and the audit layer call, and what it can do.

Every backend keeps the same append-only, hash-chained task logs with the same
optimistic concurrency: `engine.store.sql.SqlStore` over SQLite or PostgreSQL,
`engine.store.memory.MemoryStore` in the process's memory (for unit tests, and
`memory://`). Code above the store asks a store what it can do
(`supports_notify`, `supports_fork`), never which database is behind it.
`tests/test_store_contract.py` holds every backend to the same behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self

from engine.core.checkpoints import Head, Header
from engine.core.errors import ConcurrencyConflict, LeaseLost
from engine.core.events import Event
from engine.core.people import AccessChange, Person, StoredToken
from engine.core.rows import ArchiveRef, Claim, Loaded, Snapshot, TaskRow, WorkerReport

#: Audit reads: task rows per keyset page (what parallel replay hands to a job).
#: Where `blocked_in(by_deadline=True)` puts a task without a deadline: after every real one.
NO_DEADLINE = datetime(9999, 12, 31, tzinfo=UTC)
AUDIT_PAGE = 500


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """Which tasks a back-office list wants, newest first by (created_at, task_id): a keyset page of them.

    Every filter given must hold. `id_prefix` and `field_value` are the search box: a task matches when its id
    starts with `id_prefix` or one of its searchable input fields equals `field_value` (either, if both are
    given). `after` is the id of the last task of the previous page: the page holds the tasks after it in that
    order, so a task created meanwhile never shifts a page, and none is seen twice.
    """

    workflow: str | None = None
    #: Only tasks of these workflows (None: any): what the caller may read (`engine.core.access.may_read`).
    workflows: Sequence[str] | None = None
    #: Only tasks of these tenants (None: any, a task of no tenant too): the caller's (`Caller.tenants`).
    tenants: Sequence[str] | None = None
    #: Any of these states (empty: any state).
    states: Sequence[str] = ()
    status: str | None = None
    started_by: str | None = None
    #: Created at or after this instant.
    created_from: datetime | None = None
    #: Created strictly before this instant.
    created_before: datetime | None = None
    id_prefix: str | None = None
    field_value: str | None = None
    after: str | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class ListedTask:
    """A task as the lists show it: its row, who started it, and its searchable input fields."""

    row: TaskRow
    started_by: str
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PageSession:
    """A logged-in page session as the store keeps it: the cookie's id is never stored, only its SHA-256."""

    id_hash: str
    #: What signed in, looked up again on every request: `token:<sha256>` (a token) or `user:<name>` (a person).
    credential: str
    actor: str
    csrf: str
    created_at: datetime
    expires_at: datetime
    #: The message waiting for the next page, as read with the session (`take_flash` clears it).
    flash: str | None = None


class Wakeups(Protocol):
    """Something that calls a worker's `wake` when a task becomes claimable, from `start` until `stop`."""

    def start(self) -> Self: ...

    def stop(self) -> None: ...


class Store(Protocol):
    """Durable, append-only task logs with optimistic concurrency."""

    #: Whether `wakeups` can tell idle workers that a task became claimable; without it, workers only poll.
    supports_notify: bool
    #: Whether a forked process (parallel replay) can go on reading the same data, after `after_fork`.
    supports_fork: bool

    def close(self) -> None: ...

    # -- writes ---------------------------------------------------------
    def create(self, row: TaskRow, first: Event, fields: Mapping[str, str] | None = None) -> None:
        """Insert a new task and its `start` event together, or neither; the first event's actor is its starter,
        and `fields` are its searchable input fields (`Workflow.search_values`)."""
        ...

    def repin(
        self,
        task_id: str,
        expected_seq: int,
        event: Event,
        *,
        version: int,
        digest: str,
        status: str,
        next_run_at: datetime | None,
    ) -> None:
        """Append a `migrate` event and pin the task row to another version, together (or neither)."""
        ...

    def append(
        self,
        task_id: str,
        expected_seq: int,
        new_events: Sequence[Event],
        *,
        status: str,
        snapshot: tuple[int, str, str] | None = None,
        next_run_at: datetime | None = None,
        lease_epoch: int | None = None,
    ) -> None:
        """Write `new_events` (seq `expected_seq + 1 ...`) and move the task row, together (or neither).

        `ConcurrencyConflict` when the row is no longer at `expected_seq`; with `lease_epoch`, `LeaseLost` when
        only the lease moved. A task that ends drops its lease in the same write.
        """
        ...

    # -- leases ---------------------------------------------------------
    def claim(
        self,
        owner: str,
        *,
        limit: int,
        lease_seconds: float,
        workflows: Sequence[str] | None = None,
        at: datetime | None = None,
    ) -> list[Claim]:
        """Lease up to `limit` due tasks to `owner`, the longest-due first; each claim bumps the lease epoch."""
        ...

    def heartbeat(self, owner: str, task_ids: Sequence[str], *, lease_seconds: float) -> frozenset[str]:
        """Extend the leases `owner` still holds on `task_ids`; returns the ids it holds (and extended)."""
        ...

    def release(self, task_id: str, epoch: int, *, step_succeeded: bool = True) -> None:
        """Give the lease back (only if still held at `epoch`); a step that went through clears the failures."""
        ...

    def postpone(self, task_id: str, epoch: int, until: datetime, *, failed: bool = False) -> int:
        """Move a held task's next look to `until`; with `failed`, count one more failed step. Returns the count."""
        ...

    # -- archive --------------------------------------------------------
    def archivable(self, before: datetime, *, limit: int) -> list[TaskRow]:
        """Ended tasks whose last event is older than `before` and whose events are still here, oldest first."""
        ...

    def mark_archived(self, archived: Sequence[tuple[str, int]], file: str, sha256: str) -> int:
        """Tombstone each (task_id, seq) and drop its events and snapshots; a task that moved is left alone."""
        ...

    def archive_of(self, task_id: str) -> ArchiveRef | None:
        """The archive holding the task's events, if it was archived."""
        ...

    def archived(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[tuple[TaskRow, ArchiveRef]]:
        """Archived tasks and their archives, ordered by (archive file, task id)."""
        ...

    # -- reads ----------------------------------------------------------
    def row(self, task_id: str) -> TaskRow | None: ...

    def load(self, task_id: str) -> Loaded | None:
        """The task row, its newest snapshot and the events after that snapshot up to the row's seq, in one view."""
        ...

    def load_many(self, task_ids: Sequence[str]) -> dict[str, Loaded]:
        """`load` of each task by its id, in one round trip (what a worker reads for the tasks a claim gave it);
        a task that does not exist is not in the answer. Each task is read in one view, as by `load`."""
        ...

    def events(self, task_id: str, after_seq: int = 0, upto_seq: int | None = None) -> list[Event]:
        """The task's events with `after_seq < seq <= upto_seq`, in order."""
        ...

    def snapshots(self, task_id: str) -> list[Snapshot]: ...

    # -- audit reads ----------------------------------------------------
    def audit_stream(
        self,
        *,
        task_ids: Sequence[str] | None = None,
        workflow: str | None = None,
        since: datetime | None = None,
        with_snapshots: bool = True,
        upto_seq: int | None = None,
        from_seq: int | None = None,
        page_size: int = AUDIT_PAGE,
    ) -> Iterator[TaskRow | Event | Snapshot]:
        """Task rows in task_id order, each followed by its events (and snapshots) in log order."""
        ...

    def audit_pages(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[list[str]]:
        """The ids `audit_stream` would visit, a keyset page at a time."""
        ...

    def snapshot_seqs(self, task_id: str) -> list[int]: ...

    def seq_at(self, task_id: str, at: datetime) -> int | None:
        """The seq of the task's last event written at or before `at` (None: the task did not exist yet)."""
        ...

    def task_ids(self, *, workflow: str | None = None, status: str | None = None) -> list[str]: ...

    def task_ids_starting(
        self,
        prefix: str,
        *,
        limit: int = 2,
        workflows: Sequence[str] | None = None,
        tenants: Sequence[str] | None = None,
    ) -> list[str]:
        """At most `limit` ids of tasks (archived ones too) that start with `prefix`, taken literally (`%` and `_`
        are characters, not patterns), in id order: what resolves a task id typed short. `workflows`, `tenants`:
        only tasks of these (what the caller may read; None: any)."""
        ...

    def recent(
        self, *, workflow: str | None = None, state: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[TaskRow]:
        """Task rows, most recently changed first, at most `limit`."""
        ...

    def list_tasks(self, query: TaskQuery) -> list[ListedTask]:
        """One keyset page of the tasks `query` selects, newest first by (created_at, task_id), at most `limit`."""
        ...

    def blocked_in(
        self,
        states: Sequence[tuple[str, int, str]],
        *,
        after: str | None = None,
        limit: int | None = None,
        by_deadline: bool = False,
        waiting_before: datetime | None = None,
        tenants: Sequence[str] | None = None,
    ) -> list[str]:
        """Blocked tasks standing in one of `states` (workflow, version, state), oldest first by (created_at,
        task_id); with `by_deadline`, nearest deadline (`next_run_at`) first and those without one last, then
        oldest first. With `after` (a task id), only those after it in that order; with `waiting_before`, only
        those whose last event (`updated_at`) is older; with `tenants`, only tasks of those; at most `limit`."""
        ...

    def status_counts(self, at: datetime | None = None) -> list[dict[str, Any]]:
        """Per workflow and status: how many tasks, how many of them leased, and the oldest due time."""
        ...

    # -- page sessions --------------------------------------------------
    def open_session(self, session: PageSession) -> None:
        """Keep a new page session (and forget the ones that expired before it was opened)."""
        ...

    def page_session(self, id_hash: str, at: datetime) -> PageSession | None:
        """The session with this id hash, if it exists and has not expired at `at`."""
        ...

    def end_session(self, id_hash: str) -> None:
        """Forget the session: every copy of its cookie stops working at once."""
        ...

    def set_flash(self, id_hash: str, message: str) -> None:
        """The message the session's next page shows (replacing one not shown yet)."""
        ...

    def take_flash(self, id_hash: str) -> str | None:
        """The session's pending message, cleared in the same step: it is shown once."""
        ...

    # -- failed logins --------------------------------------------------
    def note_login_failure(self, keys: Sequence[str], at: datetime, *, forget_before: datetime) -> None:
        """Record one failed login at `at` under each key, and forget every failure before `forget_before`."""
        ...

    def login_failures(self, keys: Sequence[str], after: datetime) -> dict[str, list[datetime]]:
        """The failures recorded under each key (that has any) after `after`, oldest first."""
        ...

    def clear_login_failures(self, key: str) -> None:
        """Forget the failures recorded under `key` (a login to that account went through)."""
        ...

    # -- people, database tokens and the access trail --------------------
    def person(self, name: str) -> Person | None:
        """The person of this name (exactly), or None."""
        ...

    def people(self) -> list[Person]:
        """Every person, by name."""
        ...

    def write_person(self, person: Person, changes: Sequence[AccessChange], *, revision: int | None) -> bool:
        """Keep `person` and append `changes` to the access trail, together (or neither). `revision` is the one the
        change was made on: None to add a new person, else the row must still be at it (and `person.revision` is
        the next). False, and nothing written, when it is not: the person exists already, or changed meanwhile."""
        ...

    def api_token(self, sha256: str) -> StoredToken | None:
        """The database token with this hash (revoked and expired ones too), or None."""
        ...

    def api_tokens(self, *, actor: str | None = None) -> list[StoredToken]:
        """Every database token (of `actor`, if given), revoked and expired ones too, oldest first."""
        ...

    def add_api_token(self, token: StoredToken, change: AccessChange) -> bool:
        """Keep a new token and its trail entry together; False (nothing written) if its hash is kept already."""
        ...

    def revoke_api_token(self, sha256: str, at: datetime, by: str, change: AccessChange) -> bool:
        """Mark the token revoked and append `change`, together; False (nothing written) if there is no such token
        or it was revoked already."""
        ...

    def access_trail(
        self, *, subject: str | None = None, after: int | None = None, limit: int | None = None
    ) -> list[AccessChange]:
        """The access trail in the order it was written (of `subject`, if given), after the entry `after`."""
        ...

    # -- worker reports -------------------------------------------------
    def heads(self) -> Iterator[Head]:
        """Every task's head (task id, seq, last hash), archived ones included, in task id byte order, streamed:
        what a checkpoint commits to."""
        ...

    def log_heads(self) -> Iterator[tuple[Head, str | None]]:
        """`heads`, each with the hash of the event at the head's seq as the log holds it (None when it holds
        none: an archived task, or a log cut under its row): what a checkpoint's judgement reads."""
        ...

    def event_hashes(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The hash of each (task_id, seq) event the database holds (archived logs are in their files)."""
        ...

    def record_checkpoint(self, header: Header, file: str) -> None:
        """Note a checkpoint written to `file` (the file is the evidence; the row says which was last)."""
        ...

    def last_checkpoint(self) -> tuple[Header, str] | None:
        """The newest checkpoint noted, and its file name."""
        ...

    def report_worker(self, report: WorkerReport) -> None: ...

    def workers(self, *, seen_since: datetime) -> list[WorkerReport]: ...

    # -- capabilities ---------------------------------------------------
    def wakeups(self, wake: Callable[[], None], workflows: Sequence[str] | None = None) -> Wakeups:
        """What wakes a worker when a task of `workflows` becomes claimable (only where `supports_notify`)."""
        ...

    def after_fork(self) -> None:
        """In a forked process: stop using the parent's connections (only where `supports_fork`)."""
        ...


def conflict(task_id: str, expected: int, epoch: int | None, found: Sequence[Any] | None) -> ConcurrencyConflict:
    """Why an append wrote nothing, from the row's (seq, lease epoch) as found: the seq moved (ConcurrencyConflict)
    or only the lease did (LeaseLost). Every store refuses with this one answer."""
    if found is None:
        return ConcurrencyConflict(task_id, expected, None)
    seq, current_epoch = found
    if epoch is not None and seq == expected and current_epoch != epoch:
        return LeaseLost(task_id, expected, seq, epoch, current_epoch)
    return ConcurrencyConflict(task_id, expected, seq)
