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
from collections.abc import Callable, Iterable
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.core.canonical import format_instant, now
from engine.core.checkpoints import FORMAT, Checkpoint, Head, Header, header_for, in_order, key_id
from engine.core.errors import Code, IntegrityError, RailyardError

_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


def keygen(path: Path) -> str:
    """Write a new private key to `path` (readable by its owner only) and return the public key, in hex."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise RailyardError(f"{path} exists: a signing key is never overwritten", code=Code.CONFIG_INVALID) from None
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
        data = path.read_bytes()
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


def verifier(key: Ed25519PublicKey) -> Callable[[bytes, bytes], bool]:
    """The signature check `consistency_findings` takes, for this public key."""

    def verify(signature: bytes, message: bytes) -> bool:
        try:
            key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    return verify


def sign(heads: Iterable[Head], key: Ed25519PrivateKey, *, previous_root: str | None) -> Checkpoint:
    ordered = in_order(heads)
    header = header_for(
        ordered,
        at=format_instant(now()),
        previous_root=previous_root,
        signer=key_id(key.public_key().public_bytes(*_RAW)),
    )
    return Checkpoint(header, key.sign(header.signed_bytes()).hex(), ordered)


def write(checkpoint: Checkpoint, directory: Path) -> Path:
    """Write `checkpoint` as a new file in `directory` (never over another) and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    h = checkpoint.header
    stamp = h.at.replace(":", "").replace("-", "")
    path = directory / f"checkpoint-{stamp}-{h.tree_size}-{h.root[:12]}.jsonl"
    first = {
        "format": FORMAT,
        "tree_size": h.tree_size,
        "root": h.root,
        "at": h.at,
        "previous_root": h.previous_root,
        "key_id": h.key_id,
        "signature": checkpoint.signature,
    }
    lines = [json.dumps(first, sort_keys=True, separators=(",", ":"))]
    lines += [json.dumps([head.task_id, head.seq, head.hash], separators=(",", ":")) for head in checkpoint.heads]
    with path.open("x", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return path


def read(path: Path) -> Checkpoint:
    """A checkpoint file as written. One that cannot be parsed is a CHECKPOINT_INVALID integrity error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RailyardError(f"cannot read the checkpoint {path}: {exc}", code=Code.CONFIG_INVALID) from None
    try:
        lines = text.splitlines()
        first = json.loads(lines[0])
        if first.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        header = Header(
            int(first["tree_size"]), str(first["root"]), str(first["at"]), first["previous_root"], str(first["key_id"])
        )
        heads = []
        for line in lines[1:]:
            task_id, seq, digest = json.loads(line)
            if not isinstance(task_id, str) or type(seq) is not int or not isinstance(digest, str):
                raise ValueError(f"a head line that is not [task_id, seq, hash]: {line[:80]}")
            heads.append(Head(task_id, seq, digest))
        return Checkpoint(header, str(first["signature"]), tuple(heads))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise IntegrityError(f"{path} is not a readable checkpoint: {exc}", code=Code.CHECKPOINT_INVALID) from None
