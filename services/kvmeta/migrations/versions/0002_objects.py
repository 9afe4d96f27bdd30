"""kvmeta object master: segments and objects (replicas as JSON, leases stay in memory).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "kvmeta"


def upgrade() -> None:
    op.create_table(
        "segments",
        sa.Column("deployment", sa.Text(), primary_key=True),
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("instance_id", sa.Text(), nullable=False),
        sa.Column("tier", sa.SmallInteger(), nullable=False),
        sa.Column("capacity_bytes", sa.BigInteger(), nullable=False),
        sa.Column("transfer_address", sa.Text(), nullable=False),
        sa.Column("base_address", sa.Numeric(20, 0), nullable=False),
        sa.CheckConstraint("capacity_bytes > 0", name="ck_segments_capacity_positive"),
        schema=SCHEMA,
    )
    op.create_table(
        "objects",
        sa.Column("deployment", sa.Text(), primary_key=True),
        sa.Column("tenant", sa.Text(), primary_key=True),
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        # [[segment, offset], ...]
        sa.Column("replicas", postgresql.JSONB(), nullable=False),
        sa.Column("soft_pin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("hard_pin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("status IN ('processing', 'complete')", name="ck_objects_status"),
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_table("objects", schema=SCHEMA)
    op.drop_table("segments", schema=SCHEMA)
