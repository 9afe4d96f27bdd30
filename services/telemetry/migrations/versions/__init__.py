"""Alembic revisions of the telemetry schema."""
