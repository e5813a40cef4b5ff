"""how many tasks wait in each place (workflow, version, state, tenant), kept by the database for the work queue

Every work queue page (`/inbox`, `GET /api/work`) shows how many tasks wait on
the person, per kind and workflow. It counted them with a `GROUP BY` over the
partial index of blocked tasks (ix_tasks_blocked): an index-only scan whose
cost grows with the tasks waiting, 62-130 ms at 100,000 on PostgreSQL, nearly
all of the page's time (bench/backoffice.py, docs/performance.md). The counts
are kept here instead, as `terminal_counts` keeps the ended tasks (migration
0009), by triggers on `tasks`: a row that becomes blocked adds one to its
place, one that leaves `blocked` (or moves between places while blocked) takes
one away, a deleted blocked row takes one away, and rows inserted already
blocked (a task whose first state waits on a person, a bulk load) are counted
once per statement on PostgreSQL. The row triggers fire only on those changes
(their WHEN clauses): an append that leaves a task runnable, a claim, a
heartbeat or a release runs no trigger function.

A place's count is spread over 16 slots on PostgreSQL (by a hash of the task
id), as the ended tasks' are, so that approvals decided at once do not queue on
one row; a reader sums the slots. SQLite has one writer at a time: one slot.
`tenant` is '' for a task of no tenant (a key column cannot be NULL).

A search (a field value, an id prefix) or an age filter still counts the tasks
it selects with the `GROUP BY`: those narrow the tasks first.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Slots per place on PostgreSQL, a power of two: the slot is `hashtext(task_id) & (PG_SLOTS - 1)`.
PG_SLOTS = 16
KEY = "workflow, version, state, tenant, slot"


def _pg_add(row: str, n: int) -> str:
    return (
        f"INSERT INTO blocked_counts AS c ({KEY}, tasks) VALUES ({row}.workflow, {row}.version, {row}.state,"
        f" coalesce({row}.tenant, ''), hashtext({row}.task_id) & {PG_SLOTS - 1}, {n})"
        f" ON CONFLICT ({KEY}) DO UPDATE SET tasks = c.tasks + ({n});"
    )


PG_FUNCTION = f"""
CREATE FUNCTION railyard_count_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status = 'blocked' THEN
        {_pg_add("OLD", -1)}
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status = 'blocked' THEN
        {_pg_add("NEW", 1)}
    END IF;
    RETURN NULL;
END
$$
"""
#: Rows inserted already blocked, counted once per statement (a bulk load would update the same counter rows once
#: per row in one transaction otherwise: see migration 0009).
PG_INSERTED_FUNCTION = f"""
CREATE FUNCTION railyard_count_inserted_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO blocked_counts AS c ({KEY}, tasks)
    SELECT workflow, version, state, coalesce(tenant, ''), hashtext(task_id) & {PG_SLOTS - 1}, count(*)
    FROM inserted WHERE status = 'blocked' GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT ({KEY}) DO UPDATE SET tasks = c.tasks + EXCLUDED.tasks;
    RETURN NULL;
