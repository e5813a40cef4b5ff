"""Signed checkpoints on disk: the Ed25519 key, writing a checkpoint file, reading one back, checking a store.

A checkpoint file is JSON lines: the first line is the signed header with its
signature, each further line one task's head `[task_id, seq, hash]` in task id
order. Every line is canonical JSON, so a file has one spelling and is checked
byte for byte. The file lives outside the database (`RAILYARD_CHECKPOINT_DIR`), where
the database's operators cannot rewrite it; its root is also recorded in the
database, for convenience only.

The signing key is a PEM (PKCS#8) file named by `RAILYARD_SIGNING_KEY`; the
public key is given to verifiers as 64 hex digits (the raw Ed25519 key) or a
PEM file.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.core.canonical import format_instant, now, parse_instant
from engine.core.chain import Finding
from engine.core.checkpoints import (
    Checkpoint,
    Head,
    Header,
    HeadsRoot,
    head_findings,
    head_problem,
    key_id,
    parse_head_line,
    parse_header_line,
)
from engine.core.errors import Code, IntegrityError, RailyardError
from engine.core.replay import ReplayReport
from engine.store.protocol import Store

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def keygen(path: Path) -> str:
    """Write a new private key to `path` (readable by its owner only) and return the public key, in hex."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RailyardError(f"{path} exists: a signing key is never overwritten", code=Code.CONFIG_INVALID) from None
    except OSError as exc:
        raise RailyardError(f"cannot write the signing key {path}: {exc}", code=Code.CONFIG_INVALID) from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return key.public_key().public_bytes(*_RAW).hex()


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise RailyardError(f"cannot read the signing key {path}: {exc}", code=Code.CONFIG_INVALID) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise RailyardError(f"{path} is not an Ed25519 key", code=Code.CONFIG_INVALID)
    return key


def load_public_key(spec: str) -> Ed25519PublicKey:
    """A verifier's public key: 64 hex digits, or a file holding them or a PEM public key."""
    text = spec.strip()
    path = Path(text)
    if len(text) != 64 and path.exists():
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RailyardError(f"cannot read the public key {path}: {exc}", code=Code.CONFIG_INVALID) from None
        if b"BEGIN" in data:
            try:
                key = serialization.load_pem_public_key(data)
            except ValueError as exc:
                raise RailyardError(f"{path} is not a public key: {exc}", code=Code.CONFIG_INVALID) from None
            if not isinstance(key, Ed25519PublicKey):
                raise RailyardError(f"{path} is not an Ed25519 public key", code=Code.CONFIG_INVALID)
            return key
        text = data.decode("ascii", "replace").strip()
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
    except ValueError:
        raise RailyardError(
            "a public key is 64 hex digits (what `railyard checkpoint keygen` printed), or a file holding them",
            code=Code.CONFIG_INVALID,
        ) from None


class Keys:
    """The public keys a verifier trusts, by key id. A checkpoint names the key that signed it, so a verifier
    given the old and the new key checks checkpoints from both sides of a rotation."""

    def __init__(self, keys: Iterable[Ed25519PublicKey]) -> None:
        self._by_id = {key_id(k.public_bytes(*_RAW)): k for k in keys}
        if not self._by_id:
            raise RailyardError("no public key given", code=Code.CONFIG_INVALID)

    @classmethod
    def load(cls, specs: Iterable[str]) -> Keys:
        """From what `--public-key` was given (each 64 hex digits, or a file)."""
        return cls(load_public_key(spec) for spec in specs)

    def check(self, header: Header, signature: str) -> str | None:
        """Why the signature does not hold, or None when one of these keys made it."""
        key = self._by_id.get(header.key_id)
        if key is None:
            given = ", ".join(sorted(self._by_id))
            return f"it was signed by key {header.key_id}, which is not one of the keys given ({given})"
        try:
            key.verify(bytes.fromhex(signature), header.signed_bytes())
        except (InvalidSignature, ValueError):
            return f"its signature does not verify with key {header.key_id}"
        return None


def public_hex(key: Ed25519PublicKey) -> str:
    return key.public_bytes(*_RAW).hex()


