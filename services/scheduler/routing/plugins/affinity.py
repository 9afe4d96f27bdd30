"""Session/agent affinity: stick a session to the instance that served it, with a load escape."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.scheduler.routing.framework import CycleContext
from services.scheduler.routing.registry import Params, PluginEnv, register
from services.scheduler.routing.types import EndpointView, Pick, RequestView


class SessionAffinityParams(Params):
    ttl_s: float = Field(1800.0, gt=0)
    max_sessions: int = Field(100_000, gt=0)
    # Escape when the sticky instance has this many more queued requests than the least
    # loaded candidate, or its KV usage is at least escape_kv_usage.
    escape_queue_delta: int = Field(8, ge=0)
    escape_kv_usage: float = Field(0.95, gt=0, le=1)


@register("session-affinity", SessionAffinityParams)
class SessionAffinity:
    """Scores 1 for the instance that last served ``request.session_id`` (decode side),
    0 elsewhere; scores nothing when the session is unknown/expired, the instance is not a
    candidate, or it is overloaded (the load escape). Bounded LRU of sessions with TTL."""

    def __init__(self, name: str, params: SessionAffinityParams, env: PluginEnv) -> None:
        self.name = name
        self.p = params
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def sticky(self, session_id: str, now: float) -> str | None:
        hit = self._sessions.get(session_id)
        if hit is None or now - hit[1] > self.p.ttl_s:
            return None
        return hit[0]

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        if not request.session_id:
            return {}
        iid = self.sticky(request.session_id, ctx.now)
        e = next((c for c in candidates if c.instance_id == iid), None)
        if e is None:
            return {}
        lo = min(c.queue_load for c in candidates)
        if e.queue_load - lo > self.p.escape_queue_delta or e.kv_usage >= self.p.escape_kv_usage:
            return {}
        return {e.instance_id: 1.0}

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        if not request.session_id:
            return
        self._sessions[request.session_id] = (pick.decode.endpoint.instance_id, now)
        self._sessions.move_to_end(request.session_id)
        while len(self._sessions) > self.p.max_sessions:
            self._sessions.popitem(last=False)
