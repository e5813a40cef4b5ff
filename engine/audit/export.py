"""Export task logs as JSON Lines, and verify an export offline with nothing but the file and the definitions.

The format (`railyard-export/1`), one canonical JSON object per line (sorted
keys, no whitespace, UTF-8, the same `canonical_json` that hashes events):

    {"kind":"task", "format":..., "task_id", "workflow", "version", "digest",
     "state", "status", "seq", "last_hash", "created_at"}      the task row
    {"kind":"event", "task_id", "seq", "at", "actor", "from_state", "trigger",
     "to_state", "data", "prev_hash", "hash"}                   one per event
    ...                                                         (next task)
    {"kind":"end", "format":..., "tasks": N, "events": M}       the last line

An event line holds every field its hash covers, so `verify_export` recomputes
each hash with the engine's own `chain_hash` and replays each task with the same
`LogCheck` the database replay uses. Because every line must be exactly the
canonical form of what it parses to, and every value is covered by a hash, the
fold or a count, changing any single byte of the file is found.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from engine.core.canonical import canonical_json, format_instant, parse_instant
from engine.core.chain import Finding
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import as_event_data
from engine.core.replay import LogCheck, Lookup, ReplayReport
from engine.store import Snapshot, TaskRow

FORMAT = "railyard-export/1"
_ROW_FIELDS = ("task_id", "workflow", "version", "digest", "state", "status", "seq", "last_hash", "created_at")
_EVENT_FIELDS = ("task_id", "seq", "at", "actor", "from_state", "trigger", "to_state", "data", "prev_hash", "hash")


def export_lines(items: Iterable[TaskRow | Event | Snapshot]) -> Iterator[str]:
    """The export of a `Store.audit_stream` (snapshots are a cache and are not exported), line by line."""
    tasks = events = 0
    for item in items:
        if isinstance(item, TaskRow):
            tasks += 1
            yield (
                canonical_json(
                    {
                        "kind": "task",
                        "format": FORMAT,
                        "task_id": item.task_id,
                        "workflow": item.workflow,
                        "version": item.version,
                        "digest": item.digest,
                        "state": item.state,
                        "status": item.status,
                        "seq": item.seq,
                        "last_hash": item.last_hash,
                        "created_at": format_instant(item.created_at),
                    }
                )
                + "\n"
            )
        elif isinstance(item, Event):
            events += 1
            yield canonical_json({"kind": "event", **item.to_dict()}) + "\n"
    yield canonical_json({"kind": "end", "format": FORMAT, "tasks": tasks, "events": events}) + "\n"


class _Unreadable(ValueError):
    """A line that is not what an export writes: its content was changed (or it was never an export)."""


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Unreadable(f"not UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise _Unreadable("not a JSON object")
    try:
        canonical = canonical_json(value)
    except (TypeError, ValueError):
        canonical = None
    if canonical != text:
        raise _Unreadable("not in the canonical form an export writes")
    return value


def _fields(value: dict[str, Any], names: tuple[str, ...], kind: str) -> None:
    if set(value) != {"kind", *names}:
        raise _Unreadable(f"a {kind} line with fields {sorted(value)}")


def _row(value: dict[str, Any]) -> TaskRow:
    _fields(value, (*_ROW_FIELDS, "format"), "task")
    if value["format"] != FORMAT:
        raise _Unreadable(f"format {value['format']!r}, expected {FORMAT!r}")
    created = _instant(value["created_at"])
    try:
        return TaskRow(
            str(value["task_id"]),
            str(value["workflow"]),
            _int(value["version"]),
            str(value["digest"]),
            str(value["state"]),
            str(value["status"]),
            _int(value["seq"]),
            str(value["last_hash"]),
            created,
            created,
        )
    except (TypeError, ValueError) as exc:
        raise _Unreadable(f"a task line with unusable values ({exc})") from None


def _event(value: dict[str, Any]) -> Event:
    _fields(value, _EVENT_FIELDS, "event")
    data = value["data"]
    if not isinstance(data, dict):
        raise _Unreadable("event data is not an object")
    from_state = value["from_state"]
    return Event(
        str(value["task_id"]),
        _int(value["seq"]),
        _instant(value["at"]),
        str(value["actor"]),
        None if from_state is None else str(from_state),
        str(value["trigger"]),
        str(value["to_state"]),
        as_event_data(data),
        str(value["prev_hash"]),
        str(value["hash"]),
    )


def _int(value: Any) -> int:
    if type(value) is not int:
        raise _Unreadable(f"{value!r} is not an integer")
    return value


def _instant(value: Any) -> Any:
    """A timestamp exactly as the export writes it; another spelling of the same instant is an edit too."""
    try:
        parsed = parse_instant(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None or format_instant(parsed) != value:
        raise _Unreadable(f"{value!r} is not a timestamp as exported")
    return parsed


def verify_export(lines: Iterable[bytes], lookup: Lookup) -> Iterator[ReplayReport]:
    """One report per task of an export file (its raw lines), then one for the file itself (task_id "").

    Each task is replayed as the database replay does: chain, seq, legality in its
    definitions, and the fold against its task line (whose `created_at` must be the
    start event's time). The file's own report holds what belongs to no task: lines
    outside a task, a missing or wrong trailer.
    """
    check: LogCheck | None = None
    legal: set[tuple[Any, ...]] = set()  # transitions found legal, remembered across the file's tasks
    created: Any = None
    file_findings: list[Finding] = []
    tasks = events = 0
    ended = False
    for number, raw in enumerate(lines, start=1):
        raw = raw.removesuffix(b"\n")
        if ended:
            file_findings.append(Finding(Code.SEQ_GAP, 0, f"line {number}: content after the end line"))
            continue
        try:
            value = _parse(raw)
            kind = value.get("kind")
            if kind == "task":
                if check is not None:
                    yield _finish(check, created)
                tasks += 1
                check, created = None, None
                row = _row(value)
                check, created = LogCheck(row, lookup, legal=legal), row.created_at
            elif kind == "event":
                events += 1
                event = _event(value)
                if check is None:
                    file_findings.append(
                        Finding(Code.SEQ_GAP, event.seq, f"line {number}: an event before any task line")
                    )
                    check = LogCheck(None, lookup, event.task_id, legal)
                elif event.task_id != check.task_id:
                    check.add(
                        Code.HASH_MISMATCH,
                        event.seq,
                        f"line {number}: an event of task {event.task_id} under the task line of {check.task_id}",
                    )
                check.event(event)
            elif kind == "end":
                ended = True
                if check is not None:
                    yield _finish(check, created)
                    check = None
                _fields(value, ("format", "tasks", "events"), "end")
                if (value["format"], value["tasks"], value["events"]) != (FORMAT, tasks, events):
                    file_findings.append(
                        Finding(
                            Code.SEQ_GAP,
                            0,
                            f"line {number}: the end line counts "
                            f"{value['tasks']} tasks and {value['events']} "
                            f"events, the file has {tasks} and {events}",
                        )
                    )
            else:
                raise _Unreadable(f"unknown line kind {kind!r}")
        except _Unreadable as why:
            where = f"line {number} cannot be read as an export line: {why}; its content was changed"
            if check is None:
                # An unreadable task line: the events that follow are still chain-checked.
                check = LogCheck(None, lookup, "", legal)
            check.add(Code.HASH_MISMATCH, check.expected_seq, where)
    if check is not None:
        yield _finish(check, created)
    if not ended:
        file_findings.append(Finding(Code.SEQ_GAP, 0, "the file ends without its end line: it was cut short"))
    yield ReplayReport("", "", 0, tuple(file_findings))


def _finish(check: LogCheck, created: Any) -> ReplayReport:
    first = check.first
    if created is not None and first is not None and first.at != created:
        check.add(
            Code.STATE_MISMATCH,
            1,
            f"the task line says it was created at {format_instant(created)}, "
            f"its start event is at {format_instant(first.at)}",
        )
    return check.finish()


def read_events(lines: Iterable[bytes], task_id: str) -> Iterator[Event]:
    """One task's events from an export, as written: for reading an archive back (`verify_export` proves it)."""
    for raw in lines:
        value = json.loads(raw)
        if value.get("kind") == "event" and value.get("task_id") == task_id:
            yield _event(value)
