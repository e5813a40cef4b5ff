"""Alembic environment: the only way Railyard's schema is created or changed, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from engine import config as railyard_config
from engine.store.database import normalize_url
from engine.store.schema import POSTGRESQL_ONLY_INDEXES, metadata

config = context.config
target_metadata = metadata


def _ours(name: str | None, type_: str, _parents: object) -> bool:
    """Compare only Railyard's tables: others in the same database (the reference fakes' `fake_*` tables, an
    application's own) are not Railyard's to create or drop, so `alembic check` must not report them. Nor
    the indexes on an expression that only PostgreSQL has (`schema.POSTGRESQL_ONLY_INDEXES`)."""
    if type_ == "index":
        return name not in POSTGRESQL_ONLY_INDEXES
    return type_ != "table" or name in target_metadata.tables


def _url() -> str:
    return normalize_url(config.attributes.get("railyard_url") or railyard_config.database_url())


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (`alembic upgrade head --sql`)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = _url()
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection: object) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=_url().startswith("sqlite"),
        compare_type=True,
        include_name=_ours,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
