"""Tables of the telemetry schema (typed SQLAlchemy 2 models; migrations in ./migrations).

``request_records`` (partitioned by RANGE of ``finish_ms``, one partition per
``partition_s``) is a Core table: it is written with COPY and read with SQL
(services/telemetry/store/). See migration 0002 for why idempotence lives in ``request_ids``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    text,
)
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
    # +1 on every rewrite: readers cache decoded rows by (key, version)
    version: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("1"))


request_records = Table(
    "request_records",
    Base.metadata,
    Column("request_id", Text, nullable=False),
    Column("finish_ms", BigInteger, nullable=False),
    Column("arrival_ms", BigInteger, nullable=False),
    Column("deployment", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("slo_class", Text, nullable=False),
    Column("session_id", Text, nullable=False),
    Column("outcome", SmallInteger, nullable=False),
    Column("record", LargeBinary, nullable=False),
    Index(
        "ix_request_records_session",
        "session_id",
        "arrival_ms",
        postgresql_where=text("session_id <> ''"),
    ),
    postgresql_partition_by="RANGE (finish_ms)",
)
"""One finished request (``record`` = serialized ``tideserve.v1.RequestRecord``)."""
