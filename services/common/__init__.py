"""Tideserve common."""
