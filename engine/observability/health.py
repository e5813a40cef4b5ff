"""Readiness: is the database reachable, and is its schema the one this release's migrations end at?

`/readyz` asks this on every probe, so a load balancer stops sending traffic to
a server whose database is away or was not migrated (or was migrated by a newer
release) instead of letting its requests fail one by one. Liveness (`/healthz`)
needs no question: the process answered.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import exc as sa_exc

from engine.core.errors import Code
from engine.store import SqlStore, Store, migrations
from engine.store.database import connection_problem

log = logging.getLogger("railyard.observability")


@dataclass(frozen=True, slots=True)
class Readiness:
    """The answer to a probe: ready, or the code and the reason it is not."""

    ready: bool
    code: Code | None
    message: str
    #: The database's schema revision(s), and the revision(s) this release's migrations end at.
    revision: tuple[str, ...] = ()
    head: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not ready",
            "code": str(self.code) if self.code is not None else None,
            "message": self.message,
            "revision": list(self.revision),
            "head": list(self.head),
        }


@functools.cache
def head_revisions() -> tuple[str, ...]:
    """The revisions this release's migrations end at (read once: they are files of the installed package)."""
    script = ScriptDirectory.from_config(migrations.alembic_config("sqlite://"))
    return tuple(sorted(script.get_heads()))


def readiness(store: Store) -> Readiness:
    """Whether `store` can serve: reachable, and its schema at head (an in-memory store has no schema to check)."""
    if not isinstance(store, SqlStore):
        return Readiness(True, None, "in-memory store")
    head = head_revisions()
    try:
        with store.engine.connect() as conn:
            revision = tuple(sorted(MigrationContext.configure(conn).get_current_heads()))
    except (sa_exc.SQLAlchemyError, OSError) as exc:
        cause = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
        # The code the CLI gives the same failure (DATABASE_UNREACHABLE, DATABASE_NOT_FOUND...); its message,
        # which names the host and the user, goes to the log only.
        problem = connection_problem(store.url, cause if isinstance(cause, BaseException) else None)
        code = problem.code if problem is not None else Code.DATABASE_ERROR
        log.warning("readiness: %s: %.200s", code, problem.message if problem is not None else cause)
        return Readiness(False, code, f"the database did not answer ({code})", (), head)
    if not revision:
        return Readiness(False, Code.SCHEMA_MISSING, "the database has no Railyard schema: run `railyard db upgrade`")
    if revision != head:
        return Readiness(
            False,
            Code.SCHEMA_NOT_AT_HEAD,
            f"the schema is at {', '.join(revision)}, this release's migrations end at {', '.join(head)}: "
            "run `railyard db upgrade`",
            revision,
            head,
        )
    return Readiness(True, None, "database reachable, schema at head", revision, head)
