"""Edits made behind the engine's back, as an insider with write access to the database would make them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, create_engine, text

from engine import Engine
from engine.core.events import seal
from engine.core.payloads import as_event_data


@contextmanager
def sql(url: str) -> Iterator[Connection]:
    """A plain connection in one transaction, outside the engine."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def tamper(url: str, statement: str, **params: object) -> None:
    """Run one statement behind the engine's back."""
    with sql(url) as conn:
        conn.execute(text(statement), params)


def forge(
    eng: Engine,
    task_id: str,
    *,
    trigger: str,
    to_state: str,
    data: dict[str, Any] | None = None,
    status: str = "runnable",
) -> None:
    """Append an event with a valid hash and move the row to it: an insider who can recompute the chain."""
    row = eng.store.row(task_id)
    assert row is not None
    last = eng.history(task_id)[-1]
    event = seal(
        task_id=task_id,
        seq=row.seq + 1,
        at=last.at + timedelta(seconds=1),
        actor="mallory",
        from_state=row.state,
        trigger=trigger,
        to_state=to_state,
        data=as_event_data(data or {}),
        prev_hash=row.last_hash,
    )
    eng.store.append(task_id, row.seq, [event], status=status)
