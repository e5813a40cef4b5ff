"""Replay split across processes: many tasks a page each, one long log a stretch between snapshots each.

Replay is CPU-bound Python (a hash, a fold and a legality check per event), so one
process checks as many events per second as one core allows; an auditor's machine
has more. The checks are `engine.core.replay`'s own; only the reading is split:

- `replay_pages`: the task ids of `replay --all` in keyset pages, one page per job,
  reports yielded in task id order with a bounded number of pages in flight, so
  memory stays flat however many tasks there are.
- `replay_long`: one task's log cut at snapshots. A stretch starts from the snapshot
  at its first seq (folded state, seq and hash) and checks its events up to the
  snapshot that ends it, which the next stretch starts from. Each snapshot is checked
  against the fold by the stretch that ends there, so by induction the stretches
  together check what one fold from zero checks. A stretch that finds anything makes
  the starting point of the next one untrustworthy, so then the whole log is replayed
  once more in one process, and that report is the answer: parallel replay never
  reports differently from serial replay.

Workers are forked (they inherit the registry, whose guards need not be picklable)
and never touch the parent's database connections.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, pairwise

from engine.audit.reads import Archived, link_check, origin_check, replay_tasks
from engine.core.chain import Finding
from engine.core.definition import FORK
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.fold import predates_effects
from engine.core.replay import LogCheck, Lookup, ReplayReport
from engine.core.task import TaskState
from engine.store import Snapshot, Store, TaskRow
from engine.store.protocol import AUDIT_PAGE

log = logging.getLogger("railyard.replay")

#: Below this many events a log is replayed in one process: starting workers costs more than it saves.
LONG_LOG = 20_000
#: Tasks per page handed to a job by `replay_pages` (the audit stream's own page size).
PAGE = AUDIT_PAGE
#: A long log is cut into about this many stretches per job (stretches differ in cost; more evens them out).
STRETCHES_PER_JOB = 8


def available_jobs() -> int:
    """How many processes replay can usefully run here: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def can_fork(store: Store) -> bool:
    """Whether jobs can run: forking is available and the store is one other processes can read."""
    return "fork" in multiprocessing.get_all_start_methods() and store.supports_fork


# -- in each worker process -------------------------------------------------------------------------------
#: The store and definitions a worker replays with (and where archived sources of forks are), set once when it starts.
_worker: tuple[Store, Lookup, Archived | None] | None = None


def _start_worker(store: Store, lookup: Lookup, archived: Archived | None = None) -> None:
    global _worker
    store.after_fork()  # this process opens its own connections from here on
    _worker = (store, lookup, archived)


#: A report as a job sends it back: its fields as a tuple, which pickles ten times faster than the record.
Sent = tuple[str, str, int, tuple[Finding, ...]]


def _replay_page(ids: list[str]) -> list[Sent]:
    assert _worker is not None
    store, lookup, archived = _worker
    reports = replay_tasks(store, lookup, task_ids=ids, archived=archived)
    return [(r.task_id, r.workflow, r.events, r.findings) for r in reports]


@dataclass(frozen=True, slots=True)
class Stretch:
    """Events `after + 1` to `upto` of a task; `after` is 0 (the start) or the seq of a snapshot.

    The last stretch (`upto` is the row's seq) goes on to whatever else is stored after it.
    """

    row: TaskRow
    after: int
    upto: int

    @property
    def last(self) -> bool:
        return self.upto == self.row.seq


@dataclass(frozen=True, slots=True)
class StretchResult:
    events: int
    findings: tuple[Finding, ...]


def _replay_stretch(stretch: Stretch) -> StretchResult:
    assert _worker is not None
    store, lookup, _archived = _worker
    # The last stretch reads to the end of what is stored, not to the row's seq: an event or snapshot past the
    # row's head is a finding, as it is for a serial replay.
    return check_stretch(
        stretch,
        store.audit_stream(
            task_ids=[stretch.row.task_id],
            from_seq=stretch.after or None,
            upto_seq=None if stretch.last else stretch.upto,
        ),
        lookup,
    )


def check_stretch(stretch: Stretch, items: Iterator[TaskRow | Event | Snapshot], lookup: Lookup) -> StretchResult:
    """Check one stretch from the audit stream of its seqs (the snapshot it starts from, and the event there)."""
    check = LogCheck(stretch.row, lookup)
    resumed = stretch.after == 0
    for item in items:
        if isinstance(item, TaskRow):
            continue
        if not resumed:
            if isinstance(item, Snapshot) and item.seq == stretch.after:
                resumed = _resume(check, item)
                if not resumed:
                    break
            continue  # the event at `after`: the stretch before checks it
        if isinstance(item, Event):
            check.event(item)
        else:
            check.snapshot(item)
    if not resumed:
        check.add(Code.SNAPSHOT_MISMATCH, stretch.after, "no readable snapshot where this stretch starts")
    if stretch.last:
        report = check.finish()
        return StretchResult(report.events, report.findings)
    if check.count != stretch.upto - stretch.after:
        check.add(Code.SEQ_GAP, stretch.upto, f"expected events {stretch.after + 1} to {stretch.upto}")
    return StretchResult(check.count, tuple(check.findings))


