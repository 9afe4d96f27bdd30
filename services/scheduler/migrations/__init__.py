"""Alembic migrations of the scheduler schema (run by services.common.db.migrate)."""
