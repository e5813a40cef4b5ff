"""The event store: one protocol (`Store`) and the SQL store over SQLite or PostgreSQL (`SqlStore`, its SQL in
one module per dialect); the records they return are the core's (`engine.core.rows`)."""

from engine.core.rows import Loaded, Snapshot, TaskRow
from engine.store.database import dialect_of, make_engine, normalize_url
from engine.store.protocol import Store
from engine.store.sql import SqlStore


def open_store(url: str) -> Store:
    """The store a URL names."""
    return SqlStore(url)


__all__ = [
    "Loaded",
    "Snapshot",
    "SqlStore",
    "Store",
    "TaskRow",
    "dialect_of",
    "make_engine",
    "normalize_url",
    "open_store",
]
