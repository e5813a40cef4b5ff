"""workers table (live counts for `railyard status`); on PostgreSQL, NOTIFY when a task becomes claimable

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A task is worth waking an idle worker for when nobody holds it and it is due now (or within a few
#: seconds: the writer's clock and the database's may differ a little; a worker woken early finds nothing
#: and waits for the next wake-up or poll). Worker appends keep `lease_owner` set, so they never notify:
#: only starts, human decisions and released leases do. The payload is the workflow name, for
#: workers that serve only some workflows.
NOTIFY_FUNCTION = """
CREATE FUNCTION railyard_notify_runnable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('railyard_runnable', NEW.workflow);
    RETURN NULL;
END
$$
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER tasks_notify_runnable
AFTER INSERT OR UPDATE OF next_run_at, lease_owner ON tasks
FOR EACH ROW
WHEN (NEW.status <> 'terminal' AND NEW.lease_owner IS NULL AND NEW.next_run_at IS NOT NULL
      AND NEW.next_run_at <= now() + interval '5 seconds')
EXECUTE FUNCTION railyard_notify_runnable()
"""


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("counts", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )
    if op.get_context().dialect.name == "postgresql":
        op.execute(NOTIFY_FUNCTION)
        op.execute(NOTIFY_TRIGGER)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS tasks_notify_runnable ON tasks")
        op.execute("DROP FUNCTION IF EXISTS railyard_notify_runnable()")
    op.drop_table("workers")
