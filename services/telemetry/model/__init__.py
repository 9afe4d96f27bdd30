"""Telemetry's performance-model side: the online fit of each deployment x role's timing
(:mod:`.fit`, :mod:`.robust`, :mod:`.coefficients`, samples in :mod:`.state`), the P/D
replica recommendation (:mod:`.recommend`), all pure; :mod:`.service` is the shell that
feeds them (records, load snapshots, membership, ``/metrics`` scrapes) and answers the
``GetPerfModel`` / ``GetRecommendation`` RPCs through the servicer's ``ModelRpc`` port."""
