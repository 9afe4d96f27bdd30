"""Tables of the autoscaler schema (typed SQLAlchemy 2 models; migrations in ./migrations)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, LargeBinary, MetaData, Text, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "autoscaler"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Deployment(Base):
    """A deployment spec as last applied. ``spec`` is a serialized
    ``tideserve.v1.DeploymentSpec``; ``generation`` increases on every change."""

    __tablename__ = "deployments"
    __table_args__ = {"schema": SCHEMA}

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    spec: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    generation: Mapped[int] = mapped_column(BigInteger, nullable=False, default=1)
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
