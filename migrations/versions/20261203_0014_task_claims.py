"""who is on a work item, and the work queue's orders: a claim per task, and an index of blocked tasks per order

The back office's work queue lets a person claim an item ("dana is on it"), so
that two approvers stop working the same card. A claim is kept beside the task,
not in its log: it is no transition, and an event would move the task's seq,
refusing every decision form and bulk selection opened on it. A claim holds
while it has not expired and the task still stands at the seq it was taken at.

The queue's table sorts by deadline, by how long a task has waited, by creation,
by workflow or by state, a keyset page of 50 at a time. At 100,000 waiting
tasks, sorting them for each page took longer than the page may (a top-N sort
of every waiting task); with a partial index of blocked tasks per order, each
ending in (created_at, task_id), a page reads its 51 rows from the index. The
order by deadline is an index on `coalesce(next_run_at, 9999-12-31)`, written
on PostgreSQL only (SQLite's queue is a single process's, and small). They cost
a write only when a task enters or leaves `blocked`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_claims",
        sa.Column("task_id", sa.String(64), sa.ForeignKey("tasks.task_id"), primary_key=True),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("taken_from", sa.String(200), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
    )

    blocked = sa.text("status = 'blocked'")
    for name, column in ORDERS.items():
        columns = [*column, "created_at", "task_id"]
        op.create_index(f"ix_tasks_blocked_{name}", "tasks", columns, postgresql_where=blocked, sqlite_where=blocked)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE INDEX ix_tasks_blocked_due ON tasks "
            "(coalesce(next_run_at, '9999-12-31 00:00:00+00'::timestamptz), created_at, task_id) "
            "WHERE status = 'blocked'"
        )


#: The work queue's orders with an index of plain columns, each then by (created_at, task_id).
ORDERS = {"waiting": ["updated_at"], "created": [], "by_workflow": ["workflow"], "by_state": ["state"]}


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_tasks_blocked_due")
    for name in ORDERS:
        op.drop_index(f"ix_tasks_blocked_{name}", table_name="tasks")
    op.drop_table("task_claims")
