"""A signed checkpoint file on its own: it verifies with its key, and any edit to it, or another key, is found.

These are the checks `railyard replay --checkpoint` and `railyard checkpoint verify` start from; the checks
of a database against a checkpoint are in tests/test_checkpoints.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import Code, RailyardError
from engine.audit.checkpoint import (
    Keys,
    Reading,
    keygen,
    load_public_key,
    load_signing_key,
    read,
    verify_file,
    write_signed,
)
from engine.core.canonical import canonical_json
from engine.core.checkpoints import Head, head_findings, inclusion_holds

HEADS = [Head(f"t-{i:03d}", i + 1, hashlib.sha256(str(i).encode()).hexdigest()) for i in range(1, 6)]


def signed(tmp_path: Path) -> tuple[Path, str]:
    public = keygen(tmp_path / "signing.key")
    _, path = write_signed(HEADS, load_signing_key(tmp_path / "signing.key"), tmp_path / "cp", previous_root=None)
    return path, public


def codes(path: Path, public: str) -> list[Code]:
    return [f.code for f in verify_file(path, Keys.load([public]))[1]]


def test_a_checkpoint_verifies_with_its_key_and_lists_every_head_in_task_order(tmp_path: Path) -> None:
    path, public = signed(tmp_path)
    assert codes(path, public) == []
    checkpoint = read(path)
    assert checkpoint.heads == tuple(HEADS)
    assert checkpoint.header.tree_size == 5 and checkpoint.tree().root().hex() == checkpoint.header.root
    assert list((tmp_path / "cp").iterdir()) == [path]  # no part file left behind
    assert (tmp_path / "signing.key").stat().st_mode & 0o077 == 0  # the private key is its owner's only


def test_a_key_is_never_overwritten_and_an_unwritable_place_is_a_config_error(tmp_path: Path) -> None:
    keygen(tmp_path / "k")
    for place in (tmp_path / "k", tmp_path / "no-such-dir" / "k"):
        with pytest.raises(RailyardError) as caught:
            keygen(place)
        assert caught.value.code is Code.CONFIG_INVALID
    with pytest.raises(RailyardError) as caught:
        write_signed(HEADS, load_signing_key(tmp_path / "k"), tmp_path / "k" / "cp", previous_root=None)
    assert caught.value.code is Code.CONFIG_INVALID  # a directory under a file
    with pytest.raises(RailyardError) as caught:
        load_public_key(str(tmp_path))  # a directory is no key
    assert caught.value.code is Code.CONFIG_INVALID


def edit(path: Path, line: int, change: Callable[[Any], Any], spell: Callable[[Any], str] = canonical_json) -> None:
    """Change one line's value and write it back, by default in the one spelling checkpoints use, so what is
    found is the change itself."""
    lines = path.read_text(encoding="utf-8").splitlines()
    value = change(json.loads(lines[line]))
    lines[line] = spell(value)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "root": "0" * 64}), id="root"),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "tree_size": 4}), id="size"),
        pytest.param(
            lambda p: edit(
                p, 0, lambda h: {**h, "signature": ("f" if h["signature"][0] != "f" else "e") + h["signature"][1:]}
            ),
            id="signature-byte",
        ),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "previous_root": "1" * 64}), id="predecessor"),
        pytest.param(lambda p: edit(p, 2, lambda h: [h[0], h[1] - 1, h[2]]), id="a-head-moved-back"),
        pytest.param(lambda p: p.write_text("\n".join(p.read_text().splitlines()[:-1]) + "\n"), id="a-task-dropped"),
        # The same values spelt another way: one spelling per file, so a respelt file is an edited one.
        pytest.param(lambda p: edit(p, 0, lambda h: h, json.dumps), id="header-respelt"),
        pytest.param(lambda p: edit(p, 2, lambda h: h, json.dumps), id="head-respelt"),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "note": "ok"}), id="header-extra-field"),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "root": h["root"].upper()}), id="root-upper-case"),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "tree_size": str(h["tree_size"])}), id="size-as-text"),
        pytest.param(lambda p: edit(p, 0, lambda h: {**h, "at": h["at"].replace("Z", "+00:00")}), id="time-respelt"),
        pytest.param(lambda p: edit(p, 2, lambda h: [h[0], h[1], h[2].upper()]), id="head-hash-upper-case"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes().rstrip(b"\n")), id="last-newline-cut"),
    ],
)
def test_an_edited_checkpoint_is_found(tmp_path: Path, tamper: Callable[[Path], None]) -> None:
    path, public = signed(tmp_path)
    tamper(path)
    assert Code.CHECKPOINT_INVALID in codes(path, public)


def test_another_key_does_not_verify_it(tmp_path: Path) -> None:
    path, _ = signed(tmp_path)
    other = keygen(tmp_path / "other.key")
    assert codes(path, other) == [Code.CHECKPOINT_INVALID]


def test_a_garbled_file_is_an_integrity_finding_not_a_traceback(tmp_path: Path) -> None:
    path, public = signed(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()
    for garbled in ("{not json", "0", "null", "[1, 2]"):
        path.write_text("\n".join([*lines[:2], garbled, *lines[3:]]) + "\n", encoding="utf-8")
        assert codes(path, public) == [Code.CHECKPOINT_INVALID], garbled
    path.write_bytes("\n".join(lines[:2]).encode() + b"\n\xff\xfe\n")  # not UTF-8 past the header
    assert codes(path, public) == [Code.CHECKPOINT_INVALID]
    path.write_text("{not json\n", encoding="utf-8")
    with pytest.raises(RailyardError) as caught:
        read(path)
    assert caught.value.code is Code.CHECKPOINT_INVALID


def test_heads_out_of_order_are_refused_before_anything_is_signed(tmp_path: Path) -> None:
    keygen(tmp_path / "k")
    with pytest.raises(RailyardError) as caught:
        write_signed(list(reversed(HEADS)), load_signing_key(tmp_path / "k"), tmp_path / "cp", previous_root=None)
    assert caught.value.code is Code.STATE_MISMATCH
    assert list((tmp_path / "cp").iterdir()) == []


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(Head("t-9", 3, "A" * 64), id="upper-case-hash"),
        pytest.param(Head("t-9", "ten", "a" * 64), id="seq-as-text"),  # type: ignore[arg-type]
        pytest.param(Head("t-9", 0, "a" * 64), id="seq-0"),
        pytest.param(Head(b"t-9", 3, "a" * 64), id="task-id-as-bytes"),  # type: ignore[arg-type]
    ],
)
def test_a_head_the_reader_would_refuse_is_never_signed(tmp_path: Path, bad: Head) -> None:
    """A malformed task row (as an insider or a broken driver leaves it) stops the checkpoint with a code that
    names the task, instead of a signed file every later judgement calls invalid."""
    keygen(tmp_path / "k")
    with pytest.raises(RailyardError) as caught:
        write_signed([*HEADS, bad], load_signing_key(tmp_path / "k"), tmp_path / "cp", previous_root=None)
    assert caught.value.code is Code.STATE_MISMATCH and "t-9" in caught.value.message
    assert list((tmp_path / "cp").iterdir()) == []


def test_nesting_past_the_parsers_limit_is_a_finding_not_a_traceback(tmp_path: Path) -> None:
    path, public = signed(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"[" * 100_000 + b"\n" + b"".join(lines[2:]))
    assert codes(path, public) == [Code.CHECKPOINT_INVALID]
    path.write_bytes(b"[" * 100_000 + b"\n")
    assert codes(path, public) == [Code.CHECKPOINT_INVALID]


def test_a_header_kept_alone_is_read_with_any_line_ending_and_says_it_is_only_a_header(tmp_path: Path) -> None:
    path, public = signed(tmp_path)
    header = path.read_bytes().splitlines()[0]
    for kept in (header, header + b"\r\n", header + b"\n\n"):
        alone = tmp_path / "header.jsonl"
        alone.write_bytes(kept)
        with Reading(alone, Keys.load([public])) as reading:
            assert reading.header_only and reading.unsigned is None
        [finding] = verify_file(alone, Keys.load([public]))[1]
        assert "header alone" in finding.message  # not "its tasks do not hash to the root"


def test_a_public_key_that_is_not_one_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(RailyardError) as caught:
        load_public_key("not-a-key")
    assert caught.value.code is Code.CONFIG_INVALID


def test_a_head_is_judged_against_the_log_as_it_is_now() -> None:
    head = Head("t", 5, "a" * 64)
    logs = {("t", 5): "a" * 64}
    assert head_findings(head, Head("t", 5, "a" * 64), lambda t, s: logs.get((t, s))) == []
    assert head_findings(head, Head("t", 9, "c" * 64), lambda t, s: logs.get((t, s))) == []  # it moved on from there
    assert [f.code for f in head_findings(head, None, lambda t, s: None)] == [Code.TASK_MISSING]
    assert [f.code for f in head_findings(head, Head("t", 4, "b" * 64), lambda t, s: None)] == [Code.TASK_TRUNCATED]
    assert [f.code for f in head_findings(head, Head("t", 5, "b" * 64), lambda t, s: "b" * 64)] == [Code.HEAD_REWRITTEN]
    # The row may say seq 5 while the log no longer has event 5: the log is what counts.
    assert [f.code for f in head_findings(head, Head("t", 5, "a" * 64), lambda t, s: None)] == [Code.TASK_TRUNCATED]
    rewritten = {("t", 5): "d" * 64}
    assert [f.code for f in head_findings(head, Head("t", 7, "e" * 64), lambda t, s: rewritten.get((t, s)))] == [
        Code.HEAD_REWRITTEN
    ]


def test_each_head_has_an_inclusion_proof_in_the_signed_root(tmp_path: Path) -> None:
    path, _ = signed(tmp_path)
    checkpoint = read(path)
    tree = checkpoint.tree()
    for index, head in enumerate(checkpoint.heads):
        proof = [p.hex() for p in tree.inclusion_proof(index)]
        assert inclusion_holds(head, index, checkpoint.header.tree_size, checkpoint.header.root, proof)
        assert not inclusion_holds(
            Head(head.task_id, head.seq - 1, head.hash),
            index,
            checkpoint.header.tree_size,
            checkpoint.header.root,
            proof,
        )
