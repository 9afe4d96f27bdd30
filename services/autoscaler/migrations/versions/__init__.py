"""Alembic revisions of the autoscaler schema."""
