"""autoscaler schema: manual pins (``tideserve scale``) per deployment role.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "autoscaler"


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("pins", postgresql.JSONB(), nullable=False, server_default="{}"),
        schema=SCHEMA,
    )


def downgrade() -> None:
    op.drop_column("deployments", "pins", schema=SCHEMA)
