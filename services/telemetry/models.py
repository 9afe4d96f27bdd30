"""Tables of the telemetry schema (typed SQLAlchemy 2 models; migrations in ./migrations)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "telemetry"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class RequestRecordRow(Base):
    """One finished request (``record`` = serialized ``tideserve.v1.RequestRecord``), with
    the columns windows filter and aggregate on. ``request_id`` is unique, so inserting
    with ``ON CONFLICT (request_id) DO NOTHING`` makes at-least-once delivery idempotent."""

    __tablename__ = "request_records"
    __table_args__ = (
        UniqueConstraint("request_id", name="uq_request_records_request_id"),
        Index("ix_request_records_deployment_finish", "deployment", "finish_ms"),
        {"schema": SCHEMA},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    request_id: Mapped[str] = mapped_column(Text, nullable=False)
    deployment: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False, default="")
    tenant: Mapped[str] = mapped_column(Text, nullable=False, default="")
    slo_class: Mapped[str] = mapped_column(Text, nullable=False, default="")
    outcome: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    arrival_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    finish_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    prompt_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    queue_ms: Mapped[float] = mapped_column(Double, nullable=False, default=0.0)
    ttft_ms: Mapped[float] = mapped_column(Double, nullable=False, default=0.0)
    tpot_ms: Mapped[float] = mapped_column(Double, nullable=False, default=0.0)
    e2e_ms: Mapped[float] = mapped_column(Double, nullable=False, default=0.0)
    record: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
