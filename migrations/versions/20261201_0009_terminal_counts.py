"""how many tasks of each workflow have ended, kept by the database, so `railyard status` need not count them

`railyard status` and the metrics' task gauges counted every task with one
`GROUP BY` over the whole `tasks` table: at 1,000,000 tasks of which 990,000
had ended that took 66-76 times as long as at 10,000 (209-297 ms in two runs
of bench/scale.py; with this revision 5.4 ms, against 7.0 at 10,000).
The live tasks are read through the partial index of unfinished ones
(ix_tasks_due) as before; the ended ones are counted here instead, per
workflow, by triggers on `tasks`: one that adds one when a row becomes
terminal and takes one away when a terminal row leaves that status (or its
workflow), one for deleted terminal rows, and one for rows inserted already
terminal (a bulk load or a restore; the engine creates none). The last is a
statement trigger on PostgreSQL: counted per row, a COPY of 990,000 ended
tasks updated the same counter rows once per row in one transaction, and each
update walked the versions the earlier ones left (an INSERT of 1,000,000 rows
ran for minutes; the counter table bloated, and status with it).

On PostgreSQL each workflow's count is spread over 16 slots (by a hash of the
task id), so that workers ending tasks of the same workflow at once do not wait
for each other's commit on one row: 8 threads ending tasks of one workflow
made 1,200-1,700 appends/s with one slot, 2,900-3,200 with 16 (and 2,500
without the trigger, the same within the noise). A reader sums the slots. The
row triggers fire only on those changes (their WHEN clauses): an append that
leaves the status as it was, a claim, a heartbeat or a release runs no trigger
function, and a create or an ending append took no measurably longer (about 2
and 0.85 ms with and without). SQLite has one writer at a time, so one slot.

The counts of the tasks already there are taken in the same transaction that
creates the triggers, which holds off writers until it commits.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Slots per workflow on PostgreSQL, a power of two: the slot is `hashtext(task_id) & (PG_SLOTS - 1)`.
PG_SLOTS = 16

PG_FUNCTION = f"""
CREATE FUNCTION railyard_count_terminal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status = 'terminal' THEN
        INSERT INTO terminal_counts AS c (workflow, slot, tasks)
        VALUES (OLD.workflow, hashtext(OLD.task_id) & {PG_SLOTS - 1}, -1)
        ON CONFLICT (workflow, slot) DO UPDATE SET tasks = c.tasks - 1;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status = 'terminal' THEN
        INSERT INTO terminal_counts AS c (workflow, slot, tasks)
        VALUES (NEW.workflow, hashtext(NEW.task_id) & {PG_SLOTS - 1}, 1)
        ON CONFLICT (workflow, slot) DO UPDATE SET tasks = c.tasks + 1;
    END IF;
    RETURN NULL;
END
$$
"""
#: Rows inserted already terminal (a bulk load, a restore: the engine creates none) are counted once per statement:
#: a row trigger would update the same counter rows once per row in one transaction, and each update walks the
#: chain of versions the earlier ones left, which made an INSERT of 1,000,000 such rows run for minutes.
PG_INSERTED_FUNCTION = f"""
CREATE FUNCTION railyard_count_inserted_terminal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO terminal_counts AS c (workflow, slot, tasks)
    SELECT workflow, hashtext(task_id) & {PG_SLOTS - 1}, count(*) FROM inserted WHERE status = 'terminal' GROUP BY 1, 2
    ON CONFLICT (workflow, slot) DO UPDATE SET tasks = c.tasks + EXCLUDED.tasks;
    RETURN NULL;
END
$$
"""

#: A change that moves a row into or out of the terminal count (or a terminal row to another workflow).
CHANGED = (
    "(OLD.status = 'terminal' OR NEW.status = 'terminal')"
    " AND (OLD.status <> NEW.status OR OLD.workflow <> NEW.workflow)"
)

PG_TRIGGERS = [
    "CREATE TRIGGER tasks_count_terminal_insert AFTER INSERT ON tasks REFERENCING NEW TABLE AS inserted"
    " FOR EACH STATEMENT EXECUTE FUNCTION railyard_count_inserted_terminal()",
    "CREATE TRIGGER tasks_count_terminal_update AFTER UPDATE OF status, workflow ON tasks FOR EACH ROW"
    f" WHEN ({CHANGED}) EXECUTE FUNCTION railyard_count_terminal()",
    "CREATE TRIGGER tasks_count_terminal_delete AFTER DELETE ON tasks FOR EACH ROW"
    " WHEN (OLD.status = 'terminal') EXECUTE FUNCTION railyard_count_terminal()",
]
PG_BACKFILL = (
    f"INSERT INTO terminal_counts (workflow, slot, tasks) SELECT workflow, hashtext(task_id) & {PG_SLOTS - 1},"
    " count(*) FROM tasks WHERE status = 'terminal' GROUP BY 1, 2"
)


def _sqlite_count(row: str, n: int, only_if: str) -> str:
    """The statements of a SQLite trigger's body that add `n` to the count of `row`'s workflow when `only_if`."""
    return (
        f" INSERT OR IGNORE INTO terminal_counts (workflow, slot, tasks) SELECT {row}.workflow, 0, 0 WHERE {only_if};"
        f" UPDATE terminal_counts SET tasks = tasks + ({n}) WHERE workflow = {row}.workflow AND slot = 0"
        f" AND {only_if};"
    )


OLD_ENDED = "OLD.status = 'terminal'"
NEW_ENDED = "NEW.status = 'terminal'"
SQLITE_TRIGGERS = [
    f"CREATE TRIGGER tasks_count_terminal_insert AFTER INSERT ON tasks WHEN {NEW_ENDED} BEGIN"
    f"{_sqlite_count('NEW', 1, 'true')} END",
    f"CREATE TRIGGER tasks_count_terminal_update AFTER UPDATE OF status, workflow ON tasks WHEN {CHANGED} BEGIN"
    f"{_sqlite_count('OLD', -1, OLD_ENDED)}{_sqlite_count('NEW', 1, NEW_ENDED)} END",
    f"CREATE TRIGGER tasks_count_terminal_delete AFTER DELETE ON tasks WHEN {OLD_ENDED} BEGIN"
    f"{_sqlite_count('OLD', -1, 'true')} END",
]
SQLITE_BACKFILL = (
    "INSERT INTO terminal_counts (workflow, slot, tasks) SELECT workflow, 0, count(*) FROM tasks"
    " WHERE status = 'terminal' GROUP BY workflow"
)
TRIGGERS = ("tasks_count_terminal_insert", "tasks_count_terminal_update", "tasks_count_terminal_delete")


def upgrade() -> None:
    op.create_table(
        "terminal_counts",
        sa.Column("workflow", sa.String(64), primary_key=True),
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
        op.execute("DROP FUNCTION IF EXISTS railyard_count_terminal()")
        op.execute("DROP FUNCTION IF EXISTS railyard_count_inserted_terminal()")
    else:
        for name in TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("terminal_counts")
