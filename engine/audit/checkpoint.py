"""Signed checkpoints on disk: the Ed25519 key, writing a checkpoint file, reading one back, checking a store.

A checkpoint file is JSON lines: the first line is the signed header with its
signature, each further line one task's head `[task_id, seq, hash]` in task id
order. The file lives outside the database (`RAILYARD_CHECKPOINT_DIR`), where
the database's operators cannot rewrite it; its root is also recorded in the
database, for convenience only.

The signing key is a PEM (PKCS#8) file named by `RAILYARD_SIGNING_KEY`; the
public key is given to verifiers as 64 hex digits (the raw Ed25519 key) or a
PEM file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.core.canonical import format_instant, now
from engine.core.chain import Finding
from engine.core.checkpoints import FORMAT, Checkpoint, Head, Header, HeadsRoot, head_findings, key_id
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


def public_hex(key: Ed25519PublicKey) -> str:
    return key.public_bytes(*_RAW).hex()


def write_signed(
    heads: Iterable[Head], key: Ed25519PrivateKey, directory: Path, *, previous_root: str | None
) -> tuple[Header, Path]:
    """Sign the heads (in task id byte order, as `Store.heads` gives them) and write the checkpoint as a new file
    in `directory`. Streamed: the Merkle root is built one leaf at a time and the heads go to disk as they come,
    so memory stays flat in the number of tasks."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=directory, suffix=".part")
    except OSError as exc:
        raise RailyardError(f"cannot write checkpoints to {directory}: {exc}", code=Code.CONFIG_INVALID) from None
    rooted = HeadsRoot()
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as body:
            for head in heads:
                leaf = rooted.add(head)  # the canonical JSON line is both the leaf's data and the file's line
                if leaf is None:
                    raise ValueError(f"heads out of task id order at {head.task_id!r}")
                body.write(leaf.decode() + "\n")
        signer = key_id(key.public_key().public_bytes(*_RAW))
        header = Header(rooted.size, rooted.root(), format_instant(now()), previous_root, signer)
        signature = key.sign(header.signed_bytes()).hex()
        stamp = header.at.replace(":", "").replace("-", "")
        path = directory / f"checkpoint-{stamp}-{header.tree_size}-{header.root[:12]}.jsonl"
        with path.open("x", encoding="utf-8") as out, open(part, encoding="utf-8") as heads_text:
            first = {"format": FORMAT, **header.to_dict(), "signature": signature}
            out.write(json.dumps(first, sort_keys=True) + "\n")
            shutil.copyfileobj(heads_text, out)
        return header, path
    finally:
        Path(part).unlink(missing_ok=True)