def write_signed(
    heads: Iterable[Head], key: Ed25519PrivateKey, directory: Path, *, previous_root: str | None
) -> tuple[Header, Path]:
    """Sign the heads (in task id byte order, as `Store.heads` gives them) and write the checkpoint as a new file
    in `directory`. Streamed: the Merkle root is built one leaf at a time and the heads go to disk as they come,
    so memory stays flat in the number of tasks. The file appears whole or not at all (written aside, synced,
    then linked under its name, which never replaces a file)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=directory, suffix=".part")
        whole_fd, whole = tempfile.mkstemp(dir=directory, suffix=".part")
    except OSError as exc:
        raise RailyardError(f"cannot write checkpoints to {directory}: {exc}", code=Code.CONFIG_INVALID) from None
    rooted = HeadsRoot()
    try:
        with os.fdopen(fd, "wb") as body:
            for head in heads:
                problem = head_problem(head)  # never sign what the reader would call invalid
                if problem is not None:
                    raise IntegrityError(
                        f"task {head.task_id!r}: its row names a head no checkpoint can hold ({problem}); "
                        "`railyard replay` that task",
                        code=Code.STATE_MISMATCH,
                        task_id=str(head.task_id),
                    )
                leaf = rooted.add(head)  # the canonical JSON line is both the leaf's data and the file's line
                if leaf is None:
                    raise IntegrityError(
                        f"the store gave the heads out of task id order at {head.task_id!r}: nothing was signed",
                        code=Code.STATE_MISMATCH,
                        task_id=head.task_id,
                    )
                body.write(leaf + b"\n")
        signer = key_id(key.public_key().public_bytes(*_RAW))
        header = Header(rooted.size, rooted.root(), format_instant(now()), previous_root, signer)
        signature = key.sign(header.signed_bytes()).hex()
        path = directory / file_name(header)
        with os.fdopen(whole_fd, "wb") as out, open(part, "rb") as heads_bytes:
            out.write(header.line(signature))
            shutil.copyfileobj(heads_bytes, out)
            out.flush()
            os.fsync(out.fileno())
        os.link(whole, path)
        return header, path
    except OSError as exc:
        raise RailyardError(f"cannot write checkpoints to {directory}: {exc}", code=Code.CONFIG_INVALID) from None
    finally:
        Path(part).unlink(missing_ok=True)
        Path(whole).unlink(missing_ok=True)


def file_name(header: Header) -> str:
    """`checkpoint-<time>-<size>-<root prefix>.jsonl`: names sort by the time taken, and say the root."""
    stamp = header.at.replace(":", "").replace("-", "")
    return f"checkpoint-{stamp}-{header.tree_size}-{header.root[:12]}.jsonl"


class Reading:
    """One checkpoint file, read once, front to back. What a caller judges is exactly what was verified: the
    signature is checked before the first head is handed out, each head line must be the one spelling a
    checkpoint writes, and after the last one the heads must hash to the signed root and size, or `heads()`
    raises. A caller that reads to the end without an error has read a file that is what its key signed,
    even if the file on disk is replaced meanwhile.

    A file may also be its header line alone (`head -1`): it still proves inclusion proofs against its root
    (`header_only`), but not which tasks it lists.
    """

    def __init__(self, path: Path, keys: Keys | None) -> None:
        self.path = path
        try:
            self._file = path.open("rb")
        except OSError as exc:
            raise RailyardError(f"cannot read the checkpoint {path}: {exc}", code=Code.CONFIG_INVALID) from None
        try:
            first = self._file.readline(MAX_HEADER_BYTES)
            self._first = self._file.readline()
            rest_blank = self._first.strip() == b"" and self._file.read(1).strip() == b""
            if rest_blank and first.rstrip(b"\r\n") != first[:-1]:
                # A header kept on its own (pasted into a ticket, printed and typed back): its line ending
                # is not part of what was signed.
                first = first.rstrip(b"\r\n") + b"\n"
            self.header, self.signature = parse_header_line(first)
        except ValueError as exc:
            self._file.close()
            raise IntegrityError(f"{path} is not a readable checkpoint: {exc}", code=Code.CHECKPOINT_INVALID) from None
        #: Why the signature does not hold (None when it does, or when no keys were given).
        self.unsigned = keys.check(self.header, self.signature) if keys is not None else None
        #: The file is the signed header alone: it proves inclusion proofs, not which tasks it lists.
        self.header_only = rest_blank and self.header.tree_size > 0

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._file.close()

    def heads(self) -> Iterator[Head]:
        """The heads, in task id order; IntegrityError (CHECKPOINT_INVALID) at the first thing that is wrong."""
        if self.unsigned is not None:
            raise IntegrityError(f"{self.path.name}: {self.unsigned}", code=Code.CHECKPOINT_INVALID)
        if self.header_only:
            raise IntegrityError(
                f"{self.path.name} is a checkpoint's header alone: judging a database or another checkpoint needs "
                "the whole file (its heads); a header checks an export's proof lines (verify-export --partial)",
                code=Code.CHECKPOINT_INVALID,
            )
        rooted = HeadsRoot()
        lines = itertools.chain([self._first] if self._first else [], self._file)
        for number, raw in enumerate(lines, start=2):
            try:
                head = parse_head_line(raw)
            except ValueError as exc:
                raise IntegrityError(
                    f"{self.path.name}, line {number}: not a head ({exc})", code=Code.CHECKPOINT_INVALID
                ) from None
            if rooted.add(head) is None:
                raise IntegrityError(
                    f"{self.path.name}, line {number}: the tasks are not in task id order, once each",
                    code=Code.CHECKPOINT_INVALID,
                )
            yield head
        if rooted.size != self.header.tree_size or rooted.root() != self.header.root:
            raise IntegrityError(
                f"{self.path.name}: its tasks do not hash to the root and size it signs",
                code=Code.CHECKPOINT_INVALID,
            )


def read_header(path: Path, keys: Keys | None = None) -> Header:
    """A checkpoint's header, with its signature checked when `keys` are given (CHECKPOINT_INVALID if not)."""
    with Reading(path, keys) as reading:
        if reading.unsigned is not None:
            raise IntegrityError(f"{path.name}: {reading.unsigned}", code=Code.CHECKPOINT_INVALID)
        return reading.header


