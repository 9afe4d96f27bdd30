"""Tables of the scheduler schema (typed SQLAlchemy 2 models; migrations in ./migrations)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, MetaData, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "scheduler"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class DrainState(Base):
    """Whether the scheduler stops routing new requests to an instance (drain before
    removal). Survives scheduler restarts; keyed by instance id, upserted idempotently."""

    __tablename__ = "drain_state"
    __table_args__ = {"schema": SCHEMA}

    instance_id: Mapped[str] = mapped_column(Text, primary_key=True)
    draining: Mapped[bool] = mapped_column(Boolean, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
