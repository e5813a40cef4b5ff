"""What a store is to the rest of Railyard: the verbs the runtime and the audit layer call, and what it can do.

Every backend keeps the same append-only, hash-chained task logs with the same
optimistic concurrency: `engine.store.sql.SqlStore` over SQLite or PostgreSQL,
`engine.store.memory.MemoryStore` in the process's memory (for unit tests, and
`memory://`). Code above the store asks a store what it can do
(`supports_notify`, `supports_fork`), never which database is behind it.
The store contract (`tests/test_store_*.py`, one file per role) holds every backend to the same behaviour.

`Store` is the sum of the roles a store plays, each its own protocol: the task logs (`TaskLog`), who works on
what (`Leases`), what an auditor reads and keeps (`AuditLog`), the people's side (`BackOffice`) and webhooks
(`WebhookStore`); `FlowStore` is apart and optional. Code that needs one role takes that one (`People` a
`BackOffice`, the webhook outbox a `WebhookStore`), so what it may touch is in its signature.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, Self, runtime_checkable

from engine.core.checkpoints import Head, Header
from engine.core.errors import Code, ConcurrencyConflict, LeaseLost, StoreError
from engine.core.events import Event
from engine.core.flow import Amounts, BreakerRow, BreakerSettings, Limits, Place, QuotaRow, Waiter
from engine.core.people import AccessChange, Person, StoredToken
from engine.core.rows import ArchiveRef, Claim, Loaded, Snapshot, TaskRow, WorkerReport
from engine.core.webhooks import Delivery, Outgoing, Subscription
from engine.core.webhooks import Secret as WebhookSecret

log = logging.getLogger("railyard.store")

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


# -- the work queue: its pages, its counts and who is on an item ---------------------------------------------------
#: What the work queue can be sorted by: nearest deadline (none last), longest waiting (since the last event),
#: oldest created, workflow name, state name. Each is followed by (created_at, task_id), so every order is total.
QUEUE_SORTS = ("deadline", "waiting", "created", "workflow", "state")


@dataclass(frozen=True, slots=True)
class QueueQuery:
    """Which blocked tasks a work queue page wants: those standing in `places` (workflow, version, state), in the
    order `sort` names (reversed with `descending`), a keyset page after the task `after`.

    The search (`id_prefix`, `field_value`) is the task list's (`TaskQuery`); `waiting_before` keeps the tasks
    whose last event is older; `tenants` bounds them to the caller's. `at` is the instant claims are judged at.
    """

    places: Sequence[tuple[str, int, str]]
    tenants: Sequence[str] | None = None
    waiting_before: datetime | None = None
    id_prefix: str | None = None
    field_value: str | None = None
    sort: str = "deadline"
    descending: bool = False
    after: str | None = None
    limit: int = 50
    at: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkClaim:
    """Who is on a work item: `actor` holds it until `expires_at`, and only while the task stands at `seq` (a
    decision, or anything else that moves it, ends the claim). A take-over names whom it was `taken_from`, and why."""

    task_id: str
    actor: str
    seq: int
    claimed_at: datetime
    expires_at: datetime
    taken_from: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A row of the work queue: the task's row, who started it, its searchable fields, the event at its head (why
    it waits there, and the call it prepared if that event did) and the live claim on it, read in four bounded
    queries for the whole page, never a task's log."""

    row: TaskRow
    started_by: str
    fields: dict[str, str]
    head: Event | None
    claim: WorkClaim | None = None


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


