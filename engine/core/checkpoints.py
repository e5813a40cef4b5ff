"""Signed checkpoints of every task's head: what one commits to, and how a database is judged against it. Pure.

A checkpoint lists each task's head (task id, seq, head hash, and the task's
tenant when it has one) in task id order and commits to the list with an RFC
6962 Merkle root (`engine.core.merkle`). The header (format, tree size, root,
time, the previous checkpoint's root, the key id) is what is signed, as
canonical JSON; the leaves travel with it, so a verifier knows every task that
existed, where its log stood and, for a task of a tenant, whose it is.

A log can only grow, so against a checkpoint a task must still exist, reach at
least the checkpointed seq, and hold the checkpointed hash at that seq: anything
else is a finding (`TASK_MISSING`, `TASK_TRUNCATED`, `HEAD_REWRITTEN`). Replay
then proves the rest of each log links to that head.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.core.access import TENANT_NAME
from engine.core.canonical import canonical_json, format_instant, parse_instant
from engine.core.chain import Finding
from engine.core.errors import Code
from engine.core.events import Event
from engine.core.merkle import Levels, RootBuilder, leaf_hash, verify_inclusion

FORMAT = "railyard-checkpoint/1"


@dataclass(frozen=True, slots=True, order=True)
class Head:
    """Where one task's log stood: its last seq and that event's hash; and the tenant the task belongs to, so that
    the signature binds which tenant each task is (a tenant's auditor can tell which heads are theirs)."""

    task_id: str
    seq: int
    hash: str
    tenant: str | None = None

    def leaf(self) -> bytes:
        """The Merkle leaf's data: the canonical JSON array `[task_id, seq, hash]`, UTF-8, with the tenant as a
        fourth element when the task has one (a task of no tenant has the leaf it always had)."""
        items: list[object] = [self.task_id, self.seq, self.hash]
        if self.tenant is not None:
            items.append(self.tenant)
        return canonical_json(items).encode()


def key_id(public_key: bytes) -> str:
    """Which key signed a checkpoint: the first 16 hex digits of sha256 of the raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Header:
    """The signed part of a checkpoint."""

    tree_size: int
    root: str
    at: str
    previous_root: str | None
    key_id: str

    def to_dict(self) -> dict[str, object]:
        return {
            "tree_size": self.tree_size,
            "root": self.root,
            "at": self.at,
            "previous_root": self.previous_root,
            "key_id": self.key_id,
        }

    def signed_bytes(self) -> bytes:
        """What the signature covers: the header as canonical JSON, with the format name."""
        return canonical_json({"format": FORMAT, **self.to_dict()}).encode()

    def line(self, signature: str) -> bytes:
        """The file's first line: the signed header and its signature, as canonical JSON."""
        return canonical_json({"format": FORMAT, **self.to_dict(), "signature": signature}).encode() + b"\n"


_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEY_ID = re.compile(r"[0-9a-f]{16}")
_SIGNATURE = re.compile(r"[0-9a-f]{128}")


def parse_header_line(raw: bytes) -> tuple[Header, str]:
    """The header and signature of a checkpoint file's first line, which must be byte for byte the line
    `Header.line` writes: a file has one spelling, so any edit is found even where the JSON would mean the same.
    Raises ValueError saying what is wrong."""
    try:
        first = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; nesting past the limit
        raise ValueError(f"its first line is not JSON ({type(exc).__name__})") from None
    if not isinstance(first, dict) or first.get("format") != FORMAT:
        raise ValueError(f"its first line is not a {FORMAT} header")
    fields = {"format", "tree_size", "root", "at", "previous_root", "key_id", "signature"}
    if set(first) != fields:
        raise ValueError(f"its header has the fields {sorted(first)}, not {sorted(fields)}")
    size, root, at, previous, signer, signature = (
        first[k] for k in ("tree_size", "root", "at", "previous_root", "key_id", "signature")
    )
    if type(size) is not int or size < 0:
        raise ValueError("its tree size is not a count")
    if not (isinstance(root, str) and _HEX64.fullmatch(root)):
        raise ValueError("its root is not 64 lowercase hex digits")
    if previous is not None and not (isinstance(previous, str) and _HEX64.fullmatch(previous)):
        raise ValueError("its previous root is neither null nor 64 lowercase hex digits")
    if not (isinstance(signer, str) and _KEY_ID.fullmatch(signer)):
        raise ValueError("its key id is not 16 lowercase hex digits")
    if not (isinstance(signature, str) and _SIGNATURE.fullmatch(signature)):
        raise ValueError("its signature is not 128 lowercase hex digits")
    if not isinstance(at, str) or _instant(at) != at:
        raise ValueError("its time is not written as checkpoints write it")
    header = Header(size, root, at, previous, signer)
    if header.line(signature) != raw:
        raise ValueError("its first line is not written as checkpoints write it (canonical JSON, one line)")
    return header, signature


def parse_head_line(raw: bytes) -> Head:
    """One head of a checkpoint file, which must be byte for byte the line its leaf is. Raises ValueError."""
    try:
        value = json.loads(raw.decode("utf-8"))
        if not isinstance(value, list) or len(value) not in (3, 4):
            raise ValueError("not an array of 3 or 4")
        task_id, seq, digest, *tenant = value
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"not [task_id, seq, hash] or [task_id, seq, hash, tenant] ({type(exc).__name__})") from None
    head = Head(task_id, seq, digest, tenant[0] if tenant else None)
    problem = head_problem(head)
    if problem is not None:
        raise ValueError(problem)
    if head.leaf() + b"\n" != raw:
        raise ValueError("not written as checkpoints write a head (canonical JSON, one line)")
    return head


