"""The auditor's reads over the store: replay, the state as of a point, and the path a task took.

The checks themselves are pure (`engine.core.replay`); this module only streams a
task's row, events and snapshots out of the store into them. Nothing here
builds a list of a task's events from the database: a log of any length is read
page by page (an archived task's log is read back from its file).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from engine.core.canonical import format_instant
from engine.core.chain import Finding
from engine.core.children import child_findings, parent_findings
from engine.core.definition import CHILD_TRIGGER_PREFIX, MIGRATE, SPAWN, SPAWNED, Child, Workflow
from engine.core.errors import Code, RailyardError, Refused
from engine.core.events import Event
from engine.core.fanout import join_findings
from engine.core.fold import Resolve, apply, fold, initial, migration_target, pinned_at_start
from engine.core.forks import origin_findings, repeat_hazard, writes
from engine.core.replay import LinkCheck, Lookup, OriginCheck, ReplayReport, replay_stream
from engine.core.task import TaskState
from engine.store import Snapshot, Store, TaskRow

#: An archived task's events, read back from its file (`Engine._archived_events`); [] when it is not archived.
Archived = Callable[[str], list[Event]]


def _not_found(task_id: str) -> Refused:
    return Refused(f"no task {task_id!r}", code=Code.TASK_NOT_FOUND, task_id=task_id)


def replay_task(store: Store, lookup: Lookup, task_id: str, archived: Archived | None = None) -> ReplayReport:
    """Replay one task from its first event; refuses only when there is no such task."""
    origin = origin_check(store, lookup, archived)
    links = link_check(store, lookup, archived)
    report = next(replay_stream(store.audit_stream(task_ids=[task_id]), lookup, origin, links), None)
    if report is None:
        raise _not_found(task_id)
    return report


def replay_tasks(
    store: Store,
    lookup: Lookup,
    *,
    task_ids: list[str] | None = None,
    workflow: str | None = None,
    since: datetime | None = None,
    archived: Archived | None = None,
) -> Iterator[ReplayReport]:
    """One report per task (of `task_ids`, of `workflow`, changed since `since`), in task id order, as each one
    is read. A fork's origin is checked against its source (in the database, or its archive with `archived`)."""
    return replay_stream(
        store.audit_stream(task_ids=task_ids, workflow=workflow, since=since),
        lookup,
        origin_check(store, lookup, archived),
        link_check(store, lookup, archived),
    )


def resolver(lookup: Lookup) -> Resolve:
    """`lookup` as a fold follows a log: a version the registry lacks, or holds with another digest, is refused."""

    def resolve(name: str, version: int, digest: str) -> Workflow:
        definition = lookup(name, version)
        if definition is None:
            raise Refused(f"the registry does not define {name}@{version}", code=Code.DEFINITION_MISSING)
        if definition.digest != digest:
            raise Refused(f"{name}@{version} changed since the task ran on it", code=Code.DEFINITION_CHANGED)
        return definition

    return resolve


def origin_check(store: Store, lookup: Lookup, archived: Archived | None = None) -> OriginCheck:
    """How replay checks a fork against its source: fold the source (its events in the database, or in its archive
    file) up to the seq the fork names, and judge the fork's claim against that (`core.forks.origin_findings`)."""
    resolve = resolver(lookup)
    files: Archived = archived if archived is not None else (lambda _task_id: [])

    def check(fork: Event) -> list[Finding]:
        claim = fork.data.get("forked_from")
        source_id = claim.get("task_id") if isinstance(claim, dict) else None
        seq = claim.get("seq") if isinstance(claim, dict) else None
        row = store.row(source_id) if isinstance(source_id, str) else None
        if row is None or type(seq) is not int or not 1 <= seq <= row.seq:
            return origin_findings(fork, None, None)
        try:
            found = state_as_of(store, resolve, files, row, seq=seq)
        except RailyardError as error:  # a source whose own log is broken, or whose version is gone: its report says
            code = Code.FORK_ORIGIN_MISSING if error.code is Code.ARCHIVE_MISSING else error.code
            return [Finding(code, 1, f"source {source_id} cannot be folded to seq {seq}: {error.message}")]
        except (ValueError, KeyError, TypeError, AttributeError):
            return origin_findings(fork, None, None)
        findings = origin_findings(fork, found.event, found.task)
        if findings:
            return findings
        problem = _fork_refused(store, resolve, files, row, seq, fork, found.task)
        if problem is not None:
            findings = [Finding(Code.FORK_ORIGIN_MISMATCH, 1, f"a fork the engine refuses: {problem}")]
        return findings

    return check


