"""Telemetry ingest (shell): records from the ``{prefix}:requests`` consumer group and the
``ReportRecords`` RPC go through one path, :class:`~.pipeline.Ingest` — validate, insert
idempotently into Postgres with the batch's rollups in the same transaction, then update the
in-memory windows and call the record observers."""
