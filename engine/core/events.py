"""Events: one row of a task's log, one transition, linked into a hash chain.

`hash = sha256(prev_hash || canonical_json(body))` where the body is every
column but the two hashes. Changing any stored byte of an event breaks its own
hash; deleting or reordering events breaks the next event's `prev_hash`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from engine.core.canonical import canonical_json, format_instant, json_string, sha256_hex
from engine.core.payloads import EventData
from engine.core.records import quick_init

#: The key under which a reader keeps stored data that is no longer a JSON object (an edited row): the
#: event is still read, and its hash no longer matches, so replay reports it instead of failing.
UNREADABLE = "!unreadable"


@quick_init
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
    data: EventData
    prev_hash: str
    hash: str
    #: The data column exactly as the store read it (see `with_stored_data`), kept only to check the hash
    #: without encoding `data` again. Not an init field: `dataclasses.replace` never carries it to a copy.
    stored_data: str | None = field(default=None, init=False, compare=False, repr=False)

    def body(self) -> dict[str, Any]:
        """The hashed content: every field except the two hashes."""
        return event_body(
            self.task_id, self.seq, self.at, self.actor, self.from_state, self.trigger, self.to_state, self.data
        )

    def computed_hash(self) -> str:
        """The hash this event should carry given its content and `prev_hash`.

        Replay recomputes every hash of every log. With the stored data text at hand the
        canonical body is assembled around it instead of encoding `data` again; that is
        trusted only when it reproduces the stored hash. It then *is* the sealed canonical
        text (the data text inside it decodes to `data`), short of a sha256 collision.
        Anything else (an edited row, non-canonical text) takes the full canonical path.
        """
        text = self.stored_data
        if text is not None and type(self.seq) is int:  # an int prints as the canonical encoder writes it
            quick = sha256_hex(
                self.prev_hash
                + stored_body(
                    self.task_id, self.seq, self.at, self.actor, self.from_state, self.trigger, self.to_state, text
                )
            )
            if quick == self.hash:
                return quick
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
    data: EventData,
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


def stored_body(
    task_id: str,
    seq: int,
    at: datetime,
    actor: str,
    from_state: str | None,
    trigger: str,
    to_state: str,
    data_text: str,
) -> str:
    """`canonical_json(event_body(...))` with the data already encoded as `data_text`.

    The keys in sorted order, strings escaped by the canonical encoder's own function,
    no whitespace: a property test holds it equal to `canonical_json` of the body.
    """
    source = json_string(from_state) if from_state is not None else "null"
    return (
        f'{{"actor":{json_string(actor)},"at":"{format_instant(at)}","data":{data_text},'
        f'"from_state":{source},"seq":{seq},"task_id":{json_string(task_id)},'
        f'"to_state":{json_string(to_state)},"trigger":{json_string(trigger)}}}'
    )


def with_stored_data(event: Event, data_text: str) -> Event:
    """`event` as read from the store, carrying the text its `data` was decoded from (for a faster hash check)."""
    _set_stored_data(event, data_text)
    return event


#: The slot's own setter: past the frozen class's `__setattr__` (as `quick_init` sets fields), once per event read.
_set_stored_data = Event.__dict__["stored_data"].__set__


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
    data: EventData,
    prev_hash: str,
) -> Event:
    """Build the next event of a chain, computing its hash."""
    body = event_body(task_id, seq, at, actor, from_state, trigger, to_state, data)
    return Event(task_id, seq, at, actor, from_state, trigger, to_state, data, prev_hash, chain_hash(prev_hash, body))
