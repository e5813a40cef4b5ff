"""Connections: one SQLAlchemy engine per store, configured for how Railyard writes.

SQLite: WAL, foreign keys on, a busy timeout, and transactions begun by us so
that writes take the write lock up front (`BEGIN IMMEDIATE`) instead of
failing on a lock upgrade halfway through.

PostgreSQL: autocommit connections. Every write the store makes is one
statement (data-modifying CTEs), which is its own transaction, so an append
costs one round trip and no BEGIN/COMMIT.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, make_url

from engine.core.errors import Code, RailyardError, StoreError
from engine.core.text import closest

#: Execution option that makes the next SQLite transaction a writer (`BEGIN IMMEDIATE`).
WRITE = "railyard_write"
#: What a database URL may look like, said in every refusal of one.
EXPECTED_FORMS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
)
#: The schemes (backend, then the driver after `+`) Railyard can store tasks in.
_DRIVERS = {"sqlite": ("", "pysqlite"), "postgresql": ("", "psycopg")}
_PASSWORD = re.compile(r"(://[^/@:]*:)[^@/]*@")
#: A PostgreSQL server waits this long for a connection before the command says it did not answer.
CONNECT_TIMEOUT_SECONDS = 10


def redact_url(url: str) -> str:
    """`url` fit to print or log: the password, if any, replaced by `***` (even in a URL that does not parse)."""
    return _PASSWORD.sub(r"\1***@", url)


def check_url(url: str) -> str:
    """The URL normalised, or DATABASE_URL_INVALID naming what is wrong with it and the forms expected.

    SQLAlchemy's own errors for these (a plugin it cannot load, a URL it cannot parse) are tracebacks that do not
    say what a Railyard URL looks like; every mistake a person makes typing one is caught here first.
    """
    url = normalize_url(url)
    shown = redact_url(url)
    if "://" not in url:
        hint = f" (for a SQLite file: sqlite:///{url})" if url and not url.startswith(("sqlite:", "postgres")) else ""
        _bad_url(f"{shown!r} is not a URL{hint}")
    scheme = url.split("://", 1)[0]
    backend, _, driver = scheme.partition("+")
    if backend not in _DRIVERS:
        close = closest(backend, [*_DRIVERS, "postgresql+psycopg"])
        guess = f"; did you mean {close}?" if close else ""
        _bad_url(f"{shown!r}: Railyard stores tasks in SQLite or PostgreSQL, not {backend!r}{guess}")
    if driver not in _DRIVERS[backend]:
        _bad_url(f"{shown!r}: the driver {driver!r} is not one Railyard uses for {backend}")
    try:
        parsed = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        _bad_url(f"{shown!r} does not parse as a URL")
    if backend == "sqlite" and (parsed.host or parsed.username or parsed.port):
        _bad_url(
            f"{shown!r} names a host ({parsed.host}): a SQLite URL has three slashes before a relative path "
            f"(sqlite:///{parsed.host}{'/' + parsed.database if parsed.database else ''}) and four before an "
            "absolute one"
        )
    if backend == "postgresql" and not parsed.database:
        _bad_url(f"{shown!r} names no database (postgresql+psycopg://USER@HOST:PORT/DATABASE)")
    return url


def _bad_url(problem: str) -> NoReturn:
    raise RailyardError(f"RAILYARD_DATABASE_URL {problem}; expected {EXPECTED_FORMS}", code=Code.DATABASE_URL_INVALID)


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names; None for another database or an in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    if parsed.database.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(parsed.database)


def require_database(url: str, *, create: bool = False) -> None:
    """Refuse (DATABASE_NOT_FOUND) a SQLite database that is not there, before anything connects to it.

    SQLite creates a missing file on connect: a read command on a mistyped path would leave an empty database
    behind, then suggest `railyard db upgrade` on it. Only `create` (that command) may make the file, and even it
    needs its folder.
    """
    path = sqlite_path(url)
    if path is None:
        return
    if not path.parent.is_dir():
        raise RailyardError(
            f"the folder {path.parent} of the SQLite database {path} does not exist: create it, or fix "
            "RAILYARD_DATABASE_URL",
            code=Code.DATABASE_NOT_FOUND,
        )
    if not create and not path.exists():
        raise RailyardError(
            f"no SQLite database at {path} (the file does not exist): fix RAILYARD_DATABASE_URL, or create the "
            "database with `railyard db upgrade`",
            code=Code.DATABASE_NOT_FOUND,
        )


def connection_problem(url: str, orig: BaseException | None) -> StoreError | None:
    """The error a driver raised on connecting (or a write the database refused as read-only), as one line naming
    the database and the cause; None if the error is not about reaching the database (a query that failed once
    connected)."""
    text = str(orig or "")
    first = text.strip().splitlines()[0] if text.strip() else type(orig).__name__
    try:
        parsed: URL | None = make_url(url)
    except (sa_exc.ArgumentError, ValueError):
        parsed = None
    if parsed is not None and parsed.get_backend_name() == "sqlite":
        where = (parsed.database or ":memory:").removeprefix("file:")
        if "readonly database" in text:
            return StoreError(
                f"the SQLite database {where} is read-only to this process (attempt to write a readonly database):"
                " give this user write access to the file and its folder, or point RAILYARD_DATABASE_URL at a"
                " writable copy",
                code=Code.DATABASE_READ_ONLY,
            )
        if "file is not a database" in text:
            return StoreError(
                f"{where} is not a SQLite database (file is not a database)", code=Code.DATABASE_FILE_INVALID
            )
        if "unable to open database file" in text:
            return StoreError(
                f"cannot open the SQLite database {where} (unable to open database file): check that its folder "
                "exists and that this user may write there",
                code=Code.DATABASE_NOT_FOUND,
            )
        return None
    if "read-only transaction" in text:  # a hot standby, or default_transaction_read_only on the database or role
        server = f" on PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}" if parsed is not None else ""
        name = f" database {parsed.database}" if parsed is not None else " the database"
        return StoreError(
            f"the{name}{server} is read-only ({first[:120]}): point RAILYARD_DATABASE_URL at the primary, or"
            " give this role write access",
            code=Code.DATABASE_READ_ONLY,
        )
    # psycopg's wording for a connection that could not be made (3.1 says "connection to server ...", 3.2 prefixes it).
    opening = (
        "connection failed",
        "connection to server",
        "failed to resolve host",
        "connection is bad",
        "connection timeout",
    )
    if not text.startswith(opening):
        return None
    reason = re.sub(r"^.*failed: ", "", first).replace("FATAL:  ", "").strip()
    hint = " (is the server running on that host and accepting TCP/IP connections?)" if "refused" in reason else ""
    if parsed is None:
        return StoreError(f"the database did not answer: {reason}{hint}", code=Code.DATABASE_UNREACHABLE)
    server = f"PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}"
    missing = re.search(r'database "(.+)" does not exist', reason)
    if missing:
        return StoreError(
            f"{server} has no database {missing.group(1)!r}: create it (createdb {missing.group(1)}), then run "
            "`railyard db upgrade`; or fix RAILYARD_DATABASE_URL",
            code=Code.DATABASE_NOT_FOUND,
        )
    if parsed.password:
        reason = reason.replace(parsed.password, "***")
    # A FATAL message is the server's own answer (an unknown role, a wrong password): it was reached, and said no.
    verdict = "refused the connection" if "FATAL:" in text else "did not answer"
    return StoreError(
        f"{server} (database {parsed.database}, user {parsed.username or 'default'}) {verdict}: {reason}{hint}",
        code=Code.DATABASE_UNREACHABLE,
    )


@contextmanager
def connection_errors(url: str) -> Iterator[None]:
    """Driver errors raised inside (by Alembic, or any code that connects on its own) as one coded line."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        problem = connection_problem(url, exc.orig)
        if problem is not None:
            raise problem from None
        cause = str(exc.orig).strip().splitlines()[0][:200] if str(exc.orig).strip() else ""
        raise StoreError(
            f"the database failed ({type(exc.orig).__name__}: {cause})", code=Code.DATABASE_ERROR
        ) from None


def normalize_url(url: str) -> str:
    """Accept `postgresql://` and `postgres://` as psycopg 3 URLs; anything else as given."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def dialect_of(url: str) -> str:
    return make_url(normalize_url(url)).get_backend_name()


def make_engine(url: str, *, application_name: str = "railyard", **kwargs: Any) -> Engine:
    """A SQLAlchemy engine for `url`. On PostgreSQL its connections carry `application_name` (unless the URL
    names one), so an operator reading pg_stat_activity tells Railyard's connections from others'."""
    url = check_url(url)
    backend = dialect_of(url)
    if backend == "sqlite":
        return _sqlite_engine(url, **kwargs)
    if backend == "postgresql":
        kwargs.setdefault("pool_size", 8)
        kwargs.setdefault("max_overflow", 16)
        # A host that drops packets would otherwise hold a command for the OS's TCP timeout (minutes).
        connect_args = kwargs.pop("connect_args", {})
        query = make_url(url).query
        if "connect_timeout" not in query:  # the URL's own ?connect_timeout= wins
            connect_args.setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
        if "application_name" not in query:
            connect_args.setdefault("application_name", application_name)
        return create_engine(url, isolation_level="AUTOCOMMIT", connect_args=connect_args, **kwargs)
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
