"""the tenant a task belongs to, for confining every list, read and count to the caller's tenants

A task may belong to a tenant, taken from the trusted caller when it starts
(the `start` event's `data.tenant`, which replay checks against this column).
NULL is a task of no tenant: every task of a single-tenant install. The lists
page newest first within a tenant, so the index leads with it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("tenant", sa.String(64), nullable=True))
    op.create_index("ix_tasks_tenant_created", "tasks", ["tenant", "created_at", "task_id"])


def downgrade() -> None:
    op.drop_index("ix_tasks_tenant_created", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("tenant")
