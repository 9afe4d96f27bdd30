"""Postgres storage of telemetry: partitioned request records, the request-id ledger and
the 1-minute rollups (shell; the pure partition rules are in :mod:`.partitions`)."""