def read(path: Path, keys: Keys | None = None) -> Checkpoint:
    """A whole checkpoint in memory (for proofs over its tree, and to compare two), verified as it is read: its
    heads hash to its root, and with `keys` its signature holds. IntegrityError (CHECKPOINT_INVALID) if not."""
    with Reading(path, keys) as reading:
        heads = tuple(reading.heads())
        return Checkpoint(reading.header, reading.signature, heads)


def verify_file(path: Path, keys: Keys) -> tuple[Header | None, list[Finding]]:
    """A checkpoint file judged on its own, streamed: its header, the signature, each head, their order, and that
    they hash to the root and size it signs. The header is None when it cannot be read."""
    try:
        reading = Reading(path, keys)
    except IntegrityError as error:
        return None, [Finding(Code.CHECKPOINT_INVALID, 0, error.message)]
    with reading:
        try:
            for _ in reading.heads():
                pass
        except IntegrityError as error:
            return reading.header, [Finding(Code.CHECKPOINT_INVALID, 0, error.message)]
        return reading.header, []


def newest_in(directory: Path, keys: Keys) -> Header | None:
    """The header of the newest checkpoint file in `directory` (by the time in its name) whose signature holds
    with one of `keys`, or None. A file planted there without the key is passed over, so it cannot become
    every later checkpoint's predecessor."""
    try:
        names = sorted((p for p in directory.glob("checkpoint-*.jsonl") if p.is_file()), reverse=True)
    except OSError:
        return None
    for path in names:
        try:
            with Reading(path, keys) as reading:
                if reading.unsigned is None:
                    return reading.header
        except RailyardError:
            continue
    return None


class Taken(NamedTuple):
    """A checkpoint just written: its header, its file, and why the database has no note of it (None if it has)."""

    header: Header
    path: Path
    unrecorded: str | None = None


