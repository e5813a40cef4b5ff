"""The event store (SQLite or PostgreSQL) and its schema; the records it returns are the core's (`engine.core.rows`)."""

from engine.core.rows import Loaded, Snapshot, TaskRow
from engine.store.database import dialect_of, make_engine, normalize_url
from engine.store.store import Store

__all__ = ["Loaded", "Snapshot", "Store", "TaskRow", "dialect_of", "make_engine", "normalize_url"]