def link_check(store: Store, lookup: Lookup, archived: Archived | None = None) -> LinkCheck:
    """How replay checks the links between a parent and its children both ways: read the other task's log (in the
    database, or its archive file) and judge with `engine.core.children` (`parent_findings`, `child_findings`)."""
    files: Archived = archived if archived is not None else (lambda _task_id: [])

    def log_of(task_id: object) -> list[Event] | None:
        if not isinstance(task_id, str) or store.row(task_id) is None:
            return None
        return store.events(task_id) or files(task_id)

    return links_in(log_of, lookup)


def links_in(log_of: Callable[[object], list[Event] | None], lookup: Lookup) -> LinkCheck:
    """The link check over logs `log_of` reads (None: no such task): the database's (`link_check`), or an
    export's (`engine.audit.export`, over the logs the file holds)."""
    resolve = resolver(lookup)

    def check(event: Event, rules: Workflow | None) -> list[Finding]:
        if event.seq == 1 and "parent" in event.data:
            link = event.data["parent"]
            return parent_findings(event, log_of(link.get("task_id") if isinstance(link, dict) else None))
        if event.trigger != SPAWNED and not event.trigger.startswith(CHILD_TRIGGER_PREFIX):
            return []
        if "fan_out" in event.data:
            return fan_out_check(event, rules)
        return one_child(event, rules)

    def one_child(event: Event, rules: Workflow | None) -> list[Finding]:
        record = event.data.get("child")
        child_id = record.get("task_id") if isinstance(record, dict) else None
        child = log_of(child_id)
        final = None
        seq = record.get("seq") if isinstance(record, dict) else None
        if child and event.trigger != SPAWNED and type(seq) is int:
            upto = [e for e in child if e.seq <= seq]
            try:
                final = fold(
                    resolve(*pinned_at_start(str(child[0].data.get("workflow", "")).rpartition("@")[0], upto)),
                    upto,
                    resolve=resolve,
                )
            except (RailyardError, ValueError, KeyError, TypeError, AttributeError):
                final = None  # the child's own replay says why its log does not fold
        return child_findings(event, rules, child, final)

    def fan_out_check(event: Event, rules: Workflow | None) -> list[Finding]:
        """A fan-out's `spawned` or end: every child it names is judged as a single child's would be, then the
        end's join against its intent and the recorded ends."""
        fan: dict[str, Any] = dict(event.data["fan_out"])
        findings: list[Finding] = []
        source = event.from_state or ""
        state = rules.state(source) if rules is not None and rules.has_state(source) else None
        for record in fan.get("children", []):
            # Each child as the one a single child state names: its end's trigger is the one its own end would have
            # (the fan-out routes on the join, judged below), so the check holds the child's link, seq, hash, result.
            trigger = event.trigger
            if event.trigger != SPAWNED and isinstance(record, dict) and isinstance(state, Child):
                trigger = state.route_of("" if "code" in record else str(record.get("state")))
            findings.extend(one_child(replace(event, trigger=trigger, data={"child": record}), rules))
        if event.trigger != SPAWNED:
            own = log_of(event.task_id) or []
            action_id = fan.get("action_id")
            spawn = next((e for e in own if e.trigger == SPAWN and _fan_out_action(e) == action_id), None)
            findings.extend(join_findings(event, rules, spawn))
        return findings

    return check


def _fan_out_action(event: Event) -> object:
    """The action id of the fan-out an event records, or None."""
    fan = event.data.get("fan_out")
    return fan.get("action_id") if isinstance(fan, dict) else None


def _fork_refused(
    store: Store, resolve: Resolve, files: Archived, row: TaskRow, seq: int, fork: Event, carried: TaskState
) -> str | None:
    """The engine's write rules for a fork (`Engine.fork`), judged again from the source's log as it stood when
    the fork was made: the source had ended, and no write it made or may have made lies after the fork's seq."""
    try:
        then = state_as_of(store, resolve, files, row, at=fork.at)
    except (RailyardError, ValueError, KeyError, TypeError, AttributeError):
        return "the source's log before the fork cannot be folded"
    if not then.task.terminal:
        return f"the source was still running (in {then.task.state!r}) when it was forked"
    logged = [e for e in task_logs(store, files, task_ids=[row.task_id]) if isinstance(e, Event) and e.at <= fork.at]
    held = carried.prepared["action_id"] if carried.prepared is not None else None
    return repeat_hazard(writes(logged, seq), seq, held, source_live=False)