def take(store: Store, key: Ed25519PrivateKey, directory: Path) -> Taken:
    """Checkpoint every task's head now: write the signed file, then note it in the database.

    The predecessor it names is the newest checkpoint in `directory` signed with this key, the files being the
    record that counts; only when the directory has none is it the one the database noted last (so the first
    checkpoint after a key rotation names the last one the old key signed). The file is the checkpoint: if the
    database cannot note it (a read-only role), the checkpoint still stands, and `unrecorded` says why."""
    previous = newest_in(directory, Keys([key.public_key()]))
    if previous is None:
        last = store.last_checkpoint()
        previous = last[0] if last is not None else None
    header, path = write_signed(
        store.heads(), key, directory, previous_root=previous.root if previous is not None else None
    )
    try:
        store.record_checkpoint(header, path.name)
    except RailyardError as error:
        return Taken(header, path, f"{error.code}: {error.message}")
    return Taken(header, path)


def find_predecessor(header: Header, directories: Sequence[Path], keys: Keys) -> Header | None:
    """The checkpoint `header` names as its predecessor: the newest file in `directories` with that root taken
    before it (a checkpoint taken with nothing changed has the same root as the one before), its signature
    checked (CHECKPOINT_INVALID if it does not hold); None if there is none. Looked up by the root in the file
    names first, then by every file's header."""
    root = header.previous_root
    if root is None:
        return None
    before = parse_instant(header.at)
    best: Header | None = None
    seen: set[Path] = set()
    for pattern in (f"checkpoint-*-{root[:12]}.jsonl", "*.jsonl"):
        for directory in directories:
            for path in sorted(directory.glob(pattern)):
                if path in seen or not path.is_file():
                    continue
                seen.add(path)
                try:
                    reading = Reading(path, keys)
                except RailyardError:  # not a checkpoint (an export, a note): not the one looked for
                    continue
                with reading:
                    found = reading.header
                    if found.root != root or parse_instant(found.at) >= before:
                        continue
                    if reading.unsigned is not None:
                        raise IntegrityError(f"{path.name}: {reading.unsigned}", code=Code.CHECKPOINT_INVALID)
                    if best is None or parse_instant(found.at) > parse_instant(best.at):
                        best = found
        if best is not None:
            return best
    return None


def chain_findings(older: Header, newer: Header, directories: Sequence[Path], keys: Keys) -> list[Finding]:
    """Whether `newer` names, through its chain of predecessors (each checkpoint's `previous_root`, each file
    found in `directories` and its signature checked), the checkpoint `older`. A chain that cannot be followed
    is a finding too: a checkpoint held back or substituted is what the chain exists to show."""
    at = newer
    while (at.root, at.at) != (older.root, older.at):
        if at.previous_root is None:
            return [
                Finding(
                    Code.CHECKPOINT_NOT_EXTENDING,
                    0,
                    f"its chain of predecessors ends at root {at.root[:12]}… (a first checkpoint) without reaching "
                    f"root {older.root[:12]}…",
                )
            ]
        if parse_instant(at.at) <= parse_instant(older.at):
            return [
                Finding(
                    Code.CHECKPOINT_NOT_EXTENDING,
                    0,
                    f"its chain of predecessors passes {older.at} at root {at.root[:12]}… without meeting root "
                    f"{older.root[:12]}…: the two are on different chains",
                )
            ]
        try:
            found = find_predecessor(at, directories, keys)
        except IntegrityError as error:
            return [Finding(Code.CHECKPOINT_INVALID, 0, error.message)]
        if found is None:
            where = ", ".join(str(d) for d in directories)
            return [
                Finding(
                    Code.CHECKPOINT_NOT_EXTENDING,
                    0,
                    f"the chain cannot be followed: root {at.root[:12]}… names root {at.previous_root[:12]}… as its "
                    f"predecessor, and no checkpoint in {where} has it (--dir names where they are kept)",
                )
            ]
        at = found
    return []


#: A checkpoint's first line is a few hundred bytes: more is not a header (and is not read whole).
MAX_HEADER_BYTES = 4096

