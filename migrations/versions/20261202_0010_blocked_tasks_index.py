"""a partial index of blocked tasks by where they stand, oldest first, for the approvals inbox and the work queue

The inbox (`GET /api/approvals`, `Engine.approvals_page`) and the work queue ask
for the blocked tasks standing in given states (workflow, version, state),
oldest first, a page at a time (`Store.blocked_in`). PostgreSQL cannot tell
that a task's state names its status (a task at an approval state is blocked),
so it multiplies the two selectivities: at 1,000,000 tasks of which 1,000 were
blocked, all at one approval state, it estimated one or two matching rows
where there were 1,000, and then read all 10,000 unfinished tasks through
`ix_tasks_due` and sorted them (484 buffers, 2.3-2.9 ms; the inbox's page
1.52x its time at 10,000 tasks in bench/scale.py), whichever sample `ANALYZE`
drew, in eight of eight tries. With this index the same query is an index-only
scan that stops at the page's 51st row (3 buffers, 0.04 ms, eight of eight);
several states are one bitmap scan of the index per state, reading only the
tasks standing there. It costs a write only when a task enters or leaves
`blocked`, or moves between blocked states. The query names the status as a
literal so that a generic plan of a prepared statement can use it too.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    blocked = sa.text("status = 'blocked'")
    columns = ["workflow", "version", "state", "created_at", "task_id"]
    op.create_index("ix_tasks_blocked", "tasks", columns, postgresql_where=blocked, sqlite_where=blocked)


def downgrade() -> None:
    op.drop_index("ix_tasks_blocked", table_name="tasks")
