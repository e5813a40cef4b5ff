"""Verify a task's hash chain: the check an auditor (and every concurrency test) runs first.

Pure: it reads events and recomputes hashes, calling no model, tool or database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.canonical import GENESIS_HASH
from engine.errors import Code
from engine.events import Event


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with a log, with its stable code and the seq where it was seen."""

    code: Code
    seq: int
    message: str


def verify_chain(events: Iterable[Event]) -> list[Finding]:
    """Every break in `events` (one task's log, in stored order): seq gaps and hash mismatches."""
    findings: list[Finding] = []
    expected_seq = 1
    prev_hash = GENESIS_HASH
    for event in events:
        if event.seq != expected_seq:
            findings.append(Finding(Code.SEQ_GAP, event.seq, f"expected seq {expected_seq}, found {event.seq}"))
        if event.prev_hash != prev_hash:
            findings.append(Finding(Code.HASH_MISMATCH, event.seq, "prev_hash does not match the previous event"))
        if event.computed_hash() != event.hash:
            findings.append(Finding(Code.HASH_MISMATCH, event.seq, "hash does not match the event's content"))
        expected_seq = event.seq + 1
        prev_hash = event.hash
    return findings
