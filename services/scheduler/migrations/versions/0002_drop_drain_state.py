"""scheduler schema: drop drain_state (never written).

Drain is per scheduler replica and in memory: the gRPC ``Drain``/``Undrain`` of one replica
and the ``DRAINING`` membership events every replica follows on ``{prefix}:membership``
(the autoscaler's drain before removal). Nothing ever read or wrote this table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "scheduler"


def upgrade() -> None:
    op.drop_table("drain_state", schema=SCHEMA)


def downgrade() -> None:
    op.create_table(
        "drain_state",
        sa.Column("instance_id", sa.Text(), primary_key=True),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
