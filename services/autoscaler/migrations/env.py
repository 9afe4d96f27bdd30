"""Alembic environment of the autoscaler schema; see services.common.db.migrate."""

from services.autoscaler.models import Base
from services.common.db import run_migrations_online

run_migrations_online(Base.metadata)
