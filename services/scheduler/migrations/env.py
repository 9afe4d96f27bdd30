"""Alembic environment of the scheduler schema; see services.common.db.migrate."""

from services.common.db import run_migrations_online
from services.scheduler.models import Base

run_migrations_online(Base.metadata)
