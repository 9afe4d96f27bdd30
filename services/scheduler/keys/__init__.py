"""Gateway API keys: tenants and SLO classes from keys, per-tenant rate limits (see
README.md here). Pure parts: :mod:`.model` (keys, hashing, who may do what) and
:mod:`.ratelimit` (the window decision); shells: :mod:`.store` (Postgres),
:mod:`.cache` (in-process TTL cache), :mod:`.counters` (Redis or in-process windows),
:mod:`.gate` (the aiohttp middleware and the post-parse hook), :mod:`.cli` (``tideserve
keys``)."""
