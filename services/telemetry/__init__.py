"""Tideserve telemetry."""
