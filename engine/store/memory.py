"""The store in the process's memory: the same logs, conflicts and leases as the SQL store, behind one lock.

For unit tests of the runners (no database file each) and for trying Railyard
out (`memory://`: each such store starts empty and ends with its process). It
keeps rows the way the database does (event data as the canonical JSON text that
was hashed, times in UTC) and reads them back through the same decoding, so the
events it returns are the ones a SQL store would return, hash for hash.
The store contract (`tests/test_store_*.py`) runs the same checks on it as on SQLite and
PostgreSQL. Nothing is durable, and no other process can see it: workers poll it
(`supports_notify` is false) and replay runs in one process (`supports_fork`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from engine.core.canonical import canonical_json, now, parse_instant, utc
from engine.core.checkpoints import Head, Header
from engine.core.errors import Code, StoreError
from engine.core.events import Event, with_stored_data
from engine.core.remarks import REMARKS
from engine.core.rows import ArchiveRef, Claim, Loaded, Snapshot, TaskRow, WorkerReport
from engine.core.timers import handed_back, still_due
from engine.core.webhooks import Outgoing
from engine.store.decode import audit_data, stored_data
from engine.store.memory_flow import MemoryFlow
from engine.store.memory_people import MemoryPeople
from engine.store.memory_webhooks import MemoryWebhooks
from engine.store.protocol import (
    AUDIT_PAGE,
    NO_DEADLINE,
    ListedTask,
    QueuedTask,
    QueueQuery,
    TaskQuery,
    Wakeups,
    WorkClaim,
    conflict,
    key_refused,
)


class _Stored(NamedTuple):
    """An `events` row of one task."""

    seq: int
    at: datetime
    actor: str
    from_state: str | None
    trigger: str
    to_state: str
    data: str
    prev_hash: str
    hash: str


@dataclass(slots=True)
class _Task:
    """A `tasks` row, with the task's events (in seq order) and snapshots (seq: hash, doc)."""

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
    next_run_at: datetime | None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    lease_epoch: int = 0
    failures: int = 0
    archived_at: datetime | None = None
    archive_file: str | None = None
    archive_sha256: str | None = None
    started_by: str = ""
    tenant: str | None = None
    priority: int | None = None
    fields: dict[str, str] = field(default_factory=dict)
    events: list[_Stored] = field(default_factory=list)
    snapshots: dict[int, tuple[str, str]] = field(default_factory=dict)

    def row(self) -> TaskRow:
        return TaskRow(
            self.task_id,
            self.workflow,
            self.version,
            self.digest,
            self.state,
            self.status,
            self.seq,
            self.last_hash,
            self.created_at,
            self.updated_at,
            self.next_run_at,
            self.lease_owner,
            self.lease_expires_at,
            self.lease_epoch,
            self.failures,
            self.tenant,
            self.priority,
        )

    def head(self) -> TaskRow:
        """The row as `load` and the audit reads return it: the head of the log, without lease or schedule."""
        return TaskRow(
            self.task_id,
            self.workflow,
            self.version,
            self.digest,
            self.state,
            self.status,
            self.seq,
            self.last_hash,
            self.created_at,
            self.updated_at,
            tenant=self.tenant,
        )

    def archive(self) -> ArchiveRef:
        assert self.archive_file is not None and self.archive_sha256 is not None and self.archived_at is not None
        return ArchiveRef(self.task_id, self.archive_file, self.archive_sha256, self.archived_at)

    def event(self, e: _Stored) -> Event:
        return Event(
            self.task_id,
            e.seq,
            e.at,
            e.actor,
            e.from_state,
            e.trigger,
            e.to_state,
            stored_data(e.data, self.task_id, e.seq),
            e.prev_hash,
            e.hash,
        )

    def snapshot_list(self) -> list[Snapshot]:
        return [Snapshot(self.task_id, seq, *self.snapshots[seq]) for seq in sorted(self.snapshots)]


