"""leases and timers on tasks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease_owner", sa.String(200), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("lease_epoch", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index("ix_tasks_next_run_at", ["next_run_at"])
    # Tasks that already exist: runnable ones are due now; blocked ones wait for a human (no timer known).
    op.execute("UPDATE tasks SET next_run_at = updated_at WHERE status = 'runnable'")


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_index("ix_tasks_next_run_at")
        batch.drop_column("lease_epoch")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
        batch.drop_column("next_run_at")
