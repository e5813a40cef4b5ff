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
    """A plain connection in one transaction, outside the engine, as the database's owner: the append-only
    triggers (migration 0007) are out of the way, as an owner can put them (they stop mistakes, not owners;
    signed checkpoints are what catch an owner's edits)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            around_the_guard(conn)
            yield conn
    finally:
        engine.dispose()


def around_the_guard(conn: Connection) -> None:
    """Let this transaction update and delete events: on PostgreSQL by turning triggers off for it (a superuser's
    `session_replication_role`), on SQLite by dropping them."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        return
    for table in ("events", "checkpoints"):
        for kind in ("update", "delete"):
            conn.execute(text(f"DROP TRIGGER IF EXISTS {table}_no_{kind}"))


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
