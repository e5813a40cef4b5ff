"""page sessions and failed logins in the database; what the task lists filter, search and page by

`page_sessions` holds one row per login (the SHA-256 of the cookie's random
id), so that logout ends a session for every copy of its cookie;
`login_failures` the failed logins of the last window, so that every server
process applies the same login limits. `tasks` gets
`started_by` (filled from each task's first event) and the indexes the lists
page through newest first, by (created_at, task_id), with or without a filter
on status, workflow or starter; `task_fields` holds each task's searchable
input fields (`Workflow.searchable`). Tasks started before this revision have
no rows there: they are found by id, workflow, state, status, starter and time,
not by those fields.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "page_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("flash", sa.Text, nullable=True),
    )
    op.create_index("ix_page_sessions_expires_at", "page_sessions", ["expires_at"])
    op.create_table(
        "login_failures",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_login_failures_key_at", "login_failures", ["key", "at"])
    op.create_index("ix_login_failures_at", "login_failures", ["at"])
    op.create_table(
        "task_fields",
        sa.Column("task_id", sa.String(64), sa.ForeignKey("tasks.task_id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(200), nullable=False),
    )
    op.create_index("ix_task_fields_value", "task_fields", ["value", "task_id"])
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("started_by", sa.String(200), nullable=False, server_default=""))
    op.execute(
        "UPDATE tasks SET started_by = COALESCE("
        "(SELECT actor FROM events WHERE events.task_id = tasks.task_id AND events.seq = 1), '')"
    )
    op.create_index("ix_tasks_created", "tasks", ["created_at", "task_id"])
    op.create_index("ix_tasks_status_created", "tasks", ["status", "created_at", "task_id"])
    op.create_index("ix_tasks_workflow_created", "tasks", ["workflow", "created_at", "task_id"])
    op.create_index("ix_tasks_started_by_created", "tasks", ["started_by", "created_at", "task_id"])
    op.create_index("ix_tasks_task_id_pattern", "tasks", ["task_id"], postgresql_ops={"task_id": "varchar_pattern_ops"})
    # Every query by status alone is served by the first column of ix_tasks_status_created.
    op.drop_index("ix_tasks_status", table_name="tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_status", "tasks", ["status"])
    for name in (
        "ix_tasks_task_id_pattern",
        "ix_tasks_started_by_created",
        "ix_tasks_workflow_created",
        "ix_tasks_status_created",
        "ix_tasks_created",
    ):
        op.drop_index(name, table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("started_by")
    op.drop_index("ix_task_fields_value", table_name="task_fields")
    op.drop_table("task_fields")
    op.drop_index("ix_login_failures_at", table_name="login_failures")
    op.drop_index("ix_login_failures_key_at", table_name="login_failures")
    op.drop_table("login_failures")
    op.drop_index("ix_page_sessions_expires_at", table_name="page_sessions")
    op.drop_table("page_sessions")