END
$$
"""

#: A change that moves a row into or out of a place's count, or from one place to another while blocked.
MOVED = (
    "(OLD.status <> NEW.status OR OLD.state <> NEW.state OR OLD.workflow <> NEW.workflow"
    " OR OLD.version <> NEW.version OR OLD.tenant {distinct} NEW.tenant)"
)
PG_CHANGED = f"(OLD.status = 'blocked' OR NEW.status = 'blocked') AND {MOVED.format(distinct='IS DISTINCT FROM')}"
SQLITE_CHANGED = f"(OLD.status = 'blocked' OR NEW.status = 'blocked') AND {MOVED.format(distinct='IS NOT')}"
COLUMNS = "status, state, workflow, version, tenant"

PG_TRIGGERS = [
    "CREATE TRIGGER tasks_count_blocked_insert AFTER INSERT ON tasks REFERENCING NEW TABLE AS inserted"
    " FOR EACH STATEMENT EXECUTE FUNCTION railyard_count_inserted_blocked()",
    f"CREATE TRIGGER tasks_count_blocked_update AFTER UPDATE OF {COLUMNS} ON tasks FOR EACH ROW"
    f" WHEN ({PG_CHANGED}) EXECUTE FUNCTION railyard_count_blocked()",
    "CREATE TRIGGER tasks_count_blocked_delete AFTER DELETE ON tasks FOR EACH ROW"
    " WHEN (OLD.status = 'blocked') EXECUTE FUNCTION railyard_count_blocked()",
]
PG_BACKFILL = (
    f"INSERT INTO blocked_counts ({KEY}, tasks) SELECT workflow, version, state, coalesce(tenant, ''),"
    f" hashtext(task_id) & {PG_SLOTS - 1}, count(*) FROM tasks WHERE status = 'blocked' GROUP BY 1, 2, 3, 4, 5"
)


def _sqlite_count(row: str, n: int, only_if: str) -> str:
    """The statements of a SQLite trigger's body that add `n` to the count of `row`'s place when `only_if`."""
    place = f"{row}.workflow, {row}.version, {row}.state, coalesce({row}.tenant, '')"
    return (
        f" INSERT OR IGNORE INTO blocked_counts ({KEY}, tasks) SELECT {place}, 0, 0 WHERE {only_if};"
        f" UPDATE blocked_counts SET tasks = tasks + ({n}) WHERE workflow = {row}.workflow"
        f" AND version = {row}.version AND state = {row}.state AND tenant = coalesce({row}.tenant, '')"
        f" AND slot = 0 AND {only_if};"
    )


OLD_BLOCKED = "OLD.status = 'blocked'"
NEW_BLOCKED = "NEW.status = 'blocked'"
SQLITE_TRIGGERS = [
    f"CREATE TRIGGER tasks_count_blocked_insert AFTER INSERT ON tasks WHEN {NEW_BLOCKED} BEGIN"
    f"{_sqlite_count('NEW', 1, 'true')} END",
    f"CREATE TRIGGER tasks_count_blocked_update AFTER UPDATE OF {COLUMNS} ON tasks WHEN {SQLITE_CHANGED} BEGIN"
    f"{_sqlite_count('OLD', -1, OLD_BLOCKED)}{_sqlite_count('NEW', 1, NEW_BLOCKED)} END",
    f"CREATE TRIGGER tasks_count_blocked_delete AFTER DELETE ON tasks WHEN {OLD_BLOCKED} BEGIN"
    f"{_sqlite_count('OLD', -1, 'true')} END",
]
SQLITE_BACKFILL = (
    f"INSERT INTO blocked_counts ({KEY}, tasks) SELECT workflow, version, state, coalesce(tenant, ''), 0, count(*)"
    " FROM tasks WHERE status = 'blocked' GROUP BY 1, 2, 3, 4"
)
TRIGGERS = ("tasks_count_blocked_insert", "tasks_count_blocked_update", "tasks_count_blocked_delete")


def upgrade() -> None:
    op.create_table(
        "blocked_counts",
        sa.Column("workflow", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("state", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("slot", sa.Integer, primary_key=True),
        sa.Column("tasks", sa.BigInteger, nullable=False),
    )
    if op.get_context().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
        op.execute(PG_INSERTED_FUNCTION)
        for statement in PG_TRIGGERS:
            op.execute(statement)
        op.execute(PG_BACKFILL)
        return
    for statement in SQLITE_TRIGGERS:
        op.execute(statement)
    op.execute(SQLITE_BACKFILL)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name} ON tasks")
        op.execute("DROP FUNCTION IF EXISTS railyard_count_blocked()")
        op.execute("DROP FUNCTION IF EXISTS railyard_count_inserted_blocked()")
    else:
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("blocked_counts")
