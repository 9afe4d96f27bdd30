"""Stored responses of the Responses API (``store``, ``previous_response_id``): the chain
rebuild (pure, :mod:`.chain`) and the store (:mod:`.store`: interface and Postgres)."""
