"""Tables of the autoscaler schema (typed SQLAlchemy 2 models; migrations in ./migrations)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    LargeBinary,
    MetaData,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "autoscaler"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Deployment(Base):
    """A deployment spec as last applied. ``spec`` is a serialized
    ``tideserve.v1.DeploymentSpec``; ``generation`` increases on every change. ``desired``
    is ``{role: replicas}``, the last target handed to the reconciler; ``pins`` is
    ``{role: replicas}`` set by a manual scale, held by the planner until the next changed
    apply (or a release)."""

    __tablename__ = "deployments"
    __table_args__ = {"schema": SCHEMA}

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    spec: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, default=1)
    desired: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    pins: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class Instance(Base):
    """An engine instance of a deployment as the autoscaler knows it. ``info`` is a
    serialized ``tideserve.v1.Instance``; role/state are its enum names, kept as columns
    for queries. Removed with its deployment."""

    __tablename__ = "instances"
    __table_args__ = (
        Index("ix_instances_deployment_role", "deployment", "role"),
        {"schema": SCHEMA},
    )

    instance_id: Mapped[str] = mapped_column(Text, primary_key=True)
    deployment: Mapped[str] = mapped_column(
        Text, ForeignKey(f"{SCHEMA}.deployments.name", ondelete="CASCADE"), nullable=False
    )
    role: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    info: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class DeploymentRevision(Base):
    """Every spec a deployment had, by generation (removed with the deployment)."""

    __tablename__ = "deployment_revisions"
    __table_args__ = {"schema": SCHEMA}

    name: Mapped[str] = mapped_column(
        Text, ForeignKey(f"{SCHEMA}.deployments.name", ondelete="CASCADE"), primary_key=True
    )
    generation: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    spec: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class Decision(Base):
    """A scaling decision with what it saw (``inputs``), its ``forecast``, the binding
    constraint, reasons and status. Kept after its deployment is deleted (an audit log)."""

    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_deployment_ts", "deployment", "ts_ms"),
        {"schema": SCHEMA},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    decision_id: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    deployment: Mapped[str] = mapped_column(Text, nullable=False)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ts_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    changes: Mapped[list[Any]] = mapped_column(JSONB, nullable=False)
    victims: Mapped[list[Any]] = mapped_column(JSONB, nullable=False)
    reasons: Mapped[list[Any]] = mapped_column(JSONB, nullable=False)
    binding_constraint: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False)
    inputs: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    forecast: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
