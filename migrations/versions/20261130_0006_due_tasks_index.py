"""a partial index of unfinished tasks by due time, for claims

Without it PostgreSQL may plan a claim through the workflow index and read
every task of the workflow, finished ones included, until statistics are fresh
(measured in bench/workers.py: 2 ms a claim at 3,000 finished tasks, growing).
It replaces the plain index on next_run_at from 0002, which every query of due
tasks now reaches through this one: appends that move next_run_at keep one index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    unfinished = sa.text("status <> 'terminal'")
    op.create_index("ix_tasks_due", "tasks", ["next_run_at"], postgresql_where=unfinished, sqlite_where=unfinished)
    op.drop_index("ix_tasks_next_run_at", table_name="tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_next_run_at", "tasks", ["next_run_at"])
    op.drop_index("ix_tasks_due", table_name="tasks")
