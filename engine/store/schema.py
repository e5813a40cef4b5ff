"""The tables, as SQLAlchemy Core metadata. Alembic migrations create them; this module only describes them.

`alembic check` compares this metadata with a migrated database, so the two
cannot drift apart silently.
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: One row per task: the head of its log (state, seq, last hash), kept in step by `append`.
tasks = Table(
    "tasks",
    metadata,
    Column("task_id", String(64), primary_key=True),
    Column("workflow", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("state", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("last_hash", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # When a worker should next look at the task (runnable: now; blocked with a deadline: the deadline).
    Column("next_run_at", DateTime(timezone=True), nullable=True),
    # The worker holding the task, until when, and the fencing token its appends must carry.
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("lease_epoch", Integer, nullable=False, server_default="0"),
    # Consecutive steps that raised; a worker gives the task up after its limit.
    Column("failures", Integer, nullable=False, server_default="0"),
    # A tombstone: the task ended, and its events moved to this verified archive file (its sha256 kept here).
    Column("archived_at", DateTime(timezone=True), nullable=True),
    Column("archive_file", String(300), nullable=True),
    Column("archive_sha256", String(64), nullable=True),
    Index("ix_tasks_status", "status"),
    Index("ix_tasks_workflow_version", "workflow", "version"),
    # What a claim scans: the unfinished tasks by due time, however many finished ones the table holds.
    Index(
        "ix_tasks_due",
        "next_run_at",
        postgresql_where=text("status <> 'terminal'"),
        sqlite_where=text("status <> 'terminal'"),
    ),
)

#: The append-only log. `data` is the canonical JSON text that was hashed, byte for byte.
events = Table(
    "events",
    metadata,
    Column("task_id", String(64), ForeignKey("tasks.task_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("from_state", String(64), nullable=True),
    Column("trigger", String(64), nullable=False),
    Column("to_state", String(64), nullable=False),
    Column("data", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
)

#: A cache of the folded state every N events: loading starts from it, replay checks it.
snapshots = Table(
    "snapshots",
    metadata,
    Column("task_id", String(64), ForeignKey("tasks.task_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("hash", String(64), nullable=False),
    Column("doc", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

#: Each worker process's last report: who it is, when it was last seen and what it has done so far
#: (claimed, transitions, conflicts, lease losses, failures). `railyard status` lists the live ones.
workers = Table(
    "workers",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("host", String(200), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("seen_at", DateTime(timezone=True), nullable=False),
    Column("stopped_at", DateTime(timezone=True), nullable=True),
    Column("counts", Text, nullable=False),
)

#: The signed checkpoints taken of this database (migration 0007), for convenience: the files in
#: RAILYARD_CHECKPOINT_DIR are the evidence, these rows only say which was last. Append-only, like events.
checkpoints = Table(
    "checkpoints",
    metadata,
    Column("file", String(300), primary_key=True),
    Column("root", String(64), nullable=False),
    Column("tree_size", Integer, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("previous_root", String(64), nullable=True),
    Column("key_id", String(16), nullable=False),
)

#: A row here, inside the archiving transaction only, is how `railyard archive` declares itself to migration
#: 0007's triggers (which refuse every other UPDATE and DELETE on events and checkpoints). Whoever may insert here
#: may declare it too: docs/operations.md says how to grant this table to the archiving role alone.
archive_permits = Table(
    "archive_permits",
    metadata,
    Column("holder", String(64), primary_key=True),
)
