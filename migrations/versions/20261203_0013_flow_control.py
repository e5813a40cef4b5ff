"""flow control shared by every worker: circuit breakers, quota buckets, the quota queue, a task's priority

`flow_breakers` holds one circuit breaker per (provider, model): closed, open
until a time, or half open while one probe call is out. `flow_quotas` holds a
token bucket per (provider, model[, API key fingerprint]): what is left of the
requests, input and output tokens as of `refilled_at`, the calls in flight, and
a pause a provider's 429 asked for. `flow_waits` is who waits for quota, with
the priority and group (tenant, else workflow) the queue orders them by. Times
in these tables are epoch seconds of the database's clock (a double), so that
a bucket refills in one statement on either database.

`tasks.priority` is a task's own priority, given at start (NULL: its
workflow's, from the settings).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "flow_breakers",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("open_until", sa.Float, nullable=False),
        sa.Column("probe_until", sa.Float, nullable=False),
        sa.Column("changed_at", sa.Float, nullable=False),
    )
    op.create_table(
        "flow_quotas",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("requests", sa.Float, nullable=False),
        sa.Column("input_tokens", sa.Float, nullable=False),
        sa.Column("output_tokens", sa.Float, nullable=False),
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("in_flight_until", sa.Float, nullable=False),
        sa.Column("refilled_at", sa.Float, nullable=False),
        sa.Column("paused_until", sa.Float, nullable=False),
        sa.Column("limits", sa.Text, nullable=False),
    )
    op.create_table(
        "flow_waits",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("task_id", sa.String(64), primary_key=True),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("grp", sa.String(200), nullable=False),
        sa.Column("since", sa.Float, nullable=False),
        sa.Column("until", sa.Float, nullable=False),
    )
    op.create_index("ix_flow_waits_task_id", "flow_waits", ["task_id"])
    op.add_column("tasks", sa.Column("priority", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("priority")
    op.drop_index("ix_flow_waits_task_id", table_name="flow_waits")
    op.drop_table("flow_waits")
    op.drop_table("flow_quotas")
    op.drop_table("flow_breakers")
