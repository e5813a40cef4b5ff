"""The tables, as SQLAlchemy Core metadata. Alembic migrations create them; this module only describes them.

`alembic check` compares this metadata with a migrated database, so the two
cannot drift apart silently.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
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
    # Who started the task (the actor of its first event), for the lists' starter filter (migration 0008).
    Column("started_by", String(200), nullable=False, server_default=""),
    # The tenant the task belongs to (its `start` event's `data.tenant`; NULL: none), migration 0011.
    Column("tenant", String(64), nullable=True),
    # The task's own priority for quota, given at start (NULL: its workflow's, from the settings), migration 0013.
    Column("priority", Integer, nullable=True),
    Index("ix_tasks_workflow_version", "workflow", "version"),
    # The task lists page newest first by (created_at, task_id), filtered or not (migration 0008).
    Index("ix_tasks_created", "created_at", "task_id"),
    Index("ix_tasks_status_created", "status", "created_at", "task_id"),
    Index("ix_tasks_workflow_created", "workflow", "created_at", "task_id"),
    Index("ix_tasks_started_by_created", "started_by", "created_at", "task_id"),
    Index("ix_tasks_tenant_created", "tenant", "created_at", "task_id"),
    # A task id prefix search is `LIKE 'p%'`, which a PostgreSQL btree serves only with pattern ops when the
    # database collation is not C; on SQLite it is a second index on task_id, written once per task.
    Index("ix_tasks_task_id_pattern", "task_id", postgresql_ops={"task_id": "varchar_pattern_ops"}),
    # The approvals inbox's and the work queue's blocked tasks by where they stand, oldest first (migration 0010).
    Index(
        "ix_tasks_blocked",
        "workflow",
        "version",
        "state",
        "created_at",
        "task_id",
        postgresql_where=text("status = 'blocked'"),
        sqlite_where=text("status = 'blocked'"),
    ),
    # The work queue's orders (migration 0014): blocked tasks by when they last moved, by creation, by workflow,
    # by state, each then by (created_at, task_id); the order by deadline is an index on an expression, on
    # PostgreSQL only (`ix_tasks_blocked_due`, which Alembic's comparison leaves aside).
    *(
        Index(
            f"ix_tasks_blocked_{name}",
            *columns,
            "created_at",
            "task_id",
            postgresql_where=text("status = 'blocked'"),
            sqlite_where=text("status = 'blocked'"),
        )
        for name, columns in (
            ("waiting", ["updated_at"]),
            ("created", []),
            ("by_workflow", ["workflow"]),
            ("by_state", ["state"]),
        )
    ),
    # What a claim scans: the unfinished tasks by due time, however many finished ones the table holds.
    Index(
        "ix_tasks_due",
        "next_run_at",
        postgresql_where=text("status <> 'terminal'"),
        sqlite_where=text("status <> 'terminal'"),
    ),
)

#: Indexes a migration writes on PostgreSQL only, on an expression the metadata does not describe: the work queue's
#: order by deadline, `coalesce(next_run_at, '9999-12-31 00:00:00+00'::timestamptz), created_at, task_id` of blocked
#: tasks (migration 0014; `engine.store.postgres.queue_due` writes the same expression). `alembic check` skips them.
POSTGRESQL_ONLY_INDEXES = frozenset({"ix_tasks_blocked_due"})

#: A task's searchable input fields (`Workflow.searchable`), written with the task: what the lists show and search.
task_fields = Table(
    "task_fields",
    metadata,
    Column("task_id", String(64), ForeignKey("tasks.task_id"), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("value", String(200), nullable=False),
    Index("ix_task_fields_value", "value", "task_id"),
)

#: Who is on a work item (migration 0014): one claim per task, `actor`'s until `expires_at` and only while the task
#: stands at `seq` (a decision moves it, and the claim is over). A take-over keeps whom it was `taken_from` and why.
#: A side table, not an event: a claim is no transition, and an event would move the seq that every open decision
#: form and bulk selection of the task was made on.
task_claims = Table(
    "task_claims",
    metadata,
    Column("task_id", String(64), ForeignKey("tasks.task_id"), primary_key=True),
    Column("actor", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("claimed_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("taken_from", String(200), nullable=True),
    Column("reason", Text, nullable=True),
)

#: How many tasks of each workflow have ended (migration 0009), in slots whose sum is the count: kept by triggers on
#: `tasks` (a row becoming, inserted as, leaving or deleted as `terminal`), so that `railyard status` and the task
#: gauges read the live tasks and these few rows, never the finished tasks themselves. PostgreSQL spreads a
#: workflow over 16 slots by a hash of the task id, so that workers ending its tasks at once do not queue on one row.
terminal_counts = Table(
    "terminal_counts",
    metadata,
    Column("workflow", String(64), primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column("tasks", BigInteger, nullable=False),
)

#: How many tasks wait in each place (workflow, version, state) per tenant ('' for none), kept by triggers on
#: `tasks` (migration 0016), so that the work queue's counts read these few rows, never the waiting tasks
#: themselves. PostgreSQL spreads a place over 16 slots by a hash of the task id, as `terminal_counts` does.
blocked_counts = Table(
    "blocked_counts",
    metadata,
    Column("workflow", String(64), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("state", String(64), primary_key=True),
    Column("tenant", String(64), primary_key=True),
    Column("slot", Integer, primary_key=True),
    Column("tasks", BigInteger, nullable=False),
)

#: A page session per login: the cookie holds a random id, this row its SHA-256. Logout deletes the row, so a
#: copied cookie stops working at once; `flash` is the one message the next page shows (then it is cleared).
#: `credential` says what signed in, read again on every request: `token:<sha256>` (a token of the tokens file or
#: of `api_tokens`) or `user:<name>` (a person of `people`), migration 0012 (before it, `token_hash`).
page_sessions = Table(
    "page_sessions",
    metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("credential", String(250), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("flash", Text, nullable=True),
    Index("ix_page_sessions_expires_at", "expires_at"),
)

#: Failed page logins, one row per key a failure counts against (`account:NAME`, `address:IP`), so that every
#: server process over the database applies the same limit; rows older than the window are forgotten.
login_failures = Table(
    "login_failures",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(300), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Index("ix_login_failures_key_at", "key", "at"),
    Index("ix_login_failures_at", "at"),
)

#: The people who sign in to the pages (migration 0012): `name` is the actor the log records, `password_hash` an
#: Argon2 hash (NULL: no password), `roles` a JSON list, `tenants` a JSON list or NULL (not confined), `source`
#: `local` (`railyard users`) or `oidc` (the OpenID Connect sign-in). `revision` counts the row's changes: a
#: write names the one it read, so two changes at once cannot overwrite each other.
people = Table(
    "people",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("password_hash", String(200), nullable=True),
    Column("roles", Text, nullable=False),
    Column("tenants", Text, nullable=True),
    Column("disabled", Boolean, nullable=False, server_default=false()),
    Column("source", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("revision", Integer, nullable=False, server_default="1"),
)

#: API tokens kept in the database (migration 0012), beside the tokens file: the SHA-256 of each (never the token),
#: whom it speaks for, its roles (JSON list), tenants (JSON list or NULL), expiry, and who made and revoked it.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("actor", String(200), nullable=False),
    Column("roles", Text, nullable=False),
    Column("tenants", Text, nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("revoked_by", String(200), nullable=True),
    Index("ix_api_tokens_actor", "actor"),
)

#: Every change of people, their roles, tenants and passwords, and of database tokens (migration 0012): who made
#: it, when, what, of whom, with its details as canonical JSON (never a password or its hash). Append-only: the
#: same triggers as `checkpoints` refuse every UPDATE and DELETE.
access_trail = Table(
    "access_trail",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("by", String(200), nullable=False),
    Column("action", String(32), nullable=False),
    Column("subject", String(200), nullable=False),
    Column("details", Text, nullable=False),
    Index("ix_access_trail_subject", "subject", "id"),
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


#: One circuit breaker per (provider, model), shared by every worker on the database (migration 0013). Times are
#: epoch seconds of the database's clock.
flow_breakers = Table(
    "flow_breakers",
    metadata,
    Column("key", String(300), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("failures", Integer, nullable=False),
    Column("open_until", Float, nullable=False),
    Column("probe_until", Float, nullable=False),
    Column("changed_at", Float, nullable=False),
)

#: One quota bucket per (provider, model[, API key fingerprint]): the levels as of `refilled_at`, the calls in
#: flight, a provider's pause, and the limits last applied (JSON, for `railyard status`).
flow_quotas = Table(
    "flow_quotas",
    metadata,
    Column("key", String(300), primary_key=True),
    Column("requests", Float, nullable=False),
    Column("input_tokens", Float, nullable=False),
    Column("output_tokens", Float, nullable=False),
    Column("in_flight", Integer, nullable=False),
    Column("in_flight_until", Float, nullable=False),
    Column("refilled_at", Float, nullable=False),
    Column("paused_until", Float, nullable=False),
    Column("limits", Text, nullable=False),
)

#: Tasks waiting for quota on a key, with what the queue orders them by (`engine.core.flow.queue`).
flow_waits = Table(
    "flow_waits",
    metadata,
    Column("key", String(300), primary_key=True),
    Column("task_id", String(64), primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("grp", String(200), nullable=False),
    Column("since", Float, nullable=False),
    Column("until", Float, nullable=False),
    Index("ix_flow_waits_task_id", "task_id"),
)

#: How many calls each group (tenant, else workflow) was served from a quota's line lately (migration 0017):
#: the count of window `win` (`engine.core.flow.share_window`) and of the window before, for fair share.
flow_shares = Table(
    "flow_shares",
    metadata,
    Column("key", String(300), primary_key=True),
    Column("grp", String(200), primary_key=True),
    Column("win", BigInteger, nullable=False),
    Column("served", Integer, nullable=False),
    Column("served_before", Integer, nullable=False),
)

#: Webhook subscriptions (migration 0015): a URL, the kinds it wants (JSON list of `engine.core.webhooks`
#: interests as typed), its body format, and its signing secrets (JSON, newest first, each with when it stops).
webhook_subscriptions = Table(
    "webhook_subscriptions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("url", Text, nullable=False),
    Column("kinds", Text, nullable=False),
    Column("format", String(16), nullable=False),
    Column("secrets", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("created_by", String(200), nullable=False),
)

#: The webhook outbox: one row per message, written in the transaction of the event it reports, sent by the
#: workers under a lease (`lease_owner` until `lease_expires_at`) until a 2xx answer or `give up`.
webhook_outbox = Table(
    "webhook_outbox",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("subscription_id", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("task_id", String(64), nullable=True),
    Column("body", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("since", DateTime(timezone=True), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("delivered_at", DateTime(timezone=True), nullable=True),
    Index("ix_webhook_outbox_status_next_attempt_at", "status", "next_attempt_at"),
    Index("ix_webhook_outbox_subscription_id_created_at", "subscription_id", "created_at"),
)