class TaskLog(Protocol):
    """The task logs themselves: a task created, its events appended under optimistic concurrency (and a lease
    epoch), moved to another version; its row, its log and snapshots read back. What every command and step needs."""

    #: Whether a forked process (parallel replay) can go on reading the same data, after `after_fork`.
    supports_fork: bool

    def close(self) -> None: ...

    def create(
        self, row: TaskRow, first: Event, fields: Mapping[str, str] | None = None, outbox: Sequence[Outgoing] = ()
    ) -> None:
        """Insert a new task and its `start` event together, or neither; the first event's actor is its starter,
        `fields` are its searchable input fields (`Workflow.search_values`), and `outbox` the webhook messages its
        start brings (written with it)."""
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
        outbox: Sequence[Outgoing] = (),
    ) -> None:
        """Write `new_events` (seq `expected_seq + 1 ...`), the webhook messages they bring (`outbox`, one already
        written by id is kept) and move the task row, together (or neither).

        `ConcurrencyConflict` when the row is no longer at `expected_seq`; with `lease_epoch`, `LeaseLost` when
        only the lease moved. A task that ends drops its lease in the same write. A task already due and asked to
        be due now keeps the due time it has (`engine.core.timers.still_due`).
        """
        ...

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

    def after_fork(self) -> None:
        """In a forked process: stop using the parent's connections (only where `supports_fork`)."""
        ...


class Leases(Protocol):
    """Who works on which task: claims with a lease and its fencing epoch, heartbeats, hand-backs and timers, the
    wake-ups that tell idle workers, and the workers' reports."""

    #: Whether `wakeups` can tell idle workers that a task became claimable; without it, workers only poll.
    supports_notify: bool

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
        """Give the lease back (only if still held at `epoch`); a step that went through clears the failures. A task
        still due is due again from now, at the back of the line (`engine.core.timers.handed_back`)."""
        ...

    def postpone(self, task_id: str, epoch: int, until: datetime, *, failed: bool = False) -> int:
        """Move a held task's next look to `until`; with `failed`, count one more failed step. Returns the count."""
        ...

    def wake(self, task_id: str, state: str, at: datetime) -> bool:
        """Make a task blocked in `state` due at `at` (unless it is due sooner): a child's end wakes the parent that
        waits for it (`engine.runtime.children`). Whether it was so woken; any other task is left as it is."""
        ...

    def wakeups(self, wake: Callable[[], None], workflows: Sequence[str] | None = None) -> Wakeups:
        """What wakes a worker when a task of `workflows` becomes claimable (only where `supports_notify`)."""
        ...

    def report_worker(self, report: WorkerReport) -> None: ...

    def workers(self, *, seen_since: datetime, stopped: bool = False) -> list[WorkerReport]:
        """The workers that reported since `seen_since` and are still running; with `stopped`, those that
        stopped since as well (a supervisor sums its processes' last reports)."""
        ...


class AuditLog(Protocol):
    """What an auditor reads and keeps: the logs page by page and as of a time, the heads and hashes a
    checkpoint signs, the checkpoints, and the archive of ended tasks."""

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


class BackOffice(Protocol):
    """What the people's side reads and keeps: task lists and counts, the work queue and who is on an item, page
    sessions and failed logins, people, database tokens and their access trail."""

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
        """Per workflow and status: how many tasks, how many of them leased, and the oldest due time of those not
        leased (a task that keeps moving under its lease stays due since it first became due: `still_due`)."""
        ...

    def queue_page(self, query: QueueQuery) -> list[QueuedTask]:
        """One keyset page of the blocked tasks `query` selects, in its order, at most `limit`, each with its
        fields, its head event and its live claim (one at `query.at` whose seq is still the task's)."""
        ...

    def queue_counts(self, query: QueueQuery) -> dict[tuple[str, int, str], int]:
        """How many blocked tasks `query` selects (its order and page aside) in each of its places: a GROUP BY
        in the database, never the ids."""
        ...

    def claim_work(
        self, task_id: str, actor: str, *, at: datetime, until: datetime, take_over: str | None = None
    ) -> WorkClaim | None:
        """Claim the task for `actor` until `until`, at the seq it stands at now, and return the claim that holds
        after the call: `actor`'s, or the one another actor holds (live at `at`) when `take_over` (the reason) is
        None. Of two actors claiming at once, one wins and the other is answered with the winner's claim.
        None: no such task."""
        ...

    def release_work(self, task_id: str, actor: str) -> bool:
        """Drop `actor`'s claim on the task; False when it held none."""
        ...

    def carry_claim(self, task_id: str, from_seq: int, to_seq: int) -> None:
        """Move a claim held at `from_seq` to `to_seq`: the task's new seq is a remark (a note, the claim's own
        event, `engine.core.remarks`), which ends no claim. A claim at any other seq is left as it is."""
        ...

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

    def note_login_failure(self, keys: Sequence[str], at: datetime, *, forget_before: datetime) -> None:
        """Record one failed login at `at` under each key, and forget every failure before `forget_before`."""
        ...

    def login_failures(self, keys: Sequence[str], after: datetime) -> dict[str, list[datetime]]:
        """The failures recorded under each key (that has any) after `after`, oldest first."""
        ...

    def clear_login_failures(self, key: str) -> None:
        """Forget the failures recorded under `key` (a login to that account went through)."""
        ...

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


