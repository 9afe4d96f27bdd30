"""Session/agent affinity: a session's rendezvous home, which every gateway replica computes
alike, and stickiness to the instance that last served it, with a load escape."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field

from services.common.routing.framework import CycleContext
from services.common.routing.registry import NoParams, Params, PluginEnv, register
from services.common.routing.types import EndpointView, Pick, RequestView
from services.common.sessions.homes import rendezvous_home, route_key


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
    0 elsewhere; a sub-agent's session not seen yet scores where its parent session last
    went (its prompt starts from the parent's). Scores nothing when the session (and its
    parent) is unknown/expired, the instance is not a candidate, or it is overloaded (the
    load escape). Bounded LRU of sessions with TTL; a
    session's entry is dropped when its final turn is answered (:meth:`end_session`)."""

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
        if iid is None and request.parent_session_id:
            iid = self.sticky(request.parent_session_id, ctx.now)
        e = next((c for c in candidates if c.instance_id == iid), None)
        if e is None:
            return {}
        lo = min(c.queue_load for c in candidates)
        if e.queue_load - lo > self.p.escape_queue_delta or e.kv_usage >= self.p.escape_kv_usage:
            return {}
        return {e.instance_id: 1.0}

    def end_session(self, session_id: str) -> bool:
        """The session's final turn was answered: forget where it went."""
        return self._sessions.pop(session_id, None) is not None

    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        if not request.session_id:
            return
        self._sessions[request.session_id] = (pick.decode.endpoint.instance_id, now)
        self._sessions.move_to_end(request.session_id)
        while len(self._sessions) > self.p.max_sessions:
            self._sessions.popitem(last=False)


@register("session-home", NoParams)
class SessionHome:
    """Scores 1 for the request's session home among the candidates
    (:func:`~services.common.sessions.homes.rendezvous_home` of ``request.session_id``), 0
    elsewhere; nothing without a session id. A sub-agent's
    home is its parent session's: its prompt starts from the parent's system prompt and
    tools, which the parent's turns left there, and its own turns stay together.

    Active-active gateway replicas learn where a session went only through shared state,
    which arrives after the fact. This scorer needs no state: every replica ranks the same
    home first, so a session's turns land together even when consecutive turns reach
    different replicas before the first replica's routed prefix has reached the others.
    Weighted as a tie-break: a known prefix elsewhere or a clear load difference still wins.
    """

    def __init__(self, name: str, params: NoParams, env: PluginEnv) -> None:
        self.name = name

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        key = route_key(request.session_id, request.parent_session_id)
        if not request.session_id or not key:
            return {}
        home = rendezvous_home(key, [c.instance_id for c in candidates])
        return {home: 1.0} if home is not None else {}
