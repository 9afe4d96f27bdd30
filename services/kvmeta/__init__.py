"""Tideserve kvmeta."""
