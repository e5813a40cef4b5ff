"""how many calls each group was served from a quota's line lately, for fair share

Calls waiting for quota were served with the groups (tenants, else workflows)
taking turns. A tenant that arrives beside another's long batch then got half
of the quota, so its 100 tasks took twice as long as alone and more (alone,
they also had the bucket's burst): bench/quota.py's fair-share target (within
2x of alone) was not met. The line now orders the groups by what each was
served over the last minute (`engine.core.flow.queue`): the newcomer goes
first until it has been served as much as the batch, then they take turns.

`flow_shares` keeps, per (quota key, group), the count of calls served from
the line in window `win` (the database clock's minute) and in the window
before: a sliding-window counter, one upsert per call served
(`Store.wait_leave`). A group's row is as small as its name; there is one per
group and quota, however many tasks.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "flow_shares",
        sa.Column("key", sa.String(300), primary_key=True),
        sa.Column("grp", sa.String(200), primary_key=True),
        sa.Column("win", sa.BigInteger, nullable=False),
        sa.Column("served", sa.Integer, nullable=False),
        sa.Column("served_before", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("flow_shares")
