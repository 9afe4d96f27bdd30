"""Tool times learned from request records: a :class:`~services.telemetry.ports.RecordObserver`.

Every committed record that names a session is a turn of it
(:class:`~services.common.sessions.gaps.TurnGaps`, per deployment, tenant and session): the
gap from the session's previous turn's end to this turn's arrival is an observation for the
tools the previous turn called (the record's ``tool_calls``), in one
:class:`~services.common.sessions.tooltime.ToolTimePredictor` per deployment, the same core
kvmeta predicts with. :meth:`ToolTimes.table` is what ``GetToolTimes`` answers. Records carry
no agent name, so the distributions are per tool across agents. Memory is bounded: sessions
by ``max_sessions``, distributions by the predictor's own bound, deployments by
``max_deployments`` (the least recently observed dropped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tideserve.v1 import events_pb2

from services.common.sessions import GapQuantiles, ToolTimePredictor, TurnGaps

__all__ = ["DEFAULT_PERCENTILES", "ToolTimes"]

DEFAULT_PERCENTILES = (0.5, 0.9, 0.99)


class ToolTimes:
    """Per deployment, the gap distributions the records make (module doc)."""

    def __init__(self, max_sessions: int = 100_000, max_deployments: int = 256) -> None:
        self._gaps = TurnGaps(max_sessions)
        self._by_deployment: OrderedDict[str, ToolTimePredictor] = OrderedDict()
        self.max_deployments = max_deployments

    @property
    def sessions_tracked(self) -> int:
        return len(self._gaps)

    def observe_records(self, now_ms: int, records: Sequence[events_pb2.RequestRecord]) -> None:
        for r in sorted((r for r in records if r.session_id), key=lambda r: r.arrival_ms):
            end_ms = r.finish_ms or r.arrival_ms
            ok = r.http_status in (0, 200) and not r.error
            obs = self._gaps.turn(
                (r.deployment, r.tenant, r.session_id),
                r.arrival_ms / 1000.0,
                end_ms / 1000.0,
                [c.name for c in r.tool_calls if c.name],
                ok=ok,
            )
            if obs is not None:
                self._predictor(r.deployment).observe(obs.tools, obs.agent, obs.gap_s)

    def _predictor(self, deployment: str) -> ToolTimePredictor:
        p = self._by_deployment.get(deployment)
        if p is None:
            p = self._by_deployment[deployment] = ToolTimePredictor()
            while len(self._by_deployment) > self.max_deployments:
                self._by_deployment.popitem(last=False)
        self._by_deployment.move_to_end(deployment)
        return p

    def table(
        self,
        deployment: str,
        percentiles: Sequence[float] = DEFAULT_PERCENTILES,
        min_samples: int = 0,
    ) -> list[GapQuantiles]:
        """The deployment's distributions at ``percentiles`` (empty when it has none yet).
        Raises ``ValueError`` for a percentile outside (0, 1]."""
        p = self._by_deployment.get(deployment)
        if p is None:
            if any(not 0.0 < q <= 1.0 for q in percentiles):
                raise ValueError(f"percentiles must be in (0, 1], got {list(percentiles)}")
            return []
        return p.quantiles(percentiles, min_samples)
