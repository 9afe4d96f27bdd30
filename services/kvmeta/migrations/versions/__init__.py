"""Alembic revisions of the kvmeta schema."""
