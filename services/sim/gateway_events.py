"""What passes between the gateway replicas, and their dispatch order (a mixin of
:class:`~services.sim.run.Simulation`): picks and retractions one replica publishes reach
the others ``share_lag_ms`` later (``share``), in-flight counts and backlogs every
``share_heartbeat_ms`` (``beat``), and a replica's shaper lets a held pick go when its
timer fires (``shape``, armed by :meth:`GatewayEvents.arm`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.sim.config import SimConfig
from services.sim.events import EventQueue
from services.sim.routing import Gateways

__all__ = ["GatewayEvents"]


class GatewayEvents:
    """The gateway replicas' handlers; the attributes are the simulation's."""

    cfg: SimConfig
    gw: Gateways
    q: EventQueue

    if TYPE_CHECKING:  # the simulation's own

        def dispatch(self, rids: list[str], now: float) -> int: ...

    def publish(self, now: float) -> None:
        """Deliver what the replicas published (picks, retractions) ``share_lag_ms`` on."""
        if self.gw.sharing:
            at = now + self.cfg.share_lag_ms
            for item in self.gw.take_shared(now / 1000.0):
                self.q.push(at, "share", item)

    def share(self, p: Any, now: float) -> int:
        # Followers a foreign carrier's end set free go now; as in beat, the instance's own
        # timer (armed while any wait) re-times itself.
        ended = 0
        for _, _, go in self.gw.deliver(p[0], p[1], now / 1000.0):
            if go:
                ended += self.dispatch(go, now)
        return ended

    def beat(self, _: Any, now: float) -> int:
        # A lower foreign backlog lets waiting requests go now; the instance's own timer
        # (armed while any wait) runs on and re-times itself when it fires.
        ended = 0
        for _, _, go in self.gw.heartbeat(now / 1000.0):
            if go:
                ended += self.dispatch(go, now)
        self.q.push(now + self.cfg.share_heartbeat_ms, "beat", None)
        return ended

    def shape(self, p: tuple[int, str], now: float) -> int:
        g, iid = p
        ended = self.dispatch(self.gw.shapers[g].release(iid, now / 1000.0), now)
        self.arm(g, iid)
        return ended

    def arm(self, g: int, iid: str) -> None:
        """A timer for when replica ``g``'s shaper lets a waiting request of ``iid`` go."""
        at = self.gw.shapers[g].next_release_at(iid)
        if at is not None:
            self.q.push(at * 1000.0 + 1e-6, "shape", (g, iid))