def _resume(check: LogCheck, snapshot: Snapshot) -> bool:
    try:
        doc = json.loads(snapshot.doc)
        if predates_effects(doc):
            return False
        task = TaskState.from_doc(doc)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    if task.seq != snapshot.seq or task.last_hash != snapshot.hash:
        return False
    return check.resume(task)


# -- in the process that asked --------------------------------------------------------------------------
def _pool(store: Store, lookup: Lookup, jobs: int, archived: Archived | None = None) -> ProcessPoolExecutor | None:
    """Forked jobs, or None where they cannot start (no semaphores in a container, say): then one process."""
    try:
        return ProcessPoolExecutor(
            jobs,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_worker,
            initargs=(store, lookup, archived),
        )
    except (OSError, ImportError, NotImplementedError) as exc:
        log.warning("replay jobs cannot start (%s); replaying in this process", exc)
        return None


def replay_pages(
    store: Store,
    lookup: Lookup,
    jobs: int,
    *,
    workflow: str | None = None,
    since: datetime | None = None,
    archived: Archived | None = None,
) -> Iterator[ReplayReport]:
    """`replay_tasks` with `jobs` processes: the same reports in the same order.

    A job that dies (killed, out of memory) costs only time: the pages not yet
    reported are replayed in this process.
    """
    pages = store.audit_pages(workflow=workflow, since=since, page_size=PAGE)
    first = next(pages, None)
    if first is None:
        return
    pool = _pool(store, lookup, jobs, archived) if len(first) == PAGE else None  # one page: workers cost more
    if pool is None:
        for ids in chain([first], pages):
            yield from replay_tasks(store, lookup, task_ids=ids, archived=archived)
        return
    window: deque[tuple[list[str], Future[list[Sent]]]] = deque()
    unsent: list[str] | None = None
    with pool:
        try:
            for ids in chain([first], pages):
                unsent = ids
                window.append((ids, pool.submit(_replay_page, ids)))
                unsent = None
                while len(window) > 2 * jobs:
                    yield from _first_done(window)
            while window:
                yield from _first_done(window)
            return
        except BrokenProcessPool as exc:
            log.warning("a replay job died (%s); replaying the remaining pages in this process", exc)
    rest = [ids for ids, _ in window] + ([unsent] if unsent is not None else [])
    for ids in chain(rest, pages):
        yield from replay_tasks(store, lookup, task_ids=ids, archived=archived)


def _first_done(window: deque[tuple[list[str], Future[list[Sent]]]]) -> list[ReplayReport]:
    """The oldest page's reports; the page leaves the window only once they are in hand."""
    reports = [ReplayReport(*sent) for sent in window[0][1].result()]
    window.popleft()
    return reports


def stretches(row: TaskRow, snapshot_seqs: list[int], jobs: int) -> list[Stretch]:
    """Cut `row`'s log at snapshots into about `jobs * STRETCHES_PER_JOB` stretches of similar length."""
    seqs = [s for s in snapshot_seqs if 0 < s < row.seq]
    wanted = max(1, jobs * STRETCHES_PER_JOB)
    size = max(1, row.seq // wanted)
    cuts: list[int] = []
    for seq in seqs:  # a cut leaves at least `size` events before it and half of that after it
        if seq - (cuts[-1] if cuts else 0) >= size and row.seq - seq >= size // 2:
            cuts.append(seq)
    bounds = [0, *cuts, row.seq]
    return [Stretch(row, a, b) for a, b in pairwise(bounds)]


def replay_long(
    store: Store, lookup: Lookup, row: TaskRow, jobs: int, archived: Archived | None = None
) -> ReplayReport | None:
    """One long log replayed in stretches by `jobs` processes.

    None when that says nothing for certain (a finding, a job that died or could not start): replay it serially.
    """
    parts = stretches(row, store.snapshot_seqs(row.task_id), jobs)
    if len(parts) < 2:
        return None
    pool = _pool(store, lookup, jobs)
    if pool is None:
        return None
    try:
        with pool:
            results = list(pool.map(_replay_stretch, parts))
    except BrokenProcessPool as exc:
        log.warning("a replay job died (%s); replaying task %s in this process", exc, row.task_id)
        return None
    if any(r.findings for r in results):
        return None
    first = store.events(row.task_id, 0, 1)
    if first and first[0].trigger == FORK and origin_check(store, lookup, archived)(first[0]):
        return None  # the stretches do not check where a fork came from: a finding there is reported serially
    if first and "parent" in first[0].data and link_check(store, lookup, archived)(first[0], None):
        return None  # nor a child's link to its parent
    return ReplayReport(row.task_id, f"{row.workflow}@{row.version}", sum(r.events for r in results), ())
