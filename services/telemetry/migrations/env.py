"""Alembic environment of the telemetry schema; see services.common.db.migrate."""

from services.common.db import run_migrations_online
from services.telemetry.models import Base

run_migrations_online(Base.metadata)
