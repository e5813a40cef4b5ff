"""The event store (SQLite or PostgreSQL) and its schema."""

from engine.store.database import dialect_of, make_engine, normalize_url
from engine.store.store import Loaded, Snapshot, Store, TaskRow

__all__ = ["Loaded", "Snapshot", "Store", "TaskRow", "dialect_of", "make_engine", "normalize_url"]
