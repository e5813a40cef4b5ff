"""webhooks: subscriptions, and an outbox written in the transaction of the event each message reports

Operators subscribe a URL to kinds of events (issue #32). A message is written
to `webhook_outbox` in the same transaction as the event it reports, so an
event is never written without its messages nor a message without its event;
the workers send them under a lease, like a task claim, until the receiver
answers 2xx or the delivery window is spent (then `failed`, replayable).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("kinds", sa.Text, nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("secrets", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
    )
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("subscription_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("task_id", sa.String(64), nullable=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_webhook_outbox_status_next_attempt_at", "webhook_outbox", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_outbox_subscription_id_created_at", "webhook_outbox", ["subscription_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_outbox_subscription_id_created_at", table_name="webhook_outbox")
    op.drop_index("ix_webhook_outbox_status_next_attempt_at", table_name="webhook_outbox")
    op.drop_table("webhook_outbox")
    op.drop_table("webhook_subscriptions")
