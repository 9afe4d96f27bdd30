"""Tables of the kvmeta schema (typed SQLAlchemy 2 models; migrations in ./migrations).

The object/lease tables are added by a later revision.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Identity, Index, LargeBinary, MetaData, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "kvmeta"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class IndexCheckpoint(Base):
    """A snapshot of one deployment's prefix index, valid up to and including entry
    ``stream_id`` of its KV-event stream: on restart kvmeta loads the newest checkpoint
    and replays the stream after ``stream_id``."""

    __tablename__ = "index_checkpoints"
    __table_args__ = (
        Index("ix_index_checkpoints_deployment_id", "deployment", "id"),
        {"schema": SCHEMA},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    deployment: Mapped[str] = mapped_column(Text, nullable=False)
    stream_id: Mapped[str] = mapped_column(Text, nullable=False)
    snapshot: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
