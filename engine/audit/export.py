"""Export task logs as JSON Lines, and verify an export offline with nothing but the file and the definitions.

The format (`railyard-export/1`), one canonical JSON object per line (sorted
keys, no whitespace, UTF-8, the same `canonical_json` that hashes events):

    {"kind":"task", "format":..., "task_id", "workflow", "version", "digest",
     "state", "status", "seq", "last_hash", "created_at"}      the task row
    {"kind":"event", "task_id", "seq", "at", "actor", "from_state", "trigger",
     "to_state", "data", "prev_hash", "hash"}                   one per event
    ...                                                         (next task)
    {"kind":"end", "format":..., "tasks": N, "events": M}       the last line

An export made against a signed checkpoint (`export --checkpoint`) also has,
after each task line the checkpoint lists, one line with the RFC 6962 inclusion
proof of that task's head in the checkpoint's tree:

    {"kind":"proof", "task_id", "checkpoint": ROOT, "tree_size", "index",
     "seq", "hash", "path": [hex, ...]}

An export made for a reader (`railyard export --as ACTOR`) whose roles may not see
fields the workflow restricts (`engine.core.visibility`) shows them as
`[restricted]`, and each event line that withholds something says where:

    {"kind":"event", ..., "data": {... "[restricted]" ...}, "withheld": ["input.message", ...]}

Such a line's hash cannot be recomputed from what it shows: `verify_export`
still checks its seq, its link to the line before, its legality and the fold,
and reports the task's withheld events as one FIELDS_WITHHELD finding (exit 3).
Only an export made without `--as`, or as an auditor, proves every event.

An event line holds every field its hash covers, so `verify_export` recomputes
each hash with the engine's own `chain_hash` and replays each task with the same
`LogCheck` the database replay uses. Because every line must be exactly the
canonical form of what it parses to, and every value is covered by a hash, the
fold or a count, changing any single byte of the file is found.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from engine.audit.reads import links_in
from engine.core.canonical import canonical_json, format_instant, parse_instant
from engine.core.chain import Finding
from engine.core.checkpoints import Head, Header, inclusion_holds
from engine.core.definition import CHILD_TRIGGER_PREFIX, SPAWN, SPAWNED
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.payloads import as_event_data
from engine.core.replay import LogCheck, Lookup, OriginCheck, ReplayReport
from engine.core.visibility import Withholding
from engine.store import Snapshot, TaskRow

FORMAT = "railyard-export/1"
_ROW_FIELDS = ("task_id", "workflow", "version", "digest", "state", "status", "seq", "last_hash", "created_at")
_EVENT_FIELDS = ("task_id", "seq", "at", "actor", "from_state", "trigger", "to_state", "data", "prev_hash", "hash")


def export_lines(
    items: Iterable[TaskRow | Event | Snapshot],
    proofs: Callable[[str], dict[str, Any] | None] | None = None,
    showing: Callable[[TaskRow], Withholding | None] | None = None,
    tree: str | None = None,
) -> Iterator[str]:
    """The export of a `Store.audit_stream` (snapshots are a cache and are not exported), line by line.

    `tree`: the id of the task whose tree (it and its descendants, `Auditor.tree`) the items are; the end line
    names it, and `verify_export` then holds the file to hold the whole tree, every link checked both ways.

    `proofs(task_id)`: the proof line's fields for a task a checkpoint lists (`engine.audit.checkpoint.proofs`).
    `showing(row)`: what the reader the export is made for may not see of that task (None: all of it may be).
    """
    tasks = events = 0
    hidden: Withholding | None = None
    for item in items:
        if isinstance(item, TaskRow):
            hidden = showing(item) if showing is not None else None
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
                        # Only a task of a tenant has the field: exports of single-tenant installs are unchanged.
                        **({"tenant": item.tenant} if item.tenant is not None else {}),
                    }
                )
                + "\n"
            )
            proof = proofs(item.task_id) if proofs is not None else None
            if proof is not None:
                yield canonical_json({"kind": "proof", "task_id": item.task_id, **proof}) + "\n"
        elif isinstance(item, Event):
            events += 1
            line = {"kind": "event", **item.to_dict()}
            if hidden is not None:
                hidden.learn(item)
                data, withheld = hidden.data(item.data)
                if withheld:
                    line.update(data=dict(data), withheld=list(withheld))
            yield canonical_json(line) + "\n"
    end: dict[str, Any] = {"kind": "end", "format": FORMAT, "tasks": tasks, "events": events}
    if tree is not None:
        end["tree"] = tree
    yield canonical_json(end) + "\n"


class _Unreadable(ValueError):
    """A line that is not what an export writes: its content was changed (or it was never an export)."""


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
        value = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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


def _fields(value: dict[str, Any], names: tuple[str, ...], kind: str, optional: tuple[str, ...] = ()) -> None:
    if not {"kind", *names} <= set(value) <= {"kind", *names, *optional}:
        raise _Unreadable(f"a {kind} line with fields {sorted(value)}")


def _row(value: dict[str, Any]) -> TaskRow:
    _fields(value, (*_ROW_FIELDS, "format", *({"tenant"} & set(value))), "task")
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
            tenant=str(value["tenant"]) if "tenant" in value else None,
        )
    except (TypeError, ValueError) as exc:
        raise _Unreadable(f"a task line with unusable values ({exc})") from None


def _withheld(value: dict[str, Any]) -> tuple[str, ...]:
    """The paths an event line says it withholds (none for an event shown whole)."""
    if "withheld" not in value:
        return ()
    paths = value["withheld"]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise _Unreadable("an event line whose `withheld` is not a list of the paths it withholds")
    return tuple(paths)


def _event(value: dict[str, Any]) -> Event:
    _fields(value, (*_EVENT_FIELDS, "withheld") if "withheld" in value else _EVENT_FIELDS, "event")
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


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Unreadable(f"{value!r} is not a text")
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


#: The kinds of line an export holds.
KINDS = frozenset({"task", "event", "proof", "end"})


def is_export(lines: Iterable[bytes]) -> bool:
    """Whether a file is an export at all: some line of it is a JSON object of an export line's kind.

    A file that is not (empty, a text file, another program's JSON) is a file given by mistake, not an export
    whose content was changed: `verify_export` on it would report every line as an edit. An export with edited
    lines still has lines of its kinds, and its findings say which.
    """
    for raw in lines:
        try:
            value = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue
        if isinstance(value, dict) and value.get("kind") in KINDS:
            return True
    return False


def verify_export(
    lines: Iterable[bytes],
    lookup: Lookup,
    against: ExportCheck | None = None,
    origin: OriginCheck | None = None,
    *,
    tree: bool = False,
) -> Iterator[ReplayReport]:
    """One report per task of an export file (its raw lines), then one for the file itself (task_id "").

    Each task is replayed as the database replay does: chain, seq, legality in its
    definitions, and the fold against its task line (whose `created_at` must be the
    start event's time). The file's own report holds what belongs to no task: lines
    outside a task, a missing or wrong trailer.

    `against`: a signed checkpoint the export is held to (`ExportCheck`): each task's log must reach the head
    the checkpoint committed to, with a proof line that verifies against its root; tasks it lists and the
    export lacks are reported after the others. Without one, proof lines are still checked, against the roots
    they name (`ExportCheck.unanchored`): never skipped.

    Links between a parent and a child both in the file are checked both ways, as replay checks them
    (`engine.audit.reads.links_in`), once the file is read; their findings are in the file's report, naming the
    task. An export of a tree (its end line names the root, `export --tree`; `tree=True`: the verifier demands
    one) must hold the whole tree: a child its parent names that the file lacks is CHILD_MISSING, a task of the
    file that no parent in it started is CHILD_LINK_MISMATCH.
    """
    if against is None:
        against = ExportCheck.unanchored()
    check: LogCheck | None = None
    legal: set[tuple[Any, ...]] = set()  # transitions found legal, remembered across the file's tasks
    created: Any = None
    file_findings: list[Finding] = []
    tasks = events = 0
    ended = False
    exported: set[str] = set()  # a task id twice is two logs of one task: which one is true cannot be told
    links = _Links()
    root: str | None = None
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
                    yield _finish(check, created, against)
                tasks += 1
                check, created = None, None
                row = _row(value)
                check, created = LogCheck(row, lookup, legal=legal, origin=origin), row.created_at
                if row.task_id in exported:
                    check.add(Code.HASH_MISMATCH, 0, f"line {number}: task {row.task_id} appears a second time")
                exported.add(row.task_id)
                links.task(row)
            elif kind == "event":
                events += 1
                event, withheld = _event(value), _withheld(value)
                if check is None:
                    file_findings.append(
                        Finding(Code.SEQ_GAP, event.seq, f"line {number}: an event before any task line")
                    )
                    check = LogCheck(None, lookup, event.task_id, legal, origin)
                elif event.task_id != check.task_id:
                    check.add(
                        Code.HASH_MISMATCH,
                        event.seq,
                        f"line {number}: an event of task {event.task_id} under the task line of {check.task_id}",
                    )
                check.event(event, withheld)
                against.event(check.task_id, event)
                links.event(event)
            elif kind == "proof":
                if check is None or value.get("task_id") != check.task_id:
                    raise _Unreadable("a proof line that follows no task line of its task")
                against.proof_line(check, value)
            elif kind == "end":
                ended = True
                if check is not None:
                    yield _finish(check, created, against)
                    check = None
                _fields(value, ("format", "tasks", "events"), "end", ("tree",))
                root = str(value["tree"]) if "tree" in value else None
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
        yield _finish(check, created, against)
    if not ended:
        file_findings.append(Finding(Code.SEQ_GAP, 0, "the file ends without its end line: it was cut short"))
    if tree and root is None:
        file_findings.append(Finding(Code.CHILD_MISSING, 0, "the export is not of a tree: its end line names no root"))
    file_findings.extend(links.findings(lookup, root))
    yield from against.missing()
    yield ReplayReport("", "", 0, tuple(file_findings))


class _Links:
    """What of an export's logs its parent-child links are checked on, held while the file streams: a child's whole
    log (its end is folded), and of every other task its first event and the events that name a child. A file
    without children holds one event per task."""

    def __init__(self) -> None:
        self.rows: dict[str, TaskRow] = {}
        self.held: dict[str, list[Event]] = {}
        self._first: Event | None = None

    def task(self, row: TaskRow) -> None:
        self.rows[row.task_id] = row
        self._first = None

    def event(self, event: Event) -> None:
        if event.seq == 1:
            self._first = event
            if "parent" in event.data:
                self.held[event.task_id] = [event]
            return
        log = self.held.get(event.task_id)
        if log is not None and "parent" in log[0].data:
            log.append(event)
        elif _names_children(event) and (event.trigger in (SPAWN, SPAWNED) or _ends_child(event)):
            if log is None:
                log = self.held[event.task_id] = [self._first] if self._first is not None else []
            log.append(event)

    def findings(self, lookup: Lookup, root: str | None) -> Iterator[Finding]:
        """The links checked, each finding naming its task; with `root`, the tree's completeness too."""

        def log_of(task_id: object) -> list[Event] | None:
            return self.held.get(task_id, []) if isinstance(task_id, str) and task_id in self.rows else None

        check = links_in(log_of, lookup)
        if root is not None and root not in self.rows:
            yield Finding(Code.CHILD_MISSING, 0, f"the export is of the tree of {root}, and lacks that task")
        for task_id, log in self.held.items():
            row = self.rows.get(task_id)
            rules = lookup(row.workflow, row.version) if row is not None else None
            for event in log:
                others = _other_ends(event)
                if not others or (root is None and any(other not in self.rows for other in others)):
                    continue  # not a link, or one to a task outside a file that claims no tree
                for finding in check(event, rules):
                    yield Finding(finding.code, finding.seq, f"task {task_id}: {finding.message}")
        if root is not None:
            for task_id in self.rows:
                held = self.held.get(task_id)
                first = held[0] if held else None
                link = first.data.get("parent") if first is not None and first.seq == 1 else None
                if task_id != root and not (isinstance(link, dict) and link.get("task_id") in self.rows):
                    yield Finding(
                        Code.CHILD_LINK_MISMATCH,
                        1,
                        f"task {task_id}: in the export of the tree of {root}, and started by no task of it",
                    )


def _ends_child(event: Event) -> bool:
    return event.trigger.startswith(CHILD_TRIGGER_PREFIX)


def _names_children(event: Event) -> bool:
    """Whether an event records a child (`child`) or a fan-out's children (`fan_out`)."""
    return isinstance(event.data.get("child"), dict) or isinstance(event.data.get("fan_out"), dict)


def _other_ends(event: Event) -> list[str]:
    """The tasks a linking event names (a child's parent, a parent's child, a fan-out's children); none: it links
    to none the check reads (a `spawn`: its children are judged on `spawned` and their own first events; a
    fan-out's `spawn` is held for the join's check all the same)."""
    if event.seq == 1:
        link = event.data.get("parent")
        return [str(link.get("task_id"))] if isinstance(link, dict) else []
    if event.trigger == SPAWN:
        return []
    record, fan = event.data.get("child"), event.data.get("fan_out")
    if isinstance(record, dict):
        return [str(record.get("task_id"))]
    if isinstance(fan, dict) and isinstance(fan.get("children"), list):
        return [str(c.get("task_id")) for c in fan["children"] if isinstance(c, dict)]
    return []


class ExportCheck:
    """What an export's proof lines are held to. Three ways, from strongest:

    - `ExportCheck(header, heads, complete=...)`: a signed checkpoint and its heads (already verified): each
      task it lists must reach its head with a proof line in its root, and (if `complete`) none may be missing;
    - `ExportCheck(header, None, complete=False)`: a signed header alone (`head -1` of a checkpoint file):
      each proof line must prove its head in the signed root; which tasks it lists cannot be told;
    - `ExportCheck.unanchored()`: no checkpoint: each proof line is checked against the root it names, which
      shows only that the export agrees with itself.

    `proved` counts the proof lines read, `uncovered` the tasks that had none: what the caller says the check
    did not reach.
    """

    def __init__(
        self, header: Header | None, heads: dict[str, Head] | None, *, complete: bool, tenant: str | None = None
    ) -> None:
        self.header, self.heads, self.complete = header, heads, complete and heads is not None
        #: An export of one tenant (`export --tenant`): only the heads the checkpoint signed as that tenant's must be
        #: in it, and every task in it must be one of them.
        self.tenant = tenant
        self.seen: set[str] = set()
        self.proved = self.uncovered = 0
        self._proved: dict[str, Head] = {}
        #: Of the task being read: its last exported seq, and its events' hashes by seq at the heads proved.
        self._last_seq, self._hashes = 0, dict[int, str]()

    @classmethod
    def unanchored(cls) -> ExportCheck:
        return cls(None, None, complete=False)

    @property
    def anchored(self) -> bool:
        return self.header is not None

    def event(self, task_id: str, event: Event) -> None:
        self._last_seq = max(self._last_seq, event.seq)
        self._hashes[event.seq] = event.hash

    def proof_line(self, check: LogCheck, value: dict[str, Any]) -> None:
        _fields(value, ("task_id", "checkpoint", "tree_size", "index", "seq", "hash", "path"), "proof")
        # Every field as exported, its type too: `3.0` for a tree size of 3 is an edit, as it is anywhere else.
        # The tenant is the task line's: a proof holds only if the signed leaf names the same one.
        tenant = check.row.tenant if check.row is not None else None
        head = Head(check.task_id, _int(value["seq"]), _text(value["hash"]), tenant)
        given_size, given_root, index = _int(value["tree_size"]), _text(value["checkpoint"]), _int(value["index"])
        expected = self.heads.get(check.task_id) if self.heads is not None else head
        size, root = (self.header.tree_size, self.header.root) if self.header is not None else (given_size, given_root)
        path = value["path"]
        holds = (
            expected == head
            and (given_root, given_size) == (root, size)
            and isinstance(path, list)
            and all(isinstance(p, str) for p in path)
            and inclusion_holds(head, index, size, root, path)
        )
        if not holds:
            whose = "the checkpoint's root" if self.header is not None else "the root it names"
            check.add(Code.HEAD_REWRITTEN, head.seq, f"its proof line does not prove its head in {whose}")
        if check.task_id in self._proved:
            check.add(Code.HEAD_REWRITTEN, head.seq, "it has a second proof line")
        self._proved[check.task_id] = head
        self.proved += 1

    def finish(self, check: LogCheck) -> None:
        """The task's exported log against the head its proof line (or the checkpoint) committed to."""
        self.seen.add(check.task_id)
        tenant = check.row.tenant if check.row is not None else None
        if self.tenant is not None and tenant != self.tenant:
            check.add(Code.STATE_MISMATCH, 0, f"it is tenant {tenant!r}'s task, in an export of tenant {self.tenant!r}")
        proved = self._proved.pop(check.task_id, None)
        expected = self.heads.get(check.task_id) if self.heads is not None else proved
        last, hashes = self._last_seq, self._hashes
        self._last_seq, self._hashes = 0, {}
        if proved is None:
            self.uncovered += 1
        if expected is None:
            return
        if proved is None:
            check.add(Code.HEAD_REWRITTEN, expected.seq, "the checkpoint lists it, and the export has no proof line")
        if last < expected.seq:
            check.add(
                Code.TASK_TRUNCATED,
                last,
                f"its exported log ends at seq {last}; the checkpoint recorded seq {expected.seq}",
            )
        elif hashes.get(expected.seq) != expected.hash:
            check.add(Code.HEAD_REWRITTEN, expected.seq, f"event {expected.seq} is not the one the checkpoint recorded")

    def missing(self) -> Iterator[ReplayReport]:
        if not self.complete or self.heads is None:
            return
        for task_id, head in self.heads.items():
            if self.tenant is not None and head.tenant != self.tenant:
                continue
            if task_id not in self.seen:
                yield ReplayReport(
                    task_id,
                    "",
                    0,
                    (Finding(Code.TASK_MISSING, 0, f"the checkpoint lists it at seq {head.seq}; the export lacks it"),),
                )


def _finish(check: LogCheck, created: Any, against: ExportCheck) -> ReplayReport:
    against.finish(check)
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
