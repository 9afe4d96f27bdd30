"""Tideserve scheduler."""
