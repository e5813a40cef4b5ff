"""The event store: one protocol (`Store`, the sum of its roles: `TaskLog`, `Leases`, `AuditLog`, `BackOffice`,
`WebhookStore`; `FlowStore` apart) and its backends, the SQL store over SQLite or PostgreSQL (`SqlStore`,
its SQL in one module per dialect) and the in-memory store (`MemoryStore`); the records they return are the
core's (`engine.core.rows`)."""

from engine.core.rows import Loaded, Snapshot, TaskRow
from engine.store.database import dialect_of, make_engine, normalize_url, redact_url
from engine.store.memory import MemoryStore
from engine.store.protocol import AuditLog, BackOffice, Leases, Store, TaskLog, WebhookStore
from engine.store.sql import SqlStore

#: The URL of a new, empty in-memory store.
MEMORY_URL = "memory://"


def open_store(url: str) -> Store:
    """The store a URL names: `memory://` a new, empty in-memory store; anything else a SQL database."""
    return MemoryStore() if url == MEMORY_URL else SqlStore(url)


__all__ = [
    "MEMORY_URL",
    "AuditLog",
    "BackOffice",
    "Leases",
    "Loaded",
    "MemoryStore",
    "Snapshot",
    "SqlStore",
    "Store",
    "TaskLog",
    "TaskRow",
    "WebhookStore",
    "dialect_of",
    "make_engine",
    "normalize_url",
    "open_store",
    "redact_url",
]