class MemoryStore(MemoryFlow, MemoryWebhooks, MemoryPeople):
    """Task logs in memory, with the semantics of `SqlStore`. Thread-safe: every verb holds one lock."""

    supports_notify = False
    supports_fork = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, _Task] = {}
        self._workers: dict[str, tuple[WorkerReport, str]] = {}  # a report and its counts as text
        self._checkpoints: list[tuple[Header, str]] = []
        MemoryFlow.__init__(self)
        MemoryWebhooks.__init__(self)
        MemoryPeople.__init__(self)
        self._claims: dict[str, WorkClaim] = {}

    def close(self) -> None:
        """Nothing to release: the data stays as long as the store object does."""

    # -- writes ---------------------------------------------------------
    def create(
        self, row: TaskRow, first: Event, fields: Mapping[str, str] | None = None, outbox: Sequence[Outgoing] = ()
    ) -> None:
        with self._lock:
            if row.task_id in self._tasks or first.task_id != row.task_id:
                raise key_refused(f"task {row.task_id} exists")
            task = _Task(
                row.task_id,
                row.workflow,
                row.version,
                row.digest,
                row.state,
                row.status,
                row.seq,
                row.last_hash,
                utc(row.created_at),
                utc(row.updated_at),
                _utc_or_none(row.next_run_at),
                started_by=first.actor,
                tenant=row.tenant,
                priority=row.priority,
                fields=dict(fields or {}),
            )
            task.events.append(_stored(first))
            self._tasks[row.task_id] = task
            self._enqueue_locked(outbox)

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
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.seq != expected_seq:
                raise conflict(task_id, expected_seq, None, _found(task))
            if event.task_id != task_id or any(e.seq == event.seq for e in task.events):
                raise key_refused(f"event {event.seq} of {task_id} exists")
            task.seq, task.state, task.status, task.last_hash = event.seq, event.to_state, status, event.hash
            task.updated_at, task.next_run_at = now(), _utc_or_none(next_run_at)
            task.version, task.digest = version, digest
            _insert(task.events, _stored(event))

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
        if not new_events:
            raise ValueError("append needs at least one event")
        for offset, ev in enumerate(new_events, start=1):
            if ev.task_id != task_id or ev.seq != expected_seq + offset:
                raise ValueError(f"event {ev.seq} of {ev.task_id} does not follow seq {expected_seq} of {task_id}")
        with self._lock:
            task = self._tasks.get(task_id)
            if (
                task is None
                or task.seq != expected_seq
                or (lease_epoch is not None and task.lease_epoch != lease_epoch)
            ):
                raise conflict(task_id, expected_seq, lease_epoch, _found(task))
            if task.events and task.events[-1].seq > expected_seq:
                raise key_refused(f"events after seq {expected_seq} of {task_id} exist")
            if snapshot is not None and snapshot[0] in task.snapshots:
                raise key_refused(f"a snapshot at seq {snapshot[0]} of {task_id} exists")
            last = new_events[-1]
            task.seq, task.state, task.status, task.last_hash = last.seq, last.to_state, status, last.hash
            task.updated_at = now()
            task.next_run_at = still_due(task.next_run_at, _utc_or_none(next_run_at), task.updated_at)
            if status == "terminal":  # a task that ends drops its lease (and its failed steps) in the same write
                task.lease_owner = task.lease_expires_at = None
                task.failures = 0
            task.events.extend(_stored(e) for e in new_events)
            if snapshot is not None:
                seq, digest, doc = snapshot
                task.snapshots[seq] = (digest, doc)
            self._enqueue_locked(outbox)

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
        at = utc(at or now())
        until = at + timedelta(seconds=lease_seconds)
        only = set(workflows) if workflows else None
        with self._lock:
            due = sorted(
                (
                    t
                    for t in self._tasks.values()
                    if t.status != "terminal"
                    and t.next_run_at is not None
                    and t.next_run_at <= at
                    and (t.lease_expires_at is None or t.lease_expires_at < at)
                    and (only is None or t.workflow in only)
                ),
                key=lambda t: t.next_run_at or at,
            )[: max(limit, 0)]
            claimed = []
            for task in due:
                task.lease_owner, task.lease_expires_at, task.lease_epoch = owner, until, task.lease_epoch + 1
                assert task.next_run_at is not None
                claimed.append(Claim(task.task_id, task.lease_epoch, task.next_run_at))
            return claimed

    def heartbeat(self, owner: str, task_ids: Sequence[str], *, lease_seconds: float) -> frozenset[str]:
        until = now() + timedelta(seconds=lease_seconds)
        held = set()
        with self._lock:
            for task_id in set(task_ids):
                task = self._tasks.get(task_id)
                if task is not None and task.lease_owner == owner:
                    task.lease_expires_at = until
                    held.add(task_id)
        return frozenset(held)

    def release(self, task_id: str, epoch: int, *, step_succeeded: bool = True) -> None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None and task.lease_epoch == epoch:
                task.lease_owner = task.lease_expires_at = None
                task.next_run_at = handed_back(task.next_run_at, now())
                if step_succeeded:
                    task.failures = 0

    def postpone(self, task_id: str, epoch: int, until: datetime, *, failed: bool = False) -> int:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return 0
            if task.lease_epoch == epoch:
                task.next_run_at = utc(until)
                if failed:
                    task.failures += 1
            return task.failures

    def wake(self, task_id: str, state: str, at: datetime) -> bool:
        at = utc(at)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None or task.state != state or task.status != "blocked":
                return False
            if task.next_run_at is None or task.next_run_at > at:
                task.next_run_at = at
            return True

    # -- archive --------------------------------------------------------
    def archivable(self, before: datetime, *, limit: int) -> list[TaskRow]:
        before = utc(before)
        with self._lock:
            found = [
                t
                for t in self._tasks.values()
                if t.status == "terminal" and t.updated_at < before and t.archived_at is None
            ]
            found.sort(key=lambda t: (t.updated_at, t.task_id))
            return [t.row() for t in found[: max(limit, 0)]]

    def mark_archived(self, archived: Sequence[tuple[str, int]], file: str, sha256: str) -> int:
        at = now()
        moved = 0
        with self._lock:
            for task_id, seq in archived:
                task = self._tasks.get(task_id)
                if task is None or task.seq != seq or task.status != "terminal" or task.archived_at is not None:
                    continue
                task.archived_at, task.archive_file, task.archive_sha256 = at, file, sha256
                task.events.clear()
                task.snapshots.clear()
                moved += 1
        return moved

    def archive_of(self, task_id: str) -> ArchiveRef | None:
        with self._lock:
            task = self._tasks.get(task_id)
            return task.archive() if task is not None and task.archived_at is not None else None

    def archived(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[tuple[TaskRow, ArchiveRef]]:
        since = _utc_or_none(since)
        with self._lock:
            found = [
                t
                for t in self._tasks.values()
                if t.archived_at is not None
                and (workflow is None or t.workflow == workflow)
                and (since is None or t.updated_at >= since)
            ]
            found.sort(key=lambda t: (t.archive_file or "", t.task_id))
            pairs = [(t.row(), t.archive()) for t in found]
        yield from pairs

    # -- reads ----------------------------------------------------------
    def row(self, task_id: str) -> TaskRow | None:
        with self._lock:
            task = self._tasks.get(task_id)
            return task.row() if task is not None else None

    def load(self, task_id: str) -> Loaded | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            below = [seq for seq in task.snapshots if seq <= task.seq]
            snap = Snapshot(task_id, max(below), *task.snapshots[max(below)]) if below else None
            start = snap.seq if snap is not None else 0
            tail = [task.event(e) for e in task.events if start < e.seq <= task.seq]
            return Loaded(task.head(), snap, tail)

    def load_many(self, task_ids: Sequence[str]) -> dict[str, Loaded]:
        found = {task_id: self.load(task_id) for task_id in task_ids}
        return {task_id: loaded for task_id, loaded in found.items() if loaded is not None}

    def events(self, task_id: str, after_seq: int = 0, upto_seq: int | None = None) -> list[Event]:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return []
            return [task.event(e) for e in task.events if e.seq > after_seq and (upto_seq is None or e.seq <= upto_seq)]

    def snapshots(self, task_id: str) -> list[Snapshot]:
        with self._lock:
            task = self._tasks.get(task_id)
            return task.snapshot_list() if task is not None else []

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
        """Like the SQL store's: keyset pages of task rows, each page read under the lock as one view."""
        if task_ids is not None and not task_ids:
            return
        ids = set(task_ids) if task_ids is not None else None
        since = _utc_or_none(since)
        after: str | None = None
        while True:
            items: list[TaskRow | Event | Snapshot] = []
            with self._lock:
                page = self._page(ids, after, workflow, since, page_size)
                for task in page:
                    items.append(task.head())
                    items.extend(_log(task, with_snapshots, from_seq, upto_seq))
            yield from items
            if len(page) < page_size:
                return
            after = page[-1].task_id

    def audit_pages(
        self, *, workflow: str | None = None, since: datetime | None = None, page_size: int = AUDIT_PAGE
    ) -> Iterator[list[str]]:
        since = _utc_or_none(since)
        after: str | None = None
        while True:
            with self._lock:
                ids = [t.task_id for t in self._page(None, after, workflow, since, page_size)]
            if ids:
                yield ids
            if len(ids) < page_size:
                return
            after = ids[-1]

    def _page(
        self, ids: set[str] | None, after: str | None, workflow: str | None, since: datetime | None, size: int
    ) -> list[_Task]:
        """A keyset page of tasks by id (the lock held)."""
        found = [
            t
            for t in self._tasks.values()
            if (ids is None or t.task_id in ids)
            and (after is None or t.task_id > after)
            and (workflow is None or t.workflow == workflow)
            and (since is None or t.updated_at >= since)
        ]
        found.sort(key=lambda t: t.task_id)
        return found[: max(size, 0)]

    def snapshot_seqs(self, task_id: str) -> list[int]:
        with self._lock:
            task = self._tasks.get(task_id)
            return sorted(task.snapshots) if task is not None else []

    def seq_at(self, task_id: str, at: datetime) -> int | None:
        at = utc(at)
        with self._lock:
            task = self._tasks.get(task_id)
            seqs = [e.seq for e in task.events if e.at <= at] if task is not None else []
            return max(seqs) if seqs else None

    def task_ids(self, *, workflow: str | None = None, status: str | None = None) -> list[str]:
        with self._lock:
            found = [
                t
                for t in self._tasks.values()
                if (workflow is None or t.workflow == workflow) and (status is None or t.status == status)
            ]
        found.sort(key=lambda t: (t.created_at, t.task_id))
        return [t.task_id for t in found]

    def task_ids_starting(
        self,
        prefix: str,
        *,
        limit: int = 2,
        workflows: Sequence[str] | None = None,
        tenants: Sequence[str] | None = None,
    ) -> list[str]:
        with self._lock:
            found = (
                i
                for i, t in self._tasks.items()
                if (workflows is None or t.workflow in workflows) and (tenants is None or t.tenant in tenants)
            )
            return sorted(i for i in found if i.startswith(prefix))[:limit]

    def recent(
        self, *, workflow: str | None = None, state: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[TaskRow]:
        with self._lock:
            found = [
                t.row()
                for t in self._tasks.values()
                if (not workflow or t.workflow == workflow)
                and (not state or t.state == state)
                and (not status or t.status == status)
            ]
        found.sort(key=lambda r: r.task_id)
        found.sort(key=lambda r: r.updated_at, reverse=True)  # stable: ties stay in task id order
        return found[: max(limit, 0)]

    def list_tasks(self, query: TaskQuery) -> list[ListedTask]:
        with self._lock:
            found = [t for t in self._tasks.values() if _selected(t, query)]
            if query.after is not None:
                last = self._tasks.get(query.after)
                cut = (last.created_at, last.task_id) if last is not None else None
                found = [t for t in found if cut is not None and (t.created_at, t.task_id) < cut]
            found.sort(key=lambda t: (t.created_at, t.task_id), reverse=True)
            return [ListedTask(t.row(), t.started_by, dict(sorted(t.fields.items()))) for t in found[: query.limit]]

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
        wanted = set(states)
        before = utc(waiting_before) if waiting_before is not None else None

        def key(t: _Task) -> tuple[datetime, datetime, str]:
            due = (t.next_run_at or NO_DEADLINE) if by_deadline else NO_DEADLINE
            return (utc(due), t.created_at, t.task_id)

        with self._lock:
            found = [
                t
                for t in self._tasks.values()
                if t.status == "blocked"
                and (t.workflow, t.version, t.state) in wanted
                and (before is None or t.updated_at < before)
                and (tenants is None or t.tenant in tenants)
            ]
            if after is not None:
                last = self._tasks.get(after)
                cut = key(last) if last is not None else None
                found = [t for t in found if cut is not None and key(t) > cut]
        found.sort(key=key)
        ids = [t.task_id for t in found]
        return ids if limit is None else ids[: max(limit, 0)]

    def status_counts(self, at: datetime | None = None) -> list[dict[str, Any]]:
        at = utc(at or now())
        groups: dict[tuple[str, str], list[_Task]] = {}
        with self._lock:
            for task in self._tasks.values():
                groups.setdefault((task.workflow, task.status), []).append(task)
            counts = []
            for (workflow, status), found in sorted(groups.items()):
                due = [t.next_run_at for t in found if t.next_run_at is not None and not _held(t, at)]
                counts.append(
                    {
                        "workflow": workflow,
                        "status": status,
                        "tasks": len(found),
                        "leased": sum(1 for t in found if _held(t, at)),
                        "oldest_due": min(due) if due else None,
                    }
                )
        return counts

    # -- the work queue: pages, counts, claims ----------------------------
    def _queued(self, query: QueueQuery) -> list[_Task]:
        wanted = set(query.places)
        before = utc(query.waiting_before) if query.waiting_before is not None else None
        searched = bool(query.id_prefix) or bool(query.field_value)
        return [
            t
            for t in self._tasks.values()
            if t.status == "blocked"
            and (t.workflow, t.version, t.state) in wanted
            and (before is None or t.updated_at < before)
            and (query.tenants is None or t.tenant in query.tenants)
            and (
                not searched
                or bool(query.id_prefix and t.task_id.startswith(query.id_prefix))
                or bool(query.field_value and query.field_value in t.fields.values())
            )
        ]

    def queue_page(self, query: QueueQuery) -> list[QueuedTask]:
        at = utc(query.at or now())

        def key(t: _Task) -> tuple[Any, datetime, str]:
            by: Any = {
                "deadline": utc(t.next_run_at or NO_DEADLINE),
                "waiting": t.updated_at,
                "created": t.created_at,
                "workflow": t.workflow,
                "state": t.state,
            }[query.sort]
            return (by, t.created_at, t.task_id)

        with self._lock:
            found = self._queued(query)
            if query.after is not None:
                last = self._tasks.get(query.after)
                cut = key(last) if last is not None else None
                found = [
                    t for t in found if cut is not None and ((key(t) < cut) if query.descending else (key(t) > cut))
                ]
            found.sort(key=key, reverse=query.descending)
            page = found[: max(query.limit, 0)]
            out = []
            for t in page:
                claim = self._claims.get(t.task_id)
                live = claim if claim is not None and claim.expires_at > at and claim.seq == t.seq else None
                head = t.event(t.events[-1]) if t.events and t.events[-1].seq == t.seq else None
                out.append(QueuedTask(t.row(), t.started_by, dict(sorted(t.fields.items())), head, live))
        return out

    def queue_counts(self, query: QueueQuery) -> dict[tuple[str, int, str], int]:
        counts: dict[tuple[str, int, str], int] = {}
        with self._lock:
            for t in self._queued(query):
                place = (t.workflow, t.version, t.state)
                counts[place] = counts.get(place, 0) + 1
        return counts

    def claim_work(
        self, task_id: str, actor: str, *, at: datetime, until: datetime, take_over: str | None = None
    ) -> WorkClaim | None:
        at = utc(at)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            held = self._claims.get(task_id)
            live = (
                held is not None
                and held.expires_at > at
                and not any(e.seq > held.seq and e.trigger not in REMARKS for e in task.events)
            )
            other = held.actor if live and held is not None and held.actor != actor else None
            if other is not None and take_over is None:
                return held
            claim = WorkClaim(task_id, actor, task.seq, at, utc(until), other, take_over if other is not None else None)
            self._claims[task_id] = claim
            return claim

    def release_work(self, task_id: str, actor: str) -> bool:
        with self._lock:
            held = self._claims.get(task_id)
            if held is None or held.actor != actor:
                return False
            del self._claims[task_id]
            return True

    def carry_claim(self, task_id: str, from_seq: int, to_seq: int) -> None:
        with self._lock:
            held = self._claims.get(task_id)
            if held is not None and held.seq == from_seq:
                self._claims[task_id] = replace(held, seq=to_seq)

    # -- checkpoints ----------------------------------------------------
    def heads(self) -> Iterator[Head]:
        with self._lock:
            found = [Head(t.task_id, t.seq, t.last_hash, t.tenant) for t in self._tasks.values()]
        found.sort(key=lambda h: h.task_id.encode())
        return iter(found)

    def log_heads(self) -> Iterator[tuple[Head, str | None]]:
        with self._lock:
            found = [
                (
                    Head(t.task_id, t.seq, t.last_hash, t.tenant),
                    next((e.hash for e in t.events if e.seq == t.seq), None),
                )
                for t in self._tasks.values()
            ]
        found.sort(key=lambda pair: pair[0].task_id.encode())
        return iter(found)

    def event_hashes(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
        found: dict[tuple[str, int], str] = {}
        with self._lock:
            for task_id, seq in keys:
                task = self._tasks.get(task_id)
                stored = next((e for e in task.events if e.seq == seq), None) if task is not None else None
                if stored is not None:
                    found[(task_id, seq)] = stored.hash
        return found

    def record_checkpoint(self, header: Header, file: str) -> None:
        with self._lock:
            if any(f == file for _, f in self._checkpoints):
                raise StoreError(f"a checkpoint in {file} is recorded", code=Code.DATABASE_ERROR)
            self._checkpoints.append((header, file))

    def last_checkpoint(self) -> tuple[Header, str] | None:
        with self._lock:
            ordered = sorted(self._checkpoints, key=lambda c: (parse_instant(c[0].at), c[0].tree_size))
        return ordered[-1] if ordered else None

    # -- worker reports -------------------------------------------------
    def report_worker(self, report: WorkerReport) -> None:
        """Insert or refresh a worker's row; a refresh changes what a heartbeat changes, not who the worker is."""
        counts = canonical_json(report.counts)  # as text, like the column: every reader gets its own copy
        with self._lock:
            known = self._workers.get(report.name)
            first = known[0] if known is not None else report
            self._workers[report.name] = (
                WorkerReport(
                    first.name,
                    first.host,
                    first.pid,
                    report.concurrency,
                    utc(first.started_at),
                    utc(report.seen_at),
                    _utc_or_none(report.stopped_at),
                    {},
                ),
                counts,
            )

    def workers(self, *, seen_since: datetime, stopped: bool = False) -> list[WorkerReport]:
        seen_since = utc(seen_since)
        with self._lock:
            found = [
                (w, c)
                for w, c in self._workers.values()
                if w.seen_at >= seen_since and (stopped or w.stopped_at is None)
            ]
        found.sort(key=lambda found: found[0].name)
        return [
            WorkerReport(
                w.name, w.host, w.pid, w.concurrency, w.started_at, w.seen_at, w.stopped_at, json.loads(counts)
            )
            for w, counts in found
        ]

    # -- capabilities ---------------------------------------------------
    def wakeups(self, wake: Callable[[], None], workflows: Sequence[str] | None = None) -> Wakeups:
        raise StoreError("the in-memory store sends no notifications: its workers poll", code=Code.DATABASE_ERROR)

    def after_fork(self) -> None:
        """Nothing to do: there are no connections (and replay never forks over this store)."""


def _stored(e: Event) -> _Stored:
    return _Stored(
        e.seq, utc(e.at), e.actor, e.from_state, e.trigger, e.to_state, canonical_json(e.data), e.prev_hash, e.hash
    )


def _insert(log: list[_Stored], e: _Stored) -> None:
    """Keep a task's events in seq order (a migrate event follows the last one; this only guards the order)."""
    log.append(e)
    if len(log) > 1 and log[-2].seq > e.seq:
        log.sort(key=lambda s: s.seq)


def _found(task: _Task | None) -> tuple[int, int] | None:
    return (task.seq, task.lease_epoch) if task is not None else None


def _selected(t: _Task, q: TaskQuery) -> bool:
    """Whether the task passes every filter of `q` (the SQL store's WHERE clause, in Python)."""
    searched = bool(q.id_prefix) or bool(q.field_value)
    found = bool(q.id_prefix and t.task_id.startswith(q.id_prefix)) or bool(
        q.field_value and q.field_value in t.fields.values()
    )
    return (
        (not q.workflow or t.workflow == q.workflow)
        and (q.workflows is None or t.workflow in q.workflows)
        and (q.tenants is None or t.tenant in q.tenants)
        and (not q.states or t.state in q.states)
        and (not q.status or t.status == q.status)
        and (not q.started_by or t.started_by == q.started_by)
        and (q.created_from is None or t.created_at >= utc(q.created_from))
        and (q.created_before is None or t.created_at < utc(q.created_before))
        and (not searched or found)
    )


def _utc_or_none(at: datetime | None) -> datetime | None:
    return utc(at) if at is not None else None


def _log(task: _Task, with_snapshots: bool, lower: int | None, upto: int | None) -> list[Event | Snapshot]:
    """A task's events (and snapshots) within the bounds, in log order: a snapshot right after its event."""

    def within(seq: int) -> bool:
        return (lower is None or seq >= lower) and (upto is None or seq <= upto)

    placed: list[tuple[int, int, Event | Snapshot]] = [
        (
            e.seq,
            0,
            with_stored_data(
                Event(
                    task.task_id,
                    e.seq,
                    e.at,
                    e.actor,
                    e.from_state,
                    e.trigger,
                    e.to_state,
                    audit_data(e.data),
                    e.prev_hash,
                    e.hash,
                ),
                e.data,
            ),
        )
        for e in task.events
        if within(e.seq)
    ]
    if with_snapshots:
        placed += [(seq, 1, Snapshot(task.task_id, seq, *doc)) for seq, doc in task.snapshots.items() if within(seq)]
    placed.sort(key=lambda p: (p[0], p[1]))
    return [item for _, _, item in placed]


def _held(task: _Task, at: datetime) -> bool:
    return task.lease_expires_at is not None and task.lease_expires_at > at
