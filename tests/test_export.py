"""Export and offline verification on SQLite and PostgreSQL: a clean export verifies, and changing any single byte
of it, or a line, or the definitions it is checked against, is found."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from engine import Engine, Registry, ReplayReport
from engine.audit.export import FORMAT, export_lines, verify_export
from tests.support.sample_workflows import all_workflows

MakeEngine = Callable[..., Engine]
ORDER = {"customer": "c1", "balance": 500}
LOOKUP = Registry(all_workflows()).find


def exported(eng: Engine, task_ids: list[str] | None = None) -> bytes:
    items = eng.store.audit_stream(task_ids=task_ids, with_snapshots=False)
    return "".join(export_lines(items)).encode("utf-8")


def verify(data: bytes, lookup: Callable[[str, int], object] = LOOKUP) -> list[ReplayReport]:
    return list(verify_export(data.splitlines(keepends=True), lookup))  # type: ignore[arg-type]


def findings(reports: list[ReplayReport]) -> list[tuple[str, str, int]]:
    return [(r.task_id, str(f.code), f.seq) for r in reports for f in r.findings]


def two_tasks(eng: Engine) -> tuple[str, str]:
    first = eng.start("refund", ORDER, actor="ann", version=1)
    eng.fire(first, "note", {"note": "Grüße, ünïcode ✓"}, actor="model")
    eng.fire(first, "propose", {"amount": 300, "reason": "damaged"}, actor="model")
    eng.fire(first, "approve", {}, actor="dana")
    eng.transition(eng.load(first), "succeeded", {}, actor="tool-runner", system=True)
    second = eng.start("counter", {}, actor="ann")
    eng.fire(second, "tick", {"n": 1}, actor="model")
    return first, second


def test_an_export_round_trips_through_verify(eng: Engine) -> None:
    first, second = two_tasks(eng)
    data = exported(eng)
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["kind"] for line in lines].count("task") == 2
    assert lines[-1] == {"kind": "end", "format": FORMAT, "tasks": 2, "events": 7}
    header = next(line for line in lines if line["kind"] == "task" and line["task_id"] == first)
    assert (header["state"], header["seq"], header["workflow"], header["version"]) == ("completed", 5, "refund", 1)
    assert sum(1 for line in lines if line["kind"] == "event" and line["task_id"] == first) == 5
    reports = verify(data)
    assert findings(reports) == []
    assert sorted((r.task_id, r.events) for r in reports if r.task_id) == sorted([(first, 5), (second, 2)])
    assert verify(exported(eng, [first]))[0].events == 5


def test_every_single_flipped_byte_is_found(eng: Engine) -> None:
    first, _ = two_tasks(eng)
    data = exported(eng, [first])
    missed = []
    for position in range(len(data)):
        for bit in (0x01, 0x20):
            changed = bytearray(data)
            changed[position] ^= bit
            if not findings(verify(bytes(changed))):
                missed.append((position, bit, data[max(0, position - 20) : position + 20]))
    assert missed == []


def test_a_changed_value_is_reported_with_its_code(eng: Engine) -> None:
    first, _ = two_tasks(eng)
    data = exported(eng, [first])
    edited = findings(verify(data.replace(b'"amount":300', b'"amount":30')))
    assert ("HASH_MISMATCH", 3) in [(c, s) for _, c, s in edited]
    lines = data.splitlines(keepends=True)
    without = b"".join(line for i, line in enumerate(lines) if i != 3)  # the third event
    assert {"SEQ_GAP", "HASH_MISMATCH"} <= {c for _, c, _ in findings(verify(without))}
    assert "STATE_MISMATCH" in {
        c for _, c, _ in findings(verify(data.replace(b'"state":"completed"', b'"state":"executing"')))
    }
    assert findings(verify(b"".join(lines[:-1]))) == [("", "SEQ_GAP", 0)]  # cut short: no end line


def test_an_export_is_checked_against_the_definitions_it_is_given(eng: Engine) -> None:
    first, _ = two_tasks(eng)
    data = exported(eng, [first])
    assert [c for _, c, _ in findings(verify(data, Registry([]).find))] == ["DEFINITION_MISSING"]


@pytest.mark.parametrize("bad", [b"", b"not json\n", b'{"kind":"task"}\n', b"[1,2]\n"])
def test_garbage_is_reported_not_raised(bad: bytes) -> None:
    assert findings(verify(bad))


def test_an_archived_task_is_exported_shown_as_of_and_drawn_from_its_file(db_url: str, tmp_path: Path) -> None:
    from engine import StaticRoles
    from engine.core.canonical import now
    from tests.support.sample_workflows import ROLES

    with Engine(
        db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES), archive_dir=tmp_path / "archive"
    ) as eng:
        first, second = two_tasks(eng)
        eng.cancel(second, actor="ann", reason="done")
        live = {seq: eng.audit.as_of(first, seq) for seq in range(1, 6)}
        before = exported(eng, [first])
        path = eng.audit.path(first)
        assert eng.audit.archive(now() + timedelta(seconds=1)).tasks == 2
        assert eng.store.events(first) == []  # only the tombstone row is left in the database
        assert b"".join(export_lines_of(eng, [first])) == before
        assert findings(verify(b"".join(export_lines_of(eng, None)))) == []
        for seq, state in live.items():
            assert eng.audit.as_of(first, seq) == state
        at = eng.audit.as_of_event(first, 3).event.at
        assert eng.audit.as_of(first, at=at).seq == 3
        assert eng.audit.path(first) == path


def export_lines_of(eng: Engine, task_ids: list[str] | None) -> list[bytes]:
    return [line.encode("utf-8") for line in export_lines(eng.audit.logs(task_ids))]