class WebhookStore(Protocol):
    """Webhook subscriptions and the outbox of their deliveries (`engine.core.webhooks`)."""

    def add_webhook(self, sub: Subscription) -> None: ...

    def webhooks(self) -> list[Subscription]:
        """Every subscription, oldest first."""
        ...

    def remove_webhook(self, subscription_id: str) -> bool:
        """Forget a subscription (False: none of that id); its undelivered messages are marked failed."""
        ...

    def set_webhook_secrets(self, subscription_id: str, secrets: Sequence[WebhookSecret]) -> bool: ...

    def enqueue_webhooks(self, messages: Sequence[Outgoing]) -> int:
        """Write the messages whose id is not written yet (a sweep run twice writes nothing twice); how many."""
        ...

    def lease_deliveries(self, owner: str, *, limit: int, lease_seconds: float, at: datetime) -> list[Delivery]:
        """Lease up to `limit` pending messages due at `at` whose lease is free or expired (a sender that died
        is taken over), counting one attempt each."""
        ...

    def delivery_done(self, message_id: str, owner: str, at: datetime) -> bool:
        """Mark a message delivered, if `owner` still holds its lease."""
        ...

    def delivery_retry(self, message_id: str, owner: str, until: datetime | None, error: str) -> bool:
        """Put a message off until `until` (None: mark it failed), if `owner` still holds its lease."""
        ...

    def deliveries(
        self,
        *,
        subscription_id: str | None = None,
        status: str | None = None,
        ids: Sequence[str] | None = None,
        limit: int = 100,
    ) -> list[Delivery]:
        """The newest messages first, of one subscription or status if given."""
        ...

    def replay_delivery(self, message_id: str, at: datetime) -> bool:
        """Make a message pending again from `at` (same id, same body); False: no such message."""
        ...


class Store(TaskLog, Leases, AuditLog, BackOffice, WebhookStore, Protocol):
    """Durable, append-only task logs with optimistic concurrency, and what is kept beside them: every role a
    backend plays (`TaskLog`, `Leases`, `AuditLog`, `BackOffice`, `WebhookStore`; `FlowStore` is apart, and
    optional). Code that needs one role asks for that one."""


def key_refused(why: str) -> StoreError:
    """What the database answers to a write that breaks a key, in the SQL store's words (the detail to the log):
    what the memory store raises where a database would refuse."""
    log.warning("integrity error: %.200s", why)
    return StoreError("the database refused the write (constraint violated)", code=Code.DATABASE_ERROR)


def conflict(task_id: str, expected: int, epoch: int | None, found: Sequence[Any] | None) -> ConcurrencyConflict:
    """Why an append wrote nothing, from the row's (seq, lease epoch) as found: the seq moved (ConcurrencyConflict)
    or only the lease did (LeaseLost). Every store refuses with this one answer."""
    if found is None:
        return ConcurrencyConflict(task_id, expected, None)
    seq, current_epoch = found
    if epoch is not None and seq == expected and current_epoch != epoch:
        return LeaseLost(task_id, expected, seq, epoch, current_epoch)
    return ConcurrencyConflict(task_id, expected, seq)


