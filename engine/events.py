"""Events: one row of a task's log, one transition, linked into a hash chain.

`hash = sha256(prev_hash || canonical_json(body))` where the body is every
column but the two hashes. Changing any stored byte of an event breaks its own
hash; deleting or reordering events breaks the next event's `prev_hash`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.canonical import canonical_json, format_instant, sha256_hex

#: The key under which a reader keeps stored data that is no longer a JSON object (an edited row): the
#: event is still read, and its hash no longer matches, so replay reports it instead of failing.
UNREADABLE = "!unreadable"


@dataclass(frozen=True, slots=True)
class Event:
    """One transition as stored. `from_state` is None only for the `start` event (seq 1)."""

    task_id: str
    seq: int
    at: datetime
    actor: str
    from_state: str | None
    trigger: str
    to_state: str
    data: dict[str, Any]
    prev_hash: str
    hash: str

    def body(self) -> dict[str, Any]:
        """The hashed content: every field except the two hashes."""
        return event_body(
            self.task_id, self.seq, self.at, self.actor, self.from_state, self.trigger, self.to_state, self.data
        )

    def computed_hash(self) -> str:
        """The hash this event should carry given its content and `prev_hash`."""
        return chain_hash(self.prev_hash, self.body())

    def to_dict(self) -> dict[str, Any]:
        """The export / `--json` form of an event."""
        out = self.body()
        out["prev_hash"] = self.prev_hash
        out["hash"] = self.hash
        return out


def event_body(
    task_id: str,
    seq: int,
    at: datetime,
    actor: str,
    from_state: str | None,
    trigger: str,
    to_state: str,
    data: dict[str, Any],
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "seq": seq,
        "at": format_instant(at),
        "actor": actor,
        "from_state": from_state,
        "trigger": trigger,
        "to_state": to_state,
        "data": data,
    }


def chain_hash(prev_hash: str, body: dict[str, Any]) -> str:
    return sha256_hex(prev_hash + canonical_json(body))


def seal(
    *,
    task_id: str,
    seq: int,
    at: datetime,
    actor: str,
    from_state: str | None,
    trigger: str,
    to_state: str,
    data: dict[str, Any],
    prev_hash: str,
) -> Event:
    """Build the next event of a chain, computing its hash."""
    body = event_body(task_id, seq, at, actor, from_state, trigger, to_state, data)
    return Event(task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, chain_hash(prev_hash, body))


def event_code(data: dict[str, Any]) -> str | None:
    """The code an event carries, wherever its kind of step records it (a limit, a model turn, a tool outcome)."""
    turn = data.get("turn") or {}
    outcome = data.get("outcome") or {}
    error = (data.get("tool_result") or {}).get("error") or {}
    found = data.get("code") or turn.get("code") or outcome.get("code") or error.get("code")
    return str(found) if found else None
