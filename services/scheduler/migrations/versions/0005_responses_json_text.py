"""scheduler schema: stored responses' JSON held as text.

JSONB refuses two things any JSON string may hold: NUL (``\\u0000``, e.g. a tool that printed
a binary file) and a lone surrogate escape. The columns now hold the JSON text the gateway
wrote (ASCII, every such character escaped), so every accepted request can be stored.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "scheduler"
COLUMNS = ("input_items", "output_items", "response")


def upgrade() -> None:
    for col in COLUMNS:
        op.alter_column(
            "responses", col, type_=sa.Text(), postgresql_using=f"{col}::text", schema=SCHEMA
        )


def downgrade() -> None:
    # fails on a row holding NUL or a lone surrogate, which JSONB cannot represent
    for col in COLUMNS:
        op.alter_column(
            "responses",
            col,
            type_=postgresql.JSONB(),
            postgresql_using=f"{col}::jsonb",
            schema=SCHEMA,
        )
