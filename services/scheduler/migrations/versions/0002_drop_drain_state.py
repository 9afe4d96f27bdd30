"""scheduler schema: drop drain_state (never written).

Drain is per scheduler replica and in memory: the gRPC ``Drain``/``Undrain`` of one replica
and the ``DRAINING`` membership events every replica follows on ``{prefix}:membership``
(the autoscaler's drain before removal). Nothing ever read or wrote this table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-10
"""

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SCHEMA = "scheduler"


def upgrade() -> None:
    op.drop_table("drain_state", schema=SCHEMA)


def downgrade() -> None:
    # the table exactly as revision 0001 created it
    importlib.import_module("services.scheduler.migrations.versions.0001_initial").upgrade()
