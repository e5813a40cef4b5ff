"""append-only events and checkpoints, enforced by the database; the checkpoints table

Triggers refuse every UPDATE of `events` and `checkpoints`, and every DELETE of
them, with a clear error. `railyard archive` gets past them by saying so: inside
its transaction it inserts a row into `archive_permits` (and removes it before
committing), so the triggers let its deletes through. No other transaction can
see that row. It is a declaration, not a credential: a session that may insert
into `archive_permits` can make it too (docs/operations.md says how to grant that
table to the archiving role alone), and a database owner can drop the triggers;
signed checkpoints kept outside the database are what catch those.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The message both databases give, so a person at a console reads the same thing.
REFUSAL = "railyard: {table} is append-only; only railyard archive may delete events"

PG_FUNCTION = """
CREATE FUNCTION railyard_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    permitted boolean := false;
BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'events' THEN
        -- The permits table of the events table's own schema: a temporary table of that name cannot stand in.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.archive_permits)', TG_TABLE_SCHEMA) INTO permitted;
        IF permitted THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'railyard: % is append-only; only railyard archive may delete events', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def _sqlite_triggers(table: str, deletable: bool) -> list[str]:
    message = REFUSAL.format(table=table)
    allowed = " WHEN NOT EXISTS (SELECT 1 FROM archive_permits)" if deletable else ""
    return [
        f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN SELECT RAISE(ABORT, '{message}'); END",
        f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}{allowed} "
        f"BEGIN SELECT RAISE(ABORT, '{message}'); END",
    ]


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        # A checkpoint of a database that did not change since the last one has the same root: the file names it.
        sa.Column("file", sa.String(300), primary_key=True),
        sa.Column("root", sa.String(64), nullable=False),
        sa.Column("tree_size", sa.Integer, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("previous_root", sa.String(64), nullable=True),
        sa.Column("key_id", sa.String(16), nullable=False),
    )
    op.create_table("archive_permits", sa.Column("holder", sa.String(64), primary_key=True))
    if op.get_context().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        for table in ("events", "checkpoints"):
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION railyard_append_only()"
            )
            # TRUNCATE fires no row trigger: refused by a statement trigger of its own.
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION railyard_append_only()"
            )
        return
    for statement in [*_sqlite_triggers("events", True), *_sqlite_triggers("checkpoints", False)]:
        op.execute(statement)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for table in ("events", "checkpoints"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        op.execute("DROP FUNCTION IF EXISTS railyard_append_only()")
    else:
        for table in ("events", "checkpoints"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
    op.drop_table("archive_permits")
    op.drop_table("checkpoints")
