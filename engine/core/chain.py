"""Verify a task's hash chain: the check an auditor (and every concurrency test) runs first.

Pure: it reads events and recomputes hashes, calling no model, tool or database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.core.canonical import GENESIS_HASH
from engine.core.errors import Code
from engine.core.events import Event


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong with a log, with its stable code and the seq where it was seen (0: the task as a whole)."""

    code: Code
    seq: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": str(self.code), "seq": self.seq, "message": self.message}


def link_findings(event: Event, expected_seq: int, prev_hash: str, *, content: bool = True) -> list[Finding]:
    """What is wrong with `event` as the successor of the event that carried `prev_hash` at `expected_seq - 1`.

    One place for the chain rules, shared by `verify_chain` and replay, so the two
    can never disagree about what counts as a break. `content=False`: the event as
    shown withholds values (an export made for a reader without their role), so its
    own hash cannot be recomputed; its seq and its link still can.
    """
    findings: list[Finding] = []
    if event.seq != expected_seq:
        findings.append(Finding(Code.SEQ_GAP, event.seq, f"expected seq {expected_seq}, found {event.seq}"))
    if event.prev_hash != prev_hash:
        findings.append(Finding(Code.HASH_MISMATCH, event.seq, "prev_hash does not match the previous event"))
    if content and event.computed_hash() != event.hash:
        findings.append(Finding(Code.HASH_MISMATCH, event.seq, "hash does not match the event's content"))
    return findings


def verify_chain(events: Iterable[Event]) -> list[Finding]:
    """Every break in `events` (one task's log, in stored order): seq gaps and hash mismatches."""
    findings: list[Finding] = []
    expected_seq = 1
    prev_hash = GENESIS_HASH
    for event in events:
        findings.extend(link_findings(event, expected_seq, prev_hash))
        expected_seq = event.seq + 1
        prev_hash = event.hash
    return findings
