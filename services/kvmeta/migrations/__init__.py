"""Alembic migrations of the kvmeta schema (run by services.common.db.migrate)."""
