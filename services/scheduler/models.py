"""Tables of the scheduler schema (typed SQLAlchemy 2 models; migrations in ./migrations).

``api_keys``: the gateway's API keys (services/scheduler/keys): the SHA-256 of each key,
never the key, with a short visible prefix, the tenant, the SLO classes it may use and its
rate limits. ``responses``: stored responses of the Responses API (``store``; chained by
``previous_response_id``), kept ``responses_retention_s``. Drain is per replica and in memory (gRPC ``Drain``/``Undrain`` on one
replica; the autoscaler's ``DRAINING`` membership events reach every replica through
``{prefix}:membership``); revision 0002 dropped the unused ``drain_state`` table.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Index, Integer, LargeBinary, MetaData, Text, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "scheduler"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class ApiKeyRow(Base):
    """One gateway API key. ``slo_classes`` empty = every class; ``rpm``/``tpm`` NULL = no
    limit; ``revoked_at`` NULL = live."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(Text, primary_key=True)
    prefix: Mapped[str] = mapped_column(Text, nullable=False)
    key_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False, unique=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    slo_classes: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class ResponseRow(Base):
    """A stored response of the Responses API (services/scheduler/responses): this turn's
    canonical input items, its output items, the turn it continued and the response object
    as answered. Rows past ``expires_at`` are never served and are swept. The three JSON
    columns hold JSON text, not JSONB, which refuses NUL and lone surrogates."""

    __tablename__ = "responses"
    __table_args__ = (Index("ix_scheduler_responses_expires_at", "expires_at"),)

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    previous_response_id: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    input_items: Mapped[str] = mapped_column(Text, nullable=False)
    output_items: Mapped[str] = mapped_column(Text, nullable=False)
    response: Mapped[str] = mapped_column(Text, nullable=False)