def read_header(path: Path) -> tuple[Header, str]:
    """The signed header of a checkpoint file and its signature (hex)."""
    try:
        with path.open("rb") as lines:
            first = json.loads(lines.readline().decode("utf-8"))
    except OSError as exc:
        raise RailyardError(f"cannot read the checkpoint {path}: {exc}", code=Code.CONFIG_INVALID) from None
    except ValueError as exc:
        raise IntegrityError(f"{path} is not a readable checkpoint: {exc}", code=Code.CHECKPOINT_INVALID) from None
    try:
        if first.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        previous = first["previous_root"]
        header = Header(
            int(first["tree_size"]),
            str(first["root"]),
            str(first["at"]),
            None if previous is None else str(previous),
            str(first["key_id"]),
        )
        return header, str(first["signature"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"{path} is not a readable checkpoint: {exc}", code=Code.CHECKPOINT_INVALID) from None


def read_heads(path: Path) -> Iterator[Head]:
    """The heads of a checkpoint file, streamed. A line that is not `[task_id, seq, hash]` is CHECKPOINT_INVALID."""
    with path.open("rb") as lines:
        lines.readline()
        for number, raw in enumerate(lines, start=2):
            try:
                task_id, seq, digest = json.loads(raw.decode("utf-8"))
                if not isinstance(task_id, str) or type(seq) is not int or not isinstance(digest, str):
                    raise ValueError("not [task_id, seq, hash]")
            except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
                raise IntegrityError(
                    f"{path}, line {number}: not a head ({exc})", code=Code.CHECKPOINT_INVALID
                ) from None
            yield Head(task_id, seq, digest)


def read(path: Path) -> Checkpoint:
    """A whole checkpoint file in memory (for proofs over its tree and for tests)."""
    header, signature = read_header(path)
    return Checkpoint(header, signature, tuple(read_heads(path)))


def verify_file(path: Path, key: Ed25519PublicKey) -> tuple[Header, list[Finding]]:
    """A checkpoint file judged on its own, streamed: the signature, the order of its heads, and that they hash
    to the root and size it signs."""
    header, signature = read_header(path)
    found = []
    try:
        key.verify(bytes.fromhex(signature), header.signed_bytes())
    except (InvalidSignature, ValueError):
        found.append(Finding(Code.CHECKPOINT_INVALID, 0, "the checkpoint's signature does not verify with this key"))
    rooted = HeadsRoot()
    try:
        for head in read_heads(path):
            if rooted.add(head) is None:
                found.append(
                    Finding(Code.CHECKPOINT_INVALID, 0, "the checkpoint's tasks are not in task id order, once each")
                )
                break
    except IntegrityError as error:
        found.append(Finding(Code.CHECKPOINT_INVALID, 0, error.message))
        return header, found
    if rooted.size != header.tree_size or rooted.root() != header.root:
        found.append(
            Finding(Code.CHECKPOINT_INVALID, 0, "the checkpoint's tasks do not hash to the root and size it signs")
        )
    return header, found


#: How many heads of logs that moved on are looked up per round trip.
LOOKUP_BATCH = 500


def take(store: Store, key: Ed25519PrivateKey, directory: Path) -> tuple[Header, Path]:
    """Checkpoint every task's head now: write the signed file, then note it in the database."""
    last = store.last_checkpoint()
    header, path = write_signed(store.heads(), key, directory, previous_root=last[0].root if last else None)
    store.record_checkpoint(header, path.name)
    return header, path


def judge_store(
    store: Store, path: Path, key: Ed25519PublicKey, archived_hash: Callable[[str, int], str | None]
) -> tuple[Header, list[ReplayReport]]:
    """The database judged against a checkpoint: one report per task with findings (TASK_MISSING, TASK_TRUNCATED,
    HEAD_REWRITTEN), or one report for the checkpoint itself (task id "") when it does not verify, in which case
    nothing else is judged. Both sides are streamed in task id byte order and merged.

    `archived_hash(task_id, seq)` reads an event's hash from an archived task's file.
    """
    header, invalid = verify_file(path, key)
    if invalid:
        return header, [ReplayReport("", "", 0, tuple(invalid))]
    reports: list[ReplayReport] = []
    pending: list[tuple[Head, Head]] = []

    def settle() -> None:
        found = store.event_hashes([(h.task_id, h.seq) for h, _ in pending])
        for expected, current in pending:

            def hash_at(task_id: str, seq: int) -> str | None:
                return found.get((task_id, seq)) or archived_hash(task_id, seq)

            _report(reports, expected, head_findings(expected, current, hash_at))
        pending.clear()

    now_heads = store.heads()
    current = next(now_heads, None)
    for expected in read_heads(path):
        name = expected.task_id.encode()
        while current is not None and current.task_id.encode() < name:
            current = next(now_heads, None)
        here = current if current is not None and current.task_id == expected.task_id else None
        if here is not None and here.seq > expected.seq:
            pending.append((expected, here))
            if len(pending) >= LOOKUP_BATCH:
                settle()
            continue
        _report(reports, expected, head_findings(expected, here, lambda _t, _s: None))
    settle()
    return header, reports


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
