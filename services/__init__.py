"""Tideserve: the control plane services, shared runtime and tools."""
