"""Alembic environment of the kvmeta schema; see services.common.db.migrate."""

from services.common.db import run_migrations_online
from services.kvmeta.models import Base

run_migrations_online(Base.metadata)
