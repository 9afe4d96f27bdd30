"""Alembic revisions of the scheduler schema."""