#: How many heads of logs that moved on are looked up per round trip.
LOOKUP_BATCH = 500


def judge_store(
    store: Store, path: Path, keys: Keys, archived_hash: Callable[[str, int], str | None]
) -> tuple[Header, list[ReplayReport]]:
    """The database judged against a checkpoint: one report per task with findings (TASK_MISSING, TASK_TRUNCATED,
    HEAD_REWRITTEN, ARCHIVE_MISSING), or one report for the checkpoint itself (task id "") when it does not
    verify, in which case nothing else is reported. Both sides are streamed in task id byte order and merged,
    the file read once (`Reading`).

    `archived_hash(task_id, seq)` reads an event's hash from an archived task's file; it raises IntegrityError
    when the file is not there (ARCHIVE_MISSING), which is reported as such, not as a rewritten head.
    """
    reports: list[ReplayReport] = []
    pending: list[tuple[Head, Head]] = []

    def settle() -> None:
        found = store.event_hashes([(h.task_id, h.seq) for h, _ in pending])
        for expected, current in pending:

            def hash_at(task_id: str, seq: int) -> str | None:
                return found.get((task_id, seq)) or archived_hash(task_id, seq)

            try:
                judged = head_findings(expected, current, hash_at)
            except IntegrityError as error:
                judged = [Finding(error.code, expected.seq, error.message)]
            _report(reports, expected, judged)
        pending.clear()

    def at_head(current: Head, logged: str | None) -> Callable[[str, int], str | None]:
        """The hash at a head that did not move: the log's, or an archived task's tombstone (replay proves the
        archive file against it)."""

        def hash_at(task_id: str, _seq: int) -> str | None:
            if logged is not None:
                return logged
            return current.hash if store.archive_of(task_id) is not None else None

        return hash_at

    with Reading(path, keys) as reading:
        try:
            now_heads = store.log_heads()
            current = next(now_heads, None)
            for expected in reading.heads():
                name = expected.task_id.encode()
                while current is not None and current[0].task_id.encode() < name:
                    current = next(now_heads, None)
                here, logged = (
                    current if current is not None and current[0].task_id == expected.task_id else (None, None)
                )
                problem = head_problem(here) if here is not None else None
                if problem is not None:
                    found = [Finding(Code.STATE_MISMATCH, expected.seq, f"its row's head is not one ({problem})")]
                    _report(reports, expected, found)
                elif here is not None and here.seq > expected.seq:  # moved on: the log at the old seq is read
                    pending.append((expected, here))
                    if len(pending) >= LOOKUP_BATCH:
                        settle()
                elif here is not None and here.seq == expected.seq:
                    _report(reports, expected, head_findings(expected, here, at_head(here, logged)))
                else:
                    _report(reports, expected, head_findings(expected, here, lambda _t, _s: None))
            settle()
        except IntegrityError as error:
            if error.code is not Code.CHECKPOINT_INVALID:
                raise
            return reading.header, [ReplayReport("", "", 0, (Finding(Code.CHECKPOINT_INVALID, 0, error.message),))]
        return reading.header, reports


def _report(reports: list[ReplayReport], head: Head, findings: list[Finding]) -> None:
    if findings:
        reports.append(ReplayReport(head.task_id, "", 0, tuple(findings)))


def proofs(checkpoint: Checkpoint) -> Callable[[str], dict[str, object] | None]:
    """For `export --checkpoint`: the fields of each task's proof line, the inclusion proof of its head in the
    checkpoint's tree (None for a task the checkpoint does not list). The tree is built once."""
    tree = checkpoint.tree()
    index = {head.task_id: (i, head) for i, head in enumerate(checkpoint.heads)}
    header = checkpoint.header

    def proof(task_id: str) -> dict[str, object] | None:
        found = index.get(task_id)
        if found is None:
            return None
        i, head = found
        return {
            "checkpoint": header.root,
            "tree_size": header.tree_size,
            "index": i,
            "seq": head.seq,
            "hash": head.hash,
            "path": [p.hex() for p in tree.inclusion_proof(i)],
        }

    return proof
