"""The scheduler's outside feeds and integrations (shells over pure cores): engine load
snapshots, membership, the local KV-index replica, kvmeta lookups, active-active sharing
between gateway replicas, and the request-record sink."""
