"""Tideserve autoscaler."""