@runtime_checkable
class FlowStore(Protocol):
    """Rows every worker on a database shares to pace model calls: circuit breakers, quota buckets and the queue
    of tasks waiting for quota (`engine.core.flow` decides; `engine.runtime.flow` calls these). A role of its
    own beside `Store`: a backend that keeps only logs need not have it, and flow control is then off.

    Times are epoch seconds of the store's own clock (the database's), returned with each row read (`at`), so
    that workers on machines whose clocks differ still agree on when a cool-down ends.
    """

    def flow_clock(self) -> float:
        """The store's clock now, in epoch seconds."""
        ...

    def breaker(self, key: str) -> BreakerRow | None:
        """The breaker of `key` as it stands (None: never failed), its `at` the clock when read."""
        ...

    def breakers(self) -> list[BreakerRow]:
        """Every breaker, by key, each `at` the clock when read: what the pages show, without the quota queues."""
        ...

    def breaker_failed(
        self, key: str, settings: BreakerSettings, on_open: Callable[[BreakerRow], Sequence[Outgoing]] | None = None
    ) -> BreakerRow:
        """Count one transient failure, in one statement; opens the breaker from `settings.failures` in a row (or
        a failed probe) for `settings.cool_down_seconds`. Returns the breaker after it. With `on_open`, a failure
        that opens the breaker also writes the webhook messages `on_open` returns, in the same transaction."""
        ...

    def breaker_probe(self, key: str, probe_seconds: float) -> bool:
        """Whether this caller took the one probe of an open breaker whose cool-down ended (or whose last probe
        is overdue): at most one caller gets True for each."""
        ...

    def breaker_closed(self, key: str) -> None:
        """An answer came: the breaker closes, its failures in a row back to 0."""
        ...

    def quota_take(self, key: str, limits: Limits, amounts: Amounts, hold_seconds: float) -> tuple[bool, QuotaRow]:
        """Take `amounts` from the bucket of `key` and count a call in flight (until `hold_seconds` from now at the
        latest), in one statement, if all of it is there; the bucket after (taken) or as it stands (refused)."""
        ...

    def quota_settle(self, key: str, input_tokens: float, output_tokens: float, *, release: bool = True) -> None:
        """Take the difference between what a call used and what it reserved (negative: give it back), and end its
        count in flight (`release`)."""
        ...

    def quota_pause(self, key: str, seconds: float) -> None:
        """No call of `key` is let through for `seconds` (a provider's `retry-after`), for every worker."""
        ...

    def quota_adapt(self, key: str, limits: Limits, left: Mapping[str, float]) -> None:
        """Hold the bucket to no more than the provider's headers say is left (`engine.core.flow.remaining`)."""
        ...

    def wait_join(
        self,
        key: str,
        task_id: str,
        wait: float,
        priorities: Mapping[str, int],
        *,
        lookahead: float,
        grace: float,
    ) -> tuple[Place, QuotaRow | None]:
        """Put `task_id` in the queue of `key` (or move its next look to `wait` seconds from now, keeping its
        place), its priority its own (`tasks.priority`) or its workflow's from `priorities`; its place in the
        queue as it stands (`engine.core.flow.place_in`: those served before it and due back within `lookahead`
        seconds, or at all, not overdue by more than `grace`), and the bucket. Waiters long past their look (a
        task that ended meanwhile) are dropped. The line itself is not read back: a look costs the same whatever
        its length."""
        ...

    def wait_until(self, key: str, task_id: str, wait: float) -> None:
        """Move a waiter's next look to `wait` seconds from now."""
        ...

    def wait_leave(self, key: str, task_id: str) -> None:
        """`task_id` got its quota: out of the queue, and one more call served to its group in the current share
        window (`engine.core.flow.recent_serves`, which every waiter's `served` is read with)."""
        ...

    def flow_rows(self) -> tuple[list[BreakerRow], list[QuotaRow], list[Waiter]]:
        """Every breaker, bucket and waiter, for `railyard status` and the metrics."""
        ...

    def waits_of(self, task_id: str) -> tuple[list[Waiter], float]:
        """Every waiter in the queues `task_id` waits in (none: it waits for no quota), for its place in line
        (`railyard show`, the task page), and the store's clock."""
        ...
