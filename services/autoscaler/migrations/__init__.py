"""Alembic migrations of the autoscaler schema (run by services.common.db.migrate)."""