def head_problem(head: Head) -> str | None:
    """Why `head` is not one a checkpoint can hold (None when it is): what the writer refuses to sign and the
    reader refuses to read, so that no checkpoint is ever signed that its own reader would call invalid."""
    if not isinstance(head.task_id, str) or not head.task_id:
        return f"its task id {head.task_id!r} is not a text"
    if type(head.seq) is not int or head.seq < 1:
        return f"its seq {head.seq!r} is not a count from 1"
    if not isinstance(head.hash, str) or not _HEX64.fullmatch(head.hash):
        return f"its hash {head.hash!r} is not 64 lowercase hex digits"
    if head.tenant is not None and not (isinstance(head.tenant, str) and TENANT_NAME.fullmatch(head.tenant)):
        return f"its tenant {head.tenant!r} is not a tenant's name"
    return None


def _instant(text: str) -> str | None:
    try:
        return format_instant(parse_instant(text))
    except ValueError:
        return None


class HeadsRoot:
    """The Merkle root over heads fed one at a time in task id byte order (O(log n) memory), refusing a head
    out of that order: what writing and verifying a checkpoint both compute."""

    def __init__(self) -> None:
        self._builder = RootBuilder()
        self._last = b""

    @property
    def size(self) -> int:
        return self._builder.size

    def add(self, head: Head) -> bytes | None:
        """The head's leaf data (also its line in the file), or None if it does not come after the last one."""
        name = head.task_id.encode()
        if self._builder.size and name <= self._last:
            return None
        self._last = name
        leaf = head.leaf()
        self._builder.add(leaf_hash(leaf))
        return leaf

    def root(self) -> str:
        return self._builder.root().hex()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    header: Header
    signature: str
    heads: tuple[Head, ...]

    def tree(self) -> Levels:
        return tree_of(self.heads)

    def head_of(self) -> dict[str, Head]:
        return {h.task_id: h for h in self.heads}


def tree_of(heads: Sequence[Head]) -> Levels:
    return Levels([leaf_hash(h.leaf()) for h in heads])


def head_findings(expected: Head, found: Head | None, hash_at: Callable[[str, int], str | None]) -> list[Finding]:
    """What a task's log as it is now says against the head a checkpoint recorded: `found` is the task's head as
    its row states it (None if the task is gone), `hash_at(task_id, seq)` reads the hash of event `seq` from the
    log itself (None if it has none), so a row left standing over a log cut short does not pass for the log."""
    if found is None:
        return [Finding(Code.TASK_MISSING, 0, f"the checkpoint lists it at seq {expected.seq}; it is not there")]
    if found.tenant != expected.tenant:  # a task's tenant never changes: its row was moved behind the log
        return [
            Finding(
                Code.STATE_MISMATCH,
                expected.seq,
                f"its row says tenant {found.tenant!r}; the checkpoint recorded {expected.tenant!r}",
            )
        ]
    if found.seq < expected.seq:
        return [
            Finding(
                Code.TASK_TRUNCATED,
                found.seq,
                f"its log ends at seq {found.seq}; the checkpoint recorded seq {expected.seq}",
            )
        ]
    actual = hash_at(expected.task_id, expected.seq)
    if actual is None:
        return [
            Finding(
                Code.TASK_TRUNCATED,
                expected.seq,
                f"its log has no event {expected.seq} (its row says seq {found.seq}); the checkpoint recorded it",
            )
        ]
    if actual != expected.hash:
        return [
            Finding(
                Code.HEAD_REWRITTEN,
                expected.seq,
                f"event {expected.seq} is not the one the checkpoint recorded (hash {str(actual)[:12]}…, "
                f"checkpointed {expected.hash[:12]}…)",
            )
        ]
    return []


def descends(log: Sequence[Event], older: Head, newer: Head) -> bool:
    """Whether `log` (the task's events, in seq order, covering `older.seq` to `newer.seq`) runs from the older
    head to the newer one: it holds both, and every event between chains to the one before it and hashes to its
    own content. Two heads whose hash columns merely say the right values do not descend."""
    span = [e for e in log if older.seq <= e.seq <= newer.seq]
    if not span or span[0].seq != older.seq or span[0].hash != older.hash:
        return False
    for before, after in itertools.pairwise(span):
        if after.seq != before.seq + 1 or after.prev_hash != before.hash or after.computed_hash() != after.hash:
            return False
    return span[-1].seq == newer.seq and span[-1].hash == newer.hash


def extends(old: Checkpoint, new: Checkpoint, descends: Callable[[Head, Head], bool]) -> list[Finding]:
    """Whether `new` extends `old`: every task of `old` is in `new`, at a head that descends from its old one
    (`descends(old_head, new_head)` answers from the logs; a head that did not move descends from itself)."""
    found = []
    current = new.head_of()
    for head in old.heads:
        later = current.get(head.task_id)
        if later is None:
            found.append(Finding(Code.CHECKPOINT_NOT_EXTENDING, 0, f"task {head.task_id} is not in the newer one"))
        elif later != head and (later.seq < head.seq or not descends(head, later)):
            found.append(
                Finding(
                    Code.CHECKPOINT_NOT_EXTENDING,
                    head.seq,
                    f"task {head.task_id}: the newer checkpoint's head (seq {later.seq}) does not descend from "
                    f"seq {head.seq}",
                )
            )
    return found


def inclusion_holds(head: Head, index: int, tree_size: int, root: str, proof: Sequence[str]) -> bool:
    """Whether `proof` (hex hashes) shows `head` as leaf `index` of a tree of `tree_size` leaves with `root` (hex)."""
    try:
        path = [bytes.fromhex(p) for p in proof]
        top = bytes.fromhex(root)
    except ValueError:
        return False
    return verify_inclusion(index, tree_size, leaf_hash(head.leaf()), path, top)
