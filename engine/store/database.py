"""Connections: one SQLAlchemy engine per store, configured for how Railyard writes.

SQLite: WAL, foreign keys on, a busy timeout, and transactions begun by us so
that writes take the write lock up front (`BEGIN IMMEDIATE`) instead of
failing on a lock upgrade halfway through.

PostgreSQL: autocommit connections. Every write the store makes is one
statement (data-modifying CTEs), which is its own transaction, so an append
costs one round trip and no BEGIN/COMMIT.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url

#: Execution option that makes the next SQLite transaction a writer (`BEGIN IMMEDIATE`).
WRITE = "railyard_write"


def normalize_url(url: str) -> str:
    """Accept `postgresql://` and `postgres://` as psycopg 3 URLs; anything else as given."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def dialect_of(url: str) -> str:
    return make_url(normalize_url(url)).get_backend_name()


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    backend = dialect_of(url)
    if backend == "sqlite":
        return _sqlite_engine(url, **kwargs)
    if backend == "postgresql":
        kwargs.setdefault("pool_size", 8)
        kwargs.setdefault("max_overflow", 16)
        return create_engine(url, isolation_level="AUTOCOMMIT", **kwargs)
    return create_engine(url, **kwargs)


def _sqlite_engine(url: str, **kwargs: Any) -> Engine:
    connect_args = kwargs.pop("connect_args", {})
    connect_args.setdefault("timeout", 30)
    connect_args.setdefault("check_same_thread", False)
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN is ours to emit.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        # SQLAlchemy resets a connection that ran under isolation_level="AUTOCOMMIT" to the sqlite3 module's
        # implicit transactions when it returns to the pool. A raw single-statement write (a lease release)
        # on such a connection would open a transaction that the pool then rolls back: take control back.
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return  # each statement commits on its own, as the caller asked
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITE) else "BEGIN")

    return engine


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A real write transaction: on SQLite it takes the write lock up front (no failed lock upgrade halfway),
    on PostgreSQL it leaves the pool's autocommit for READ COMMITTED."""
    options: dict[str, Any] = {WRITE: True}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "READ COMMITTED"
    with engine.connect().execution_options(**options) as conn, conn.begin():
        yield conn


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read transaction: one consistent view for the statements inside it."""
    with engine.connect() as conn, conn.begin():
        yield conn
