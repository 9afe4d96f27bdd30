"""kvmeta agent sessions: one row per (deployment, tenant, session id); the session's fields
as JSON beside the columns a query filters on.

Revision ID: 0003
Revises: 0002
Create Date: 2027-01-20
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "kvmeta"


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("deployment", sa.Text(), primary_key=True),
        sa.Column("tenant", sa.Text(), primary_key=True),
        sa.Column("session_id", sa.Text(), primary_key=True),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("home_instance", sa.Text(), nullable=False),
        sa.Column("body", postgresql.JSONB(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("phase IN ('active', 'idle', 'ended')", name="ck_sessions_phase"),
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("sessions", schema=SCHEMA)
