"""people and API tokens in the database, the access trail, and page sessions that name what signed in

`people` holds the people who sign in to the pages (`railyard users`, and the
OpenID Connect sign-in): their roles, tenants, an Argon2 password hash,
whether they are disabled. `api_tokens` holds API tokens beside the tokens
file (their SHA-256 only). `access_trail` records every change of either, in
the same transaction as the change; like `checkpoints` it is append-only, and
the database refuses every UPDATE and DELETE of it (the triggers of migration
0007, the same function on PostgreSQL).

`page_sessions.token_hash` becomes `credential`, which names what opened the
session and is read again on every request: `token:<sha256>` or `user:<name>`.
Existing sessions keep working: each becomes `token:` and its hash. Going back
down, sessions opened by a person have no token to name: they are deleted
(those people sign in again).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REFUSAL = "railyard: access_trail is append-only"


def _sessions(*middle: sa.Column[str]) -> sa.Table:
    """`page_sessions` as it stands while its credential column changes: SQLite rebuilds the table from this (a
    batch), and `railyard db upgrade --sql` has no database to read it from."""
    return sa.Table(
        "page_sessions",
        sa.MetaData(),
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("flash", sa.Text, nullable=True),
        *middle,
        sa.Index("ix_page_sessions_expires_at", "expires_at"),
    )


def upgrade() -> None:
    op.create_table(
        "people",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("password_hash", sa.String(200), nullable=True),
        sa.Column("roles", sa.Text, nullable=False),
        sa.Column("tenants", sa.Text, nullable=True),
        sa.Column("disabled", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer, nullable=False, server_default="1"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("roles", sa.Text, nullable=False),
        sa.Column("tenants", sa.Text, nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(200), nullable=True),
    )
    op.create_index("ix_api_tokens_actor", "api_tokens", ["actor"])
    op.create_table(
        "access_trail",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("by", sa.String(200), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("details", sa.Text, nullable=False),
    )
    op.create_index("ix_access_trail_subject", "access_trail", ["subject", "id"])
    if op.get_context().dialect.name == "postgresql":
        # railyard_append_only() (migration 0007) refuses whatever it fires on, but a permitted DELETE of events.
        op.execute(
            "CREATE TRIGGER access_trail_append_only BEFORE UPDATE OR DELETE ON access_trail "
            "FOR EACH ROW EXECUTE FUNCTION railyard_append_only()"
        )
        op.execute(
            "CREATE TRIGGER access_trail_no_truncate BEFORE TRUNCATE ON access_trail "
            "FOR EACH STATEMENT EXECUTE FUNCTION railyard_append_only()"
        )
    else:
        for verb in ("update", "delete"):
            op.execute(
                f"CREATE TRIGGER access_trail_no_{verb} BEFORE {verb.upper()} ON access_trail "
                f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
            )

    op.add_column("page_sessions", sa.Column("credential", sa.String(250), nullable=True))
    op.execute("UPDATE page_sessions SET credential = 'token:' || token_hash")
    both = _sessions(
        sa.Column("token_hash", sa.String(64), nullable=False), sa.Column("credential", sa.String(250), nullable=True)
    )
    with op.batch_alter_table("page_sessions", copy_from=both) as batch:
        batch.alter_column("credential", existing_type=sa.String(250), nullable=False)
        batch.drop_column("token_hash")


def downgrade() -> None:
    op.execute("DELETE FROM page_sessions WHERE credential NOT LIKE 'token:%'")
    op.add_column("page_sessions", sa.Column("token_hash", sa.String(64), nullable=True))
    op.execute("UPDATE page_sessions SET token_hash = substr(credential, 7)")
    both = _sessions(
        sa.Column("credential", sa.String(250), nullable=False), sa.Column("token_hash", sa.String(64), nullable=True)
    )
    with op.batch_alter_table("page_sessions", copy_from=both) as batch:
        batch.alter_column("token_hash", existing_type=sa.String(64), nullable=False)
        batch.drop_column("credential")

    if op.get_context().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS access_trail_no_truncate ON access_trail")
        op.execute("DROP TRIGGER IF EXISTS access_trail_append_only ON access_trail")
    else:
        op.execute("DROP TRIGGER IF EXISTS access_trail_no_update")
        op.execute("DROP TRIGGER IF EXISTS access_trail_no_delete")
    op.drop_index("ix_access_trail_subject", table_name="access_trail")
    op.drop_table("access_trail")
    op.drop_index("ix_api_tokens_actor", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("people")