def task_logs(
    store: Store,
    archived: Archived,
    *,
    task_ids: list[str] | None = None,
    workflow: str | None = None,
    since: datetime | None = None,
    upto_seq: int | None = None,
) -> Iterator[TaskRow | Event]:
    """Task rows, each followed by its events: from the database, or from its archive file once archived.

    What export, as-of and the path on the diagram read: an archived task keeps only
    its row in the database (`railyard archive`), and its log is still its log.
    """
    bare: TaskRow | None = None  # a row no event has followed yet
    for item in store.audit_stream(
        task_ids=task_ids, workflow=workflow, since=since, with_snapshots=False, upto_seq=upto_seq
    ):
        if isinstance(item, Snapshot):
            continue
        if isinstance(item, TaskRow):
            if bare is not None:
                yield from _archived_upto(archived, bare, upto_seq)
            bare = item
        else:
            bare = None
        yield item
    if bare is not None:
        yield from _archived_upto(archived, bare, upto_seq)


def _archived_upto(archived: Archived, row: TaskRow, upto_seq: int | None) -> Iterator[Event]:
    for event in archived(row.task_id):
        if upto_seq is not None and event.seq > upto_seq:
            return
        yield event


@dataclass(frozen=True, slots=True)
class AsOf:
    """A task's state right after event `seq`, and that event (its time, its actor)."""

    task: TaskState
    event: Event


def state_as_of(
    store: Store,
    resolve: Resolve,
    archived: Archived,
    row: TaskRow,
    *,
    seq: int | None = None,
    at: datetime | None = None,
) -> AsOf:
    """Fold the log up to `seq`, or up to the last event written at or before `at` (default: the head).

    Each event is folded under the version the task was on when it was written
    (`resolve` refuses a missing or changed one). A point outside the log is the
    caller's mistake (ValueError), not a domain refusal.
    """
    if seq is not None and at is not None:
        raise ValueError("give a seq or a time, not both")
    if at is not None:
        seq = store.seq_at(row.task_id, at)
        if seq is None:  # no event in the database that early: the log may be in an archive file
            seq = max((e.seq for e in archived(row.task_id) if e.at <= at), default=None)
        if seq is None:
            raise ValueError(f"task {row.task_id} has no event at or before {format_instant(at)}")
    if seq is None:
        seq = row.seq
    if not 1 <= seq <= row.seq:
        raise ValueError(f"task {row.task_id} has events 1 to {row.seq}; there is no seq {seq}")
    task: TaskState | None = None
    last: Event | None = None
    definition: Workflow | None = None
    for item in task_logs(store, archived, task_ids=[row.task_id], upto_seq=seq):
        if not isinstance(item, Event):
            continue
        if task is None or definition is None:
            definition = resolve(*pinned_at_start(row.workflow, [item]))
            task = initial(definition, item)
        else:
            if item.trigger == MIGRATE:
                definition = migration_target(task, item, resolve)
            task = apply(definition, task, item)
        last = item
    if task is None or last is None or task.seq != seq:
        raise ValueError(f"task {row.task_id} has no event at seq {seq}")
    return AsOf(task, last)


def path_visits(events: Iterable[Event]) -> tuple[Counter[tuple[str, str, str]], str | None]:
    """How often the task took each (source, trigger, target) edge, and the state it ended in."""
    visits: Counter[tuple[str, str, str]] = Counter()
    current: str | None = None
    for event in events:
        if event.from_state is not None:
            visits[(event.from_state, event.trigger, event.to_state)] += 1
        current = event.to_state
    return visits, current


def task_path(
    store: Store, archived: Archived, task_id: str
) -> tuple[TaskRow, Counter[tuple[str, str, str]], str | None]:
    """The task's row and `path_visits` of its whole log, read as a stream."""
    items = task_logs(store, archived, task_ids=[task_id])
    row = next(items, None)
    if not isinstance(row, TaskRow):
        raise _not_found(task_id)
    visits, current = path_visits(item for item in items if isinstance(item, Event))
    return row, visits, current
