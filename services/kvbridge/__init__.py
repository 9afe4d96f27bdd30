"""Bridge from vLLM's and SGLang's own ZMQ KV-event publishers to Tideserve KV events.

``wire`` decodes the engines' wire format, ``translate`` maps events to
``tideserve.v1.KVEvent``, ``core`` sequences batches (epochs, gaps, replay), ``run`` is the
process shell (ZMQ → Redis stream ``ts:kv:{deployment}``), ``cli`` the ``tideserve kv-bridge``
verb. See README.md in this folder for the formats and the block-hash convention.
"""
