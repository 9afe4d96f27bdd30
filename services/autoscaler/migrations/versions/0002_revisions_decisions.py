"""autoscaler schema: spec revisions, desired replicas, scaling decisions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "autoscaler"


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("desired", postgresql.JSONB(), nullable=False, server_default="{}"),
        schema=SCHEMA,
    )
    op.create_table(
        "deployment_revisions",
        sa.Column(
            "name",
            sa.Text(),
            sa.ForeignKey(f"{SCHEMA}.deployments.name", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("generation", sa.BigInteger(), primary_key=True),
        sa.Column("spec", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_table(
        "decisions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("decision_id", sa.Text(), nullable=False, unique=True),
        sa.Column("deployment", sa.Text(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("ts_ms", sa.BigInteger(), nullable=False),
        sa.Column("changes", postgresql.JSONB(), nullable=False),
        sa.Column("victims", postgresql.JSONB(), nullable=False),
        sa.Column("reasons", postgresql.JSONB(), nullable=False),
        sa.Column("binding_constraint", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("inputs", postgresql.JSONB(), nullable=False),
        sa.Column("forecast", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_decisions_deployment_ts", "decisions", ["deployment", "ts_ms"], schema=SCHEMA
    )


def downgrade() -> None:
    op.drop_index("ix_decisions_deployment_ts", table_name="decisions", schema=SCHEMA)
    op.drop_table("decisions", schema=SCHEMA)
    op.drop_table("deployment_revisions", schema=SCHEMA)
    op.drop_column("deployments", "desired", schema=SCHEMA)
