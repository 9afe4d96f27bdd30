"""Whether any engine can serve a request now (pure: a function of the endpoint snapshot).

Admission asks this before a request waits in the queue, and the queue's pump asks it while
requests wait: a request no engine can serve is refused at once (HTTP 503, gRPC
UNAVAILABLE) instead of waiting for capacity that cannot come, which is overload's answer
(429 / RESOURCE_EXHAUSTED) only when engines exist but are busy.

An engine can serve when it is eligible (healthy, not draining, circuit not open) and not
excluded by the request, and computes prompts: a ``worker``, or a ``decode`` instance when
decode instances can prefill or an eligible ``prefill`` instance is there to do it.
"""

from __future__ import annotations

from collections.abc import Collection

from services.common.routing.types import EndpointSnapshot, EndpointView

__all__ = ["no_engine"]


def no_engine(
    snapshot: EndpointSnapshot,
    *,
    decode_can_prefill: bool = True,
    exclude: Collection[str] = (),
) -> str | None:
    """None when some engine of ``snapshot`` can serve a request that excludes
    ``exclude``; else why none can, a message for the client that starts with
    "no engine is serving"."""
    _, decode, prefill = snapshot.pools()
    if exclude:
        decode = tuple(e for e in decode if e.instance_id not in exclude)
        prefill = tuple(e for e in prefill if e.instance_id not in exclude)
    if decode and (decode_can_prefill or prefill or any(e.role == "worker" for e in decode)):
        return None
    if not len(snapshot):
        return "no engine is serving: none is registered"
    return f"no engine is serving: {_why(snapshot, decode, prefill, exclude)}"


def _why(
    snapshot: EndpointSnapshot,
    decode: tuple[EndpointView, ...],
    prefill: tuple[EndpointView, ...],
    exclude: Collection[str],
) -> str:
    """What keeps each of ``snapshot``'s engines out (one count per reason)."""
    counts = {"unhealthy": 0, "draining": 0, "circuit open": 0, "excluded": 0}
    for e in snapshot:
        if not e.healthy:
            counts["unhealthy"] += 1
        elif e.draining:
            counts["draining"] += 1
        elif e.circuit == "open":
            counts["circuit open"] += 1
        elif e.instance_id in exclude:
            counts["excluded"] += 1
    reasons = [f"{n} {what}" for what, n in counts.items() if n]
    if decode:  # eligible decode instances that cannot compute a prompt alone
        reasons.append(f"{len(decode)} decode without an eligible prefill engine")
    elif prefill:
        reasons.append(f"{len(prefill)} prefill without an eligible decode engine")
    n = len(snapshot)
    return f"none of the {n} registered engine{'s' if n != 1 else ''} can ({', '.join(reasons)})"
