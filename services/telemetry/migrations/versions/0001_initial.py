"""telemetry schema: request_records.

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

SCHEMA = "telemetry"


def upgrade() -> None:
    op.create_table(
        "request_records",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("deployment", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("slo_class", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Integer(), nullable=False),
        sa.Column("arrival_ms", sa.BigInteger(), nullable=False),
        sa.Column("finish_ms", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("queue_ms", sa.Double(), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=False),
        sa.Column("tpot_ms", sa.Double(), nullable=False),
        sa.Column("e2e_ms", sa.Double(), nullable=False),
        sa.Column("record", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.UniqueConstraint("request_id", name="uq_request_records_request_id"),
        schema=SCHEMA,
    )
    op.create_index(
        "ix_request_records_deployment_finish",
        "request_records",
        ["deployment", "finish_ms"],
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_index(
        "ix_request_records_deployment_finish", table_name="request_records", schema=SCHEMA
    )
    op.drop_table("request_records", schema=SCHEMA)
