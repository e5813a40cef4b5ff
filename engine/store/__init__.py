"""The event store: one protocol (`Store`) and its backends, the SQL store over SQLite or PostgreSQL (`SqlStore`,
its SQL in one module per dialect) and the in-memory store (`MemoryStore`); the records they return are the
core's (`engine.core.rows`)."""

from engine.core.rows import Loaded, Snapshot, TaskRow
from engine.store.database import dialect_of, make_engine, normalize_url, redact_url
from engine.store.memory import MemoryStore
from engine.store.protocol import Store
from engine.store.sql import SqlStore

#: The URL of a new, empty in-memory store.
MEMORY_URL = "memory://"


def open_store(url: str) -> Store:
    """The store a URL names: `memory://` a new, empty in-memory store; anything else a SQL database."""
    return MemoryStore() if url == MEMORY_URL else SqlStore(url)


__all__ = [
    "MEMORY_URL",
    "Loaded",
    "MemoryStore",
    "Snapshot",
    "SqlStore",
    "Store",
    "TaskRow",
    "dialect_of",
    "make_engine",
    "normalize_url",
    "open_store",
    "redact_url",
]
