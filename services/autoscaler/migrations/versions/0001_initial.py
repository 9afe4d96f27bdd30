"""autoscaler schema: deployments and instances.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "autoscaler"


def _timestamps() -> list[sa.Column[object]]:
    return [
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        *_timestamps(),
        schema=SCHEMA,
    )
    op.create_table(
        "instances",
        sa.Column("instance_id", sa.Text(), primary_key=True),
        sa.Column(
            "deployment",
            sa.Text(),
            sa.ForeignKey(f"{SCHEMA}.deployments.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("info", sa.LargeBinary(), nullable=False),
        *_timestamps(),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_instances_deployment_role", "instances", ["deployment", "role"], schema=SCHEMA
    )


def downgrade() -> None:
    op.drop_index("ix_instances_deployment_role", table_name="instances", schema=SCHEMA)
    op.drop_table("instances", schema=SCHEMA)
    op.drop_table("deployments", schema=SCHEMA)
