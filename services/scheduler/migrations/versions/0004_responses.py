"""scheduler schema: responses (stored responses of the Responses API).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "scheduler"


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.Text(), primary_key=True),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("previous_response_id", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input_items", postgresql.JSONB(), nullable=False),
        sa.Column("output_items", postgresql.JSONB(), nullable=False),
        sa.Column("response", postgresql.JSONB(), nullable=False),
        schema=SCHEMA,
    )
    op.create_index("ix_scheduler_responses_expires_at", "responses", ["expires_at"], schema=SCHEMA)


def downgrade() -> None:
    op.drop_index("ix_scheduler_responses_expires_at", "responses", schema=SCHEMA)
    op.drop_table("responses", schema=SCHEMA)
