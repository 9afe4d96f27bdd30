"""Tables of the telemetry schema (typed SQLAlchemy 2 models; migrations in ./migrations).

``request_records`` (partitioned by RANGE of ``finish_ms``, one partition per
``partition_s``) has no model: it is written with COPY and read with Core SQL
(services/telemetry/store/). See migration 0002 for why idempotence lives in ``request_ids``.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Index, LargeBinary, MetaData, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "telemetry"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class RequestIdRow(Base):
    """The idempotence ledger: one row per stored request (``ON CONFLICT DO NOTHING``)."""

    __tablename__ = "request_ids"
    __table_args__ = (Index("ix_request_ids_finish", "finish_ms"), {"schema": SCHEMA})

    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    finish_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)


class RollupRow(Base):
    """One replica's bucket of one slice (``data`` = services.telemetry.windows.codec)."""

    __tablename__ = "rollups"
    __table_args__ = (Index("ix_rollups_bucket", "bucket_ms"), {"schema": SCHEMA})

    replica_id: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket_ms: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    deployment: Mapped[str] = mapped_column(Text, primary_key=True)
    role: Mapped[str] = mapped_column(Text, primary_key=True)
    slo_class: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    updated_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
