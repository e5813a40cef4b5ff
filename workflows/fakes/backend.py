"""Where the fake systems keep their data: their own tables in the database the engine uses.

A tool implementation receives only the prepared call, not the engine, so the
fakes find their database the way a worker does, from RAILYARD_DATABASE_URL;
a test or the demo that runs an engine on another URL binds them to it with
`bind`. Tables are created and seeded on first use in each process (and a
process never reuses another's connections, so a forked worker is safe).
"""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager

from sqlalchemy import Connection, Engine, delete, exc, func, select

from engine import config
from engine.store.database import dialect_of, make_engine, normalize_url, reading, writing
from workflows.fakes import schema
from workflows.fakes.seed import seed

_lock = threading.Lock()
_bound: str | None = None
_backends: dict[tuple[int, str], Backend] = {}


class Backend:
    """One database's fake systems: a connection pool and transactions shaped like the engine's own."""

    def __init__(self, url: str) -> None:
        self.url = normalize_url(url)
        self.dialect = dialect_of(self.url)
        self.engine: Engine = (
            make_engine(self.url, pool_size=16, application_name="railyard-fakes")
            if self.dialect == "postgresql"
            else make_engine(self.url)
        )
        self._ensure()

    def write(self) -> AbstractContextManager[Connection]:
        """The engine's own write transaction (`engine.store.database.writing`), on the fakes' tables."""
        return writing(self.engine)

    def read(self) -> AbstractContextManager[Connection]:
        return reading(self.engine)

    def reset(self) -> None:
        """Back to the seed data: every book emptied, every armed fault disarmed."""
        with self.write() as conn:
            for table in schema.ALL:
                conn.execute(delete(table))
            seed(conn)

    def dispose(self) -> None:
        self.engine.dispose()

    def _ensure(self) -> None:
        # Several workers may start at once on a fresh database: a lost race to create or seed is harmless.
        for _attempt in range(3):
            try:
                schema.metadata.create_all(self.engine, checkfirst=True)
                with self.write() as conn:
                    if conn.execute(select(func.count()).select_from(schema.customers)).scalar_one() == 0:
                        seed(conn)
                return
            except (exc.IntegrityError, exc.ProgrammingError, exc.OperationalError):
                continue
        schema.metadata.create_all(self.engine, checkfirst=True)


def bind(url: str | None) -> None:
    """Make the fakes use `url` in this process (None: back to RAILYARD_DATABASE_URL)."""
    global _bound
    with _lock:
        _bound = normalize_url(url) if url else None


def backend(url: str | None = None) -> Backend:
    """The fakes' backend for `url`, else the bound URL, else the engine's configured database."""
    target = normalize_url(url or _bound or config.database_url())
    key = (os.getpid(), target)
    with _lock:
        found = _backends.get(key)
        if found is None:
            found = _backends[key] = Backend(target)
        return found


def close(url: str | None = None) -> None:
    """Dispose of this process's pools (for `url`, or all of them): tests with many databases call it."""
    with _lock:
        for key in [k for k in _backends if url is None or k[1] == normalize_url(url)]:
            _backends.pop(key).dispose()
