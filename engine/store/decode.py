"""Reading a stored event back: its time and its data as the column holds them, the same way for every store.

The data column is the canonical JSON text that was hashed. The runtime refuses
text that no longer decodes to an object (an edited row: a broken link of the
chain, coded); replay keeps it as found, so the hash check reports it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from engine.core.canonical import parse_instant, utc
from engine.core.errors import Code, IntegrityError
from engine.core.events import UNREADABLE
from engine.core.payloads import EventData, as_event_data


def read_instant(value: datetime | str) -> datetime:
    """A timestamp as the driver returned it (aware from psycopg, text from sqlite3), as aware UTC."""
    return parse_instant(value) if isinstance(value, str) else utc(value)


def audit_instant(value: datetime | str) -> datetime:
    """An event's time for replay: a stored text that no longer parses becomes the epoch, so its hash fails."""
    try:
        return read_instant(value)
    except ValueError:
        return datetime.fromtimestamp(0, UTC)


def audit_data(text: str) -> EventData:
    """An event's data for replay: text that is no longer a JSON object is kept as found, so its hash fails.

    Stored data is canonical JSON with nothing around it, so `raw_decode` (what `json.loads` runs after two
    whitespace scans) reads it; anything else goes the long way.
    """
    try:
        data, end = _DECODE(text)
        if end != len(text):
            data = json.loads(text)
    except ValueError:
        data = None
    return as_event_data(data if type(data) is dict else {UNREADABLE: text})


_DECODE = json.JSONDecoder().raw_decode


def stored_data(text: str, task_id: str, seq: int) -> EventData:
    """An event's data for the runtime: a stored text that is no longer a JSON object was edited (a coded refusal,
    like any other broken link of the chain, rather than a decoder's traceback)."""
    data = audit_data(text)
    if UNREADABLE in data and len(data) == 1:
        raise IntegrityError(
            f"task {task_id}: the data of event {seq} is not the JSON object that was hashed",
            code=Code.HASH_MISMATCH,
            task_id=task_id,
            seq=seq,
        )
    return data
