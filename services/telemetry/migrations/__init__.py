"""Alembic migrations of the telemetry schema (run by services.common.db.migrate)."""
