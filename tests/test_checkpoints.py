"""A database judged against a signed checkpoint, on SQLite and PostgreSQL, tampered with as an insider would.

Each tamper kind from issue #15 is made directly in SQL after a checkpoint (the append-only triggers go first:
`tests.support.insider.sql` works around them, as an owner of the database can). Replay alone does not see
these edits; against the checkpoint each is found with its code. The triggers themselves refuse a console's
UPDATE and DELETE.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, exc, text
from typer.testing import CliRunner

from engine import Code, Engine, MemoryStore, Registry, StaticRoles, Worker
from engine.audit.checkpoint import keygen, load_signing_key, read_header, write_signed
from engine.cli import EXIT_AUDIT, app
from engine.core.canonical import canonical_json
from engine.core.checkpoints import Header
from engine.core.events import seal
from engine.core.payloads import as_event_data
from tests.support.insider import sql
from tests.support.sample_workflows import ROLES, all_workflows

ORDER = {"customer": "c1", "balance": 500}
runner = CliRunner()


@pytest.fixture
def signer(tmp_path: Path) -> tuple[Path, str]:
    key = tmp_path / "signing.key"
    return key, keygen(key)


def started(eng: Engine, n: int = 4) -> list[str]:
    ids = []
    for _ in range(n):
        task_id = eng.start("refund", ORDER, actor="ann", version=1)
        eng.fire(task_id, "note", {"note": "customer called"}, actor="model")
        eng.fire(task_id, "propose", {"amount": 300, "reason": "damaged"}, actor="model")
        ids.append(task_id)
    return ids


def judged(eng: Engine, path: Path, public: str) -> dict[str, list[Code]]:
    _, reports = eng.audit.judge_checkpoint(path, public)
    return {r.task_id: [f.code for f in r.findings] for r in reports}


def step_back(url: str, task_id: str, to_seq: int) -> None:
    """Delete the task's events after `to_seq` and set its row back to that event: no hash to recompute."""
    with sql(url) as conn:
        last = conn.execute(
            text("SELECT to_state, hash FROM events WHERE task_id = :t AND seq = :s"), {"t": task_id, "s": to_seq}
        ).one()
        conn.execute(text("DELETE FROM snapshots WHERE task_id = :t AND seq > :s"), {"t": task_id, "s": to_seq})
        conn.execute(text("DELETE FROM events WHERE task_id = :t AND seq > :s"), {"t": task_id, "s": to_seq})
        conn.execute(
            text("UPDATE tasks SET seq = :s, state = :st, last_hash = :h, status = 'runnable' WHERE task_id = :t"),
            {"t": task_id, "s": to_seq, "st": last.to_state, "h": last.hash},
        )


def test_an_honest_database_holds_what_its_checkpoint_committed_to(
    eng: Engine, signer: tuple[Path, str], tmp_path: Path
) -> None:
    key, public = signer
    ids = started(eng)
    header, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    assert header.tree_size == len(ids) and path.exists()
    again, _, _ = eng.audit.checkpoint(key, tmp_path / "cp")  # nothing changed: the same root, a checkpoint of its own
    assert (again.root, again.previous_root) == (header.root, header.root)
    eng.fire(ids[0], "approve", {}, actor="dana")  # logs go on after it: they extend what it covered
    assert judged(eng, path, public) == {}
    last = eng.store.last_checkpoint()
    assert last is not None and last[0] == again


