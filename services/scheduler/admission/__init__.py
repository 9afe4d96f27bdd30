"""The gateway's admission shell: the dispatch loop and the gate between the HTTP intake and
the admission core (``services.common.admission``)."""