def test_truncating_a_task_and_setting_its_row_back_is_found_only_against_the_checkpoint(
    eng: Engine, db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    key, public = signer
    ids = started(eng)
    _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    step_back(db_url, ids[1], 2)
    assert all(r.ok for r in eng.audit.replay_all())  # the log still proves its (shorter) state
    assert judged(eng, path, public) == {ids[1]: [Code.TASK_TRUNCATED]}


def test_deleting_a_whole_task_is_found(eng: Engine, db_url: str, signer: tuple[Path, str], tmp_path: Path) -> None:
    key, public = signer
    ids = started(eng)
    _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    with sql(db_url) as conn:
        for table in ("snapshots", "events", "tasks"):
            conn.execute(text(f"DELETE FROM {table} WHERE task_id = :t"), {"t": ids[2]})
    assert all(r.ok for r in eng.audit.replay_all())
    assert judged(eng, path, public) == {ids[2]: [Code.TASK_MISSING]}


def test_rewriting_a_suffix_with_recomputed_hashes_is_found(
    eng: Engine, db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    key, public = signer
    ids = started(eng)
    _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    victim = ids[3]
    step_back(db_url, victim, 2)
    # A legal event in its place, its hash recomputed (by the engine's own code): a new truth, written by
    # someone who can write the database.
    eng.fire(victim, "propose", {"amount": 450, "reason": "damaged"}, actor="model")
    assert all(r.ok for r in eng.audit.replay_all())
    assert judged(eng, path, public) == {victim: [Code.HEAD_REWRITTEN]}


def test_a_checkpoint_judged_with_another_key_proves_nothing(
    eng: Engine, signer: tuple[Path, str], tmp_path: Path
) -> None:
    key, _ = signer
    started(eng, 2)
    _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    other = keygen(tmp_path / "other.key")
    assert judged(eng, path, other) == {"": [Code.CHECKPOINT_INVALID]}


def test_the_database_refuses_updates_and_deletes_of_the_log(eng: Engine, db_url: str) -> None:
    task_id = started(eng, 1)[0]
    console = create_engine(db_url)
    try:
        for statement in (
            "UPDATE events SET actor = 'mallory' WHERE task_id = :t",
            "DELETE FROM events WHERE task_id = :t",
        ):
            with pytest.raises(exc.DatabaseError) as refused, console.begin() as conn:
                conn.execute(text(statement), {"t": task_id})
            assert "append-only" in str(refused.value)
        if console.dialect.name == "postgresql":
            for statement in ("TRUNCATE events CASCADE", "TRUNCATE checkpoints"):
                with pytest.raises(exc.DatabaseError) as refused, console.begin() as conn:
                    conn.execute(text(statement))
                assert "append-only" in str(refused.value)
            # A temporary table named like the archive's permits cannot stand in for it.
            with pytest.raises(exc.DatabaseError), console.begin() as conn:
                conn.execute(text("CREATE TEMP TABLE archive_permits (holder text)"))
                conn.execute(text("INSERT INTO archive_permits VALUES ('mallory')"))
                conn.execute(text("DELETE FROM events WHERE task_id = :t"), {"t": task_id})
    finally:
        console.dispose()
    assert [e.actor for e in eng.history(task_id)] == ["ann", "model", "model"]
    assert eng.replay(task_id).ok


def test_a_checkpoint_row_cannot_be_edited_either(
    eng: Engine, db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    key, _ = signer
    started(eng, 1)
    eng.audit.checkpoint(key, tmp_path / "cp")
    console = create_engine(db_url)
    try:
        for statement in ("UPDATE checkpoints SET tree_size = 0", "DELETE FROM checkpoints"):
            with pytest.raises(exc.DatabaseError) as refused, console.begin() as conn:
                conn.execute(text(statement))
            assert "append-only" in str(refused.value)
    finally:
        console.dispose()


def test_the_cli_checkpoints_replays_against_it_and_proves_one_extends_another(
    db_url: str, signer: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, public = signer
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    monkeypatch.setenv("RAILYARD_SIGNING_KEY", str(key))
    monkeypatch.setenv("RAILYARD_CHECKPOINT_DIR", str(tmp_path / "cp"))
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        ids = started(eng, 3)
        first = runner.invoke(app, ["checkpoint", "--json"])
        assert first.exit_code == 0, first.output
        older = Path(json.loads(first.stdout)["file"])
        eng.fire(ids[0], "approve", {}, actor="dana")
        second = runner.invoke(app, ["checkpoint", "--json"])
        newer = Path(json.loads(second.stdout)["file"])
        assert json.loads(second.stdout)["previous_root"] == json.loads(first.stdout)["root"]
        replay = ["replay", "--all", "--checkpoint", str(older), "--public-key", public]
        clean = runner.invoke(app, replay)
        assert clean.exit_code == 0 and "checked against" in clean.stdout, clean.output
        assert (
            runner.invoke(app, ["checkpoint", "verify", str(older), str(newer), "--public-key", public]).exit_code == 0
        )

        step_back(db_url, ids[0], 2)
        found = runner.invoke(app, [*replay, "--json"])
        assert found.exit_code == EXIT_AUDIT
        body = json.loads(found.stdout)
        assert [(r["task_id"], r["findings"][0]["code"]) for r in body["reports"]] == [(ids[0], "TASK_TRUNCATED")]
        assert body["checkpoint"]["tree_size"] == 3 and body["ok"] is False
        assert runner.invoke(app, ["replay", "--all"]).exit_code == 0  # without a checkpoint: as before
        third = runner.invoke(app, ["checkpoint", "--json"])
        truncated = Path(json.loads(third.stdout)["file"])
        verdict = runner.invoke(app, ["checkpoint", "verify", str(newer), str(truncated), "--public-key", public])
        assert verdict.exit_code == EXIT_AUDIT and "CHECKPOINT_NOT_EXTENDING" in verdict.stdout
        assert runner.invoke(app, ["replay", "--all", "--checkpoint", str(older)]).exit_code == 2  # key needed too


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=6),
    st.lists(st.integers(0, 5), max_size=4),
    st.sampled_from(["honest", "truncate", "rewrite", "delete"]),
    st.data(),
)
def test_every_honest_history_verifies_and_every_edit_of_a_checkpointed_prefix_is_found(
    tmp_path_factory: pytest.TempPathFactory, notes: list[int], later: list[int], edit: str, data: st.DataObject
) -> None:
    """Random task logs, a checkpoint, more events; then the history is left alone or one checkpointed prefix is
    truncated, rewritten or deleted (in memory, where no trigger stands in the way)."""
    tmp = tmp_path_factory.mktemp("cp")
    key = tmp / "k"
    public = keygen(key)
    store = MemoryStore()
    with Engine(store=store, registry=Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        ids = [eng.start("refund", ORDER, actor="ann", version=1) for _ in notes]
        for task_id, n in zip(ids, notes, strict=True):
            for _ in range(n):
                eng.fire(task_id, "note", {"note": "x"}, actor="model")
        _, path, _ = eng.audit.checkpoint(key, tmp)
        for index in later:
            eng.fire(ids[index % len(ids)], "note", {"note": "after"}, actor="model")
        victim = data.draw(st.sampled_from(ids))
        at = eng.store.row(victim)
        assert at is not None
        covered = 1 + notes[ids.index(victim)]  # the seq the checkpoint recorded for it
        expected: list[Code] = []
        if edit == "truncate" and covered > 1:
            store._tasks[victim].events[covered - 1 :] = []
            kept = store._tasks[victim].events[-1]
            store._tasks[victim].seq, store._tasks[victim].last_hash = kept.seq, kept.hash
            expected = [Code.TASK_TRUNCATED]
        elif edit == "rewrite" and covered > 1:
            events = eng.history(victim)[: covered - 1]
            forged = seal(
                task_id=victim,
                seq=covered,
                at=events[-1].at,
                actor="mallory",
                from_state=events[-1].to_state,
                trigger="note",
                to_state=events[-1].to_state,
                data=as_event_data({"args": {"note": "rewritten"}}),
                prev_hash=events[-1].hash,
            )
            store._tasks[victim].events[covered - 1 :] = []
            store._tasks[victim].seq = covered - 1
            store._tasks[victim].last_hash = events[-1].hash
            store._tasks[victim].snapshots.clear()
            eng.store.append(victim, covered - 1, [forged], status="runnable")
            expected = [Code.HEAD_REWRITTEN]
        elif edit == "delete":
            del store._tasks[victim]
            expected = [Code.TASK_MISSING]
        assert judged(eng, path, public) == ({victim: expected} if expected else {})


# -- exports held to a checkpoint, offline -------------------------------------------------------------------------
def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, values: list[dict[str, Any]]) -> None:
    path.write_text("".join(canonical_json(v) + "\n" for v in values), encoding="utf-8")


def drop_last_event(values: list[dict[str, Any]], task_id: str, status_of: Callable[[str], str]) -> None:
    """Cut a task's last event out of an export and make its task and end lines agree: no hash to recompute."""
    events = [v for v in values if v["kind"] == "event" and v["task_id"] == task_id]
    last, before = events[-1], events[-2]
    values.remove(last)
    row = next(v for v in values if v["kind"] == "task" and v["task_id"] == task_id)
    row.update(
        seq=before["seq"], last_hash=before["hash"], state=before["to_state"], status=status_of(before["to_state"])
    )
    values[-1]["events"] -= 1


def test_an_export_against_a_checkpoint_finds_a_dropped_event_and_a_dropped_task_offline(
    db_url: str, signer: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, public = signer
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        ids = started(eng, 3)
        _, checkpoint, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        status_of = eng.definition_of(eng.load(ids[0])).status_of
    exported = tmp_path / "all.jsonl"
    result = runner.invoke(app, ["export", "--all", "--checkpoint", str(checkpoint)])
    assert result.exit_code == 0, result.output
    exported.write_text(result.stdout, encoding="utf-8")
    values = lines_of(exported)
    assert sum(v["kind"] == "proof" for v in values) == 3
    verify = ["verify-export", str(exported), "--checkpoint", str(checkpoint), "--public-key", public]
    assert runner.invoke(app, verify).exit_code == 0

    cut = tmp_path / "cut.jsonl"  # the last event of a task dropped, its task and end lines fixed
    edited = lines_of(exported)
    drop_last_event(edited, ids[1], lambda s: str(status_of(s)))
    write_lines(cut, edited)
    for command in (["verify-export", str(cut)], [*verify[:1], str(cut), *verify[2:]]):
        # Even alone, the file's own proof line names a head its log no longer reaches.
        found = runner.invoke(app, [*command, "--json"])
        assert found.exit_code == EXIT_AUDIT
        assert [(r["task_id"], f["code"]) for r in json.loads(found.stdout)["reports"] for f in r["findings"]] == [
            (ids[1], "TASK_TRUNCATED")
        ]
    unproved = tmp_path / "unproved.jsonl"  # the proof line dropped as well: the file alone holds together
    write_lines(unproved, [v for v in edited if not (v["kind"] == "proof" and v["task_id"] == ids[1])])
    alone = runner.invoke(app, ["verify-export", str(unproved)])
    assert alone.exit_code == 0
    assert "2 proof lines checked against the roots they name only" in alone.stderr  # and it says so
    found = runner.invoke(app, [*verify[:1], str(unproved), *verify[2:], "--json"])
    assert found.exit_code == EXIT_AUDIT
    assert sorted(f["code"] for r in json.loads(found.stdout)["reports"] for f in r["findings"]) == [
        "HEAD_REWRITTEN",  # the checkpoint lists it and the export has no proof line
        "TASK_TRUNCATED",
    ]

    gone = tmp_path / "gone.jsonl"  # a whole task dropped, the end line fixed
    kept = [v for v in lines_of(exported) if v.get("task_id") != ids[2]]
    kept[-1]["tasks"] -= 1
    kept[-1]["events"] -= sum(v["kind"] == "event" and v["task_id"] == ids[2] for v in values)
    write_lines(gone, kept)
    assert runner.invoke(app, ["verify-export", str(gone)]).exit_code == 0
    missing = runner.invoke(app, [*verify[:1], str(gone), *verify[2:], "--json"])
    assert missing.exit_code == EXIT_AUDIT
    assert [(r["task_id"], r["findings"][0]["code"]) for r in json.loads(missing.stdout)["reports"]] == [
        (ids[2], "TASK_MISSING")
    ]
    assert runner.invoke(app, [*verify[:1], str(gone), *verify[2:], "--partial"]).exit_code == 0

    forged = tmp_path / "forged.jsonl"  # a proof line that does not prove its head
    proofs = lines_of(exported)
    proof = next(v for v in proofs if v["kind"] == "proof" and v["task_id"] == ids[0])
    proof["path"][0] = ("0" if proof["path"][0][0] != "0" else "1") + proof["path"][0][1:]
    write_lines(forged, proofs)
    bad = runner.invoke(app, [*verify[:1], str(forged), *verify[2:], "--json"])
    assert bad.exit_code == EXIT_AUDIT and "HEAD_REWRITTEN" in bad.stdout
    other = keygen(tmp_path / "other.key")
    assert runner.invoke(app, [*verify[:-1], other]).exit_code == EXIT_AUDIT  # another key: the checkpoint is void

    header_only = tmp_path / "header.jsonl"  # what an auditor keeps of a checkpoint: its signed first line
    header_only.write_bytes(checkpoint.read_bytes().splitlines(keepends=True)[0])
    by_header = [*verify[:1], str(exported), "--checkpoint", str(header_only), "--public-key", public]
    assert runner.invoke(app, [*by_header, "--partial"]).exit_code == 0
    refused = runner.invoke(app, by_header)  # which tasks it lists is not in a header: completeness needs the heads
    assert refused.exit_code == 2 and "--partial" in refused.output
    assert runner.invoke(app, [*by_header[:1], str(cut), *by_header[2:], "--partial"]).exit_code == EXIT_AUDIT
    assert runner.invoke(app, [*by_header[:1], str(forged), *by_header[2:], "--partial"]).exit_code == EXIT_AUDIT
    assert runner.invoke(app, ["verify-export", str(forged)]).exit_code == EXIT_AUDIT  # its own root refutes it
    # Without the proof line as well, a header cannot tell whether the checkpoint lists the task, and says so.
    unsure = runner.invoke(app, [*by_header[:1], str(unproved), *by_header[2:], "--partial"])
    assert unsure.exit_code == 0 and "whether it lists them cannot be told" in unsure.stderr
    replayed = runner.invoke(app, ["replay", "--all", "--checkpoint", str(header_only), "--public-key", public])
    assert replayed.exit_code == EXIT_AUDIT and "header alone" in replayed.stdout  # a database needs the heads

    respelt = tmp_path / "respelt.jsonl"  # a proof line's tree size as 3.0: the same number, another byte
    floats = lines_of(exported)
    for v in floats:
        if v["kind"] == "proof":
            v["tree_size"] = float(v["tree_size"])
    write_lines(respelt, floats)
    for command in (verify, [*by_header, "--partial"]):
        assert runner.invoke(app, [*command[:1], str(respelt), *command[2:]]).exit_code == EXIT_AUDIT

    twice = tmp_path / "twice.jsonl"  # a task's block a second time: two logs of one task, whichever is true
    doubled = lines_of(exported)
    block = [v for v in doubled if v.get("task_id") == ids[0] and v["kind"] != "end"]
    doubled[-1:-1] = block
    doubled[-1]["tasks"] += 1
    doubled[-1]["events"] += sum(v["kind"] == "event" for v in block)
    write_lines(twice, doubled)
    for command in (["verify-export", str(twice)], [*verify[:1], str(twice), *verify[2:]]):
        result = runner.invoke(app, [*command, "--json"])
        assert result.exit_code == EXIT_AUDIT and "appears a second time" in result.stdout


def test_a_worker_signs_checkpoints_on_its_timer(
    eng: Engine, signer: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, public = signer
    monkeypatch.setenv("RAILYARD_SIGNING_KEY", str(key))
    monkeypatch.setenv("RAILYARD_CHECKPOINT_DIR", str(tmp_path / "timed"))
    started(eng, 2)
    stop = threading.Event()
    worker = Worker(eng, name="signer", poll_seconds=0.05, listen=False, checkpoint_seconds=0.2)
    running = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    running.start()
    deadline = time.monotonic() + 10
    while len(list((tmp_path / "timed").glob("*.jsonl"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    running.join(timeout=10)
    files = sorted((tmp_path / "timed").glob("*.jsonl"))
    assert len(files) >= 2, "a checkpoint at once, and another after the interval"
    assert all(judged(eng, f, public) == {} for f in files)
    last = eng.store.last_checkpoint()
    assert last is not None and last[1] in {f.name for f in files}


def test_the_chain_of_checkpoints_is_the_files_and_a_verifier_may_hold_several_keys(
    db_url: str, signer: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint names its predecessor, taken from the checkpoint files (the database's note can be
    forged); `checkpoint verify` follows that chain, so a checkpoint held back or replaced is found; a key
    rotation is verified with both keys."""
    key, public = signer
    place = tmp_path / "cp"
    monkeypatch.setenv("RAILYARD_DATABASE_URL", db_url)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    monkeypatch.setenv("RAILYARD_SIGNING_KEY", str(key))
    monkeypatch.setenv("RAILYARD_CHECKPOINT_DIR", str(place))

    def take() -> dict[str, Any]:
        taken = runner.invoke(app, ["checkpoint", "--json"])
        assert taken.exit_code == 0, taken.output
        return dict(json.loads(taken.stdout))

    def verify(older: dict[str, Any], newer: dict[str, Any], *extra: str, keys: tuple[str, ...] = (public,)) -> Any:
        flags = [arg for k in keys for arg in ("--public-key", k)]
        return runner.invoke(app, ["checkpoint", "verify", older["file"], newer["file"], *flags, *extra, "--json"])

    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        ids = started(eng, 2)
        first = take()
        with sql(db_url) as conn:  # an insider notes a checkpoint that never was, to be named as the predecessor
            conn.execute(
                text(
                    "INSERT INTO checkpoints (root, tree_size, at, previous_root, key_id, file) "
                    "VALUES (:r, 2, :at, NULL, :k, 'forged.jsonl')"
                ),
                {"r": "f" * 64, "at": "2999-01-01 00:00:00+00:00", "k": first["key_id"]},
            )
        eng.fire(ids[0], "approve", {}, actor="dana")
        second = take()
        assert second["previous_root"] == first["root"]  # the files say what came before, not the database
        # Files planted in the folder without the key: one named as if taken in 2999, one no parser can read.
        planted = Header(0, "e" * 64, "2999-01-01T00:00:00.000000Z", None, "0" * 16).line("0" * 128)
        (place / "checkpoint-29990101T000000.000000Z-0-eeeeeeeeeeee.jsonl").write_bytes(planted)
        (place / "checkpoint-29990101T000001.000000Z-0-ffffffffffff.jsonl").write_bytes(b"[" * 100_000 + b"\n")
        (place / "a-note.jsonl").write_bytes(b"[" * 100_000 + b"\n")
        eng.fire(ids[1], "reject", {"note": "no"}, actor="dana")
        third = take()
        assert third["previous_root"] == second["root"]  # the planted files are passed over
        assert verify(first, third).exit_code == 0  # through the second, found in the same folder
        repeat = take()  # nothing changed: the same root as the one before it, which it names
        assert repeat["root"] == repeat["previous_root"] == third["root"]
        assert verify(first, repeat).exit_code == 0 and verify(third, repeat).exit_code == 0

        held_back = tmp_path / "elsewhere"
        held_back.mkdir()
        Path(second["file"]).rename(held_back / Path(second["file"]).name)
        broken = verify(first, third)
        assert broken.exit_code == EXIT_AUDIT
        [finding] = json.loads(broken.stdout)["findings"]
        assert finding["code"] == "CHECKPOINT_NOT_EXTENDING" and "cannot be followed" in finding["message"]
        assert verify(first, third, "--dir", str(place), "--dir", str(held_back)).exit_code == 0

        # In a folder with no checkpoint, the database's note is all there is to name: here the forged one,
        # whose checkpoint no one can show, so the chain through it cannot be followed.
        _, stray, _ = eng.audit.checkpoint(key, tmp_path / "empty")
        assert read_header(stray).previous_root == "f" * 64
        [finding] = json.loads(verify(first, {"file": str(stray)}).stdout)["findings"]
        assert finding["code"] == "CHECKPOINT_NOT_EXTENDING" and "cannot be followed" in finding["message"]
        _, fresh = write_signed(eng.store.heads(), load_signing_key(key), tmp_path / "other", previous_root=None)
        [finding] = json.loads(verify(first, {"file": str(fresh)}).stdout)["findings"]  # another chain's first
        assert finding["code"] == "CHECKPOINT_NOT_EXTENDING" and "a first checkpoint" in finding["message"]

        with sql(db_url) as conn:  # the forged note taken away again: the database's last note is the real one
            conn.execute(text("DELETE FROM checkpoints WHERE file = 'forged.jsonl'"))
        # After a rotation no file in the folder is signed with the new key: the database's note names the
        # predecessor, the last checkpoint the old key signed.
        rotated = tmp_path / "rotated.key"
        rotated_public = keygen(rotated)
        monkeypatch.setenv("RAILYARD_SIGNING_KEY", str(rotated))
        fourth = take()
        assert fourth["previous_root"] == third["root"] and fourth["key_id"] != third["key_id"]
        old_key_only = verify(third, fourth)
        assert old_key_only.exit_code == EXIT_AUDIT and "not one of the keys given" in old_key_only.stdout
        assert verify(third, fourth, keys=(public, rotated_public)).exit_code == 0
        both = ["--public-key", public, "--public-key", rotated_public]
        assert runner.invoke(app, ["replay", "--all", "--checkpoint", fourth["file"], *both]).exit_code == 0
        assert runner.invoke(app, ["replay", "--all", "--checkpoint", third["file"], *both]).exit_code == 0


def test_an_archive_file_gone_is_said_as_such_against_a_checkpoint(
    db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    """A task checkpointed mid-way, then ended and archived: its file lost is ARCHIVE_MISSING, not a log that
    was rewritten; a task whose head did not move needs no file to extend."""
    from datetime import timedelta

    from engine.core.canonical import now

    key, public = signer
    with Engine(
        db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES), archive_dir=tmp_path / "archive"
    ) as eng:
        moving, still = started(eng, 2)
        eng.fire(still, "reject", {"note": "no"}, actor="dana")
        _, older, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        eng.fire(moving, "reject", {"note": "no"}, actor="dana")
        _, newer, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        assert eng.audit.archive(now() + timedelta(seconds=1)).tasks == 2
        assert judged(eng, older, public) == {} and eng.audit.checkpoint_extends(older, newer, public) == []
        for name in (tmp_path / "archive").iterdir():
            name.unlink()
        assert judged(eng, older, public) == {moving: [Code.ARCHIVE_MISSING]}
        assert judged(eng, newer, public) == {}  # its heads are the archived ones: the tombstones still say them
        assert [f.code for f in eng.audit.checkpoint_extends(older, newer, public)] == [Code.ARCHIVE_MISSING]


def test_a_checkpoint_the_database_cannot_note_still_stands(
    db_url: str, signer: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken with a read-only database session: the signed file is written and printed, a warning says the
    database has no note of it, and it verifies like any other."""
    if not db_url.startswith("postgresql"):
        pytest.skip("a read-only session is a PostgreSQL setting")
    key, public = signer
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        started(eng, 2)
    read_only = db_url + ("&" if "?" in db_url else "?") + "options=-c%20default_transaction_read_only%3Don"
    monkeypatch.setenv("RAILYARD_DATABASE_URL", read_only)
    monkeypatch.setenv("RAILYARD_WORKFLOWS", "tests.support.sample_workflows")
    monkeypatch.setenv("RAILYARD_SIGNING_KEY", str(key))
    monkeypatch.setenv("RAILYARD_CHECKPOINT_DIR", str(tmp_path / "cp"))
    taken = runner.invoke(app, ["checkpoint"])
    assert taken.exit_code == 0, taken.output
    written = Path(taken.stdout.strip())
    assert written.is_file() and "the database has no note of it" in taken.stderr
    replay = ["replay", "--all", "--checkpoint", str(written), "--public-key", public]
    assert runner.invoke(app, replay).exit_code == 0


def test_a_newer_head_that_does_not_chain_from_the_older_one_does_not_extend_it(
    db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    """An insider appends an event whose hash column says something and whose content and link do not: the
    newer checkpoint signs that head, and `checkpoint verify` reads the log between the two heads."""
    key, public = signer
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        [task_id] = started(eng, 1)
        _, older, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        with sql(db_url) as conn:
            conn.execute(
                text(
                    "INSERT INTO events (task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, "
                    "hash) SELECT task_id, seq + 1, at, actor, to_state, trigger, to_state, data, :prev, :hash "
                    "FROM events WHERE task_id = :t AND seq = 3"
                ),
                {"t": task_id, "prev": "0" * 64, "hash": "ab" * 32},
            )
            conn.execute(
                text("UPDATE tasks SET seq = 4, last_hash = :h WHERE task_id = :t"), {"t": task_id, "h": "ab" * 32}
            )
        _, newer, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        [finding] = eng.audit.checkpoint_extends(older, newer, public)
        assert finding.code is Code.CHECKPOINT_NOT_EXTENDING and task_id in finding.message


def test_a_log_cut_under_a_row_left_standing_is_truncated_against_the_checkpoint(
    db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    """The head event deleted, the task's row not touched: the checkpoint is judged on the log, not on the row."""
    key, public = signer
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        [task_id] = started(eng, 1)
        _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
        with sql(db_url) as conn:
            conn.execute(text("DELETE FROM snapshots WHERE task_id = :t"), {"t": task_id})
            conn.execute(text("DELETE FROM events WHERE task_id = :t AND seq = 3"), {"t": task_id})
        assert judged(eng, path, public) == {task_id: [Code.TASK_TRUNCATED]}


def test_a_session_that_may_write_the_permits_table_gets_past_the_guard_and_the_checkpoint_finds_it(
    db_url: str, signer: tuple[Path, str], tmp_path: Path
) -> None:
    """The append-only guard lets through whoever writes a permit row: said so in docs/operations.md (grant the
    permits table to the archiving role alone); the signed checkpoint is what catches the deletion."""
    key, public = signer
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        [task_id] = started(eng, 1)
        _, path, _ = eng.audit.checkpoint(key, tmp_path / "cp")
    console = create_engine(db_url)
    try:
        with console.begin() as conn:  # no trigger dropped, no replica role: a plain session
            conn.execute(text("INSERT INTO archive_permits VALUES ('mallory')"))
            conn.execute(text("DELETE FROM snapshots WHERE task_id = :t"), {"t": task_id})
            conn.execute(text("DELETE FROM events WHERE task_id = :t AND seq = 3"), {"t": task_id})
            conn.execute(text("DELETE FROM archive_permits"))
    finally:
        console.dispose()
    with Engine(db_url, Registry(all_workflows()), authoriser=StaticRoles(ROLES)) as eng:
        assert judged(eng, path, public) == {task_id: [Code.TASK_TRUNCATED]}
