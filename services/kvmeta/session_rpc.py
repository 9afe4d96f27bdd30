"""The agent-session RPCs of ``KVMetaService`` (a mixin of the servicer): protobuf ⇄
:class:`~services.common.sessions.SessionTable`, domain errors to status codes, replies after
the changed rows were written (:class:`~services.kvmeta.sessions.SessionShell`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, TypeAlias

import grpc
from tideserve.v1 import kvmeta_pb2

from services.common.sessions import (
    Fate,
    HomeKV,
    Phase,
    Session,
    SessionError,
    SessionKey,
    homes_kv,
)
from services.common.sessions.migration import active_sessions
from services.kvmeta.migrate import DestinationRef, SessionMigrator
from services.kvmeta.rpc_errors import persisted
from services.kvmeta.sessions import SessionShell

__all__ = ["SessionRpcs", "session_pb"]

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Reply: TypeAlias = kvmeta_pb2.SessionResponse

_PHASE_PB = {
    Phase.ACTIVE: kvmeta_pb2.SESSION_PHASE_ACTIVE,
    Phase.IDLE: kvmeta_pb2.SESSION_PHASE_IDLE,
    Phase.ENDED: kvmeta_pb2.SESSION_PHASE_ENDED,
}
_PHASE_OF = {v: k for k, v in _PHASE_PB.items()}
_FATE_PB = {
    Fate.MOVE: kvmeta_pb2.MIGRATION_FATE_MOVE,
    Fate.TIER: kvmeta_pb2.MIGRATION_FATE_TIER,
    Fate.DROP: kvmeta_pb2.MIGRATION_FATE_DROP,
}


def _ms(t: float) -> int:
    return int(t * 1000) if t > 0 else 0


def session_pb(s: Session) -> kvmeta_pb2.AgentSession:
    return kvmeta_pb2.AgentSession(
        session_id=s.session_id,
        tenant=s.tenant,
        parent_session_id=s.parent_session_id,
        agent=s.agent,
        phase=_PHASE_PB[s.phase],
        tip_block_hash=s.tip_hash,
        tip_tokens=s.tip_tokens,
        home_instance=s.home_instance,
        tiers=[kvmeta_pb2.TierMatch(tier=t, blocks=n) for t, n in s.tiers],  # type: ignore[arg-type]
        turns=s.turns,
        turn_started_ms=_ms(s.turn_started_at),
        last_turn_end_ms=_ms(s.last_turn_end),
        tool_names=list(s.tool_names),
        predicted_return_ms=_ms(s.predicted_return_at),
        prediction_samples=s.prediction_samples,
        prediction_source=s.prediction_source,
        ended_ms=_ms(s.ended_at),
        updated_ms=_ms(s.updated_at),
    )


async def _abort(context: Ctx, code: grpc.StatusCode, msg: str) -> NoReturn:
    await context.abort(code, msg)
    raise AssertionError("unreachable")  # pragma: no cover


class SessionRpcs:
    """Session RPCs; the servicer sets ``self.sessions`` and ``self.migrator``."""

    sessions: SessionShell
    migrator: SessionMigrator

    async def _apply(self, context: Ctx, fn: Callable[[], Session], *, persist: bool) -> Reply:
        try:
            s = fn()
        except SessionError as exc:
            await _abort(context, getattr(grpc.StatusCode, exc.code), str(exc))
        if persist:
            await persisted(context, self.sessions.persist)
        return kvmeta_pb2.SessionResponse(session=session_pb(s))

    async def StartSessionTurn(
        self, request: kvmeta_pb2.StartSessionTurnRequest, context: Ctx
    ) -> Reply:
        r, t, now = request, self.sessions.table, self.sessions.now()
        key: SessionKey = (r.deployment, r.tenant, r.session_id)
        return await self._apply(
            context,
            lambda: t.turn_start(
                key,
                now,
                parent_session_id=r.parent_session_id,
                agent=r.agent,
                home_instance=r.home_instance,
            ),
            persist=True,
        )

    async def EndSessionTurn(
        self, request: kvmeta_pb2.EndSessionTurnRequest, context: Ctx
    ) -> Reply:
        r, t, now = request, self.sessions.table, self.sessions.now()
        key: SessionKey = (r.deployment, r.tenant, r.session_id)
        reply = await self._apply(
            context,
            lambda: t.turn_end(
                key,
                now,
                tip_hash=r.tip_block_hash,
                tip_tokens=r.tip_tokens,
                tool_names=list(r.tool_names),
                final=r.final,
                home_instance=r.home_instance,
            ),
            persist=True,
        )
        self.sessions.set_chain(key, r.block_hashes)
        return reply

    async def SetSessionPlacement(
        self, request: kvmeta_pb2.SetSessionPlacementRequest, context: Ctx
    ) -> Reply:
        r, t, now = request, self.sessions.table, self.sessions.now()
        key: SessionKey = (r.deployment, r.tenant, r.session_id)
        tiers: dict[int, int] = {}
        for m in r.tiers:
            tiers[int(m.tier)] = tiers.get(int(m.tier), 0) + m.blocks
        return await self._apply(
            context,
            lambda: t.set_placement(key, now, home_instance=r.home_instance, tiers=tiers),
            persist=True,
        )

    async def EndAgentSession(
        self, request: kvmeta_pb2.EndAgentSessionRequest, context: Ctx
    ) -> Reply:
        r, t, now = request, self.sessions.table, self.sessions.now()
        key: SessionKey = (r.deployment, r.tenant, r.session_id)
        return await self._apply(context, lambda: t.end(key, now), persist=True)

    async def GetAgentSession(
        self, request: kvmeta_pb2.GetAgentSessionRequest, context: Ctx
    ) -> Reply:
        r, t = request, self.sessions.table
        key: SessionKey = (r.deployment, r.tenant, r.session_id)
        return await self._apply(context, lambda: t.get(key), persist=False)

    async def ListAgentSessions(
        self, request: kvmeta_pb2.ListAgentSessionsRequest, context: Ctx
    ) -> kvmeta_pb2.ListAgentSessionsResponse:
        r = request
        if not r.deployment:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "deployment is required")
        if r.limit < 0:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "limit must be >= 0")
        phase = _PHASE_OF.get(r.phase)
        rows = self.sessions.table.list(
            r.deployment, r.tenant, phase=phase, home_instance=r.home_instance, limit=r.limit
        )
        return kvmeta_pb2.ListAgentSessionsResponse(sessions=[session_pb(s) for s in rows])

    async def ListSessionHomes(
        self, request: kvmeta_pb2.ListSessionHomesRequest, context: Ctx
    ) -> kvmeta_pb2.ListSessionHomesResponse:
        if not request.deployment:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "deployment is required")
        rows = [s for s in self.sessions.table.rows() if s.deployment == request.deployment]
        chains = self.sessions.chains
        blocks = {s.key: len(chains[s.key]) for s in rows if s.key in chains}
        homes = homes_kv(rows, blocks)
        now, window = self.migrator.wall(), self.migrator.active_window_s
        active = {
            iid: homes_kv(active_sessions(rows, iid, now, window), blocks).get(iid, HomeKV())
            for iid in homes
        }
        return kvmeta_pb2.ListSessionHomesResponse(
            homes=[_home_pb(iid, h, active[iid]) for iid, h in sorted(homes.items())]
        )

    async def MigrateSessions(
        self, request: kvmeta_pb2.MigrateSessionsRequest, context: Ctx
    ) -> kvmeta_pb2.MigrateSessionsResponse:
        r = request
        if not r.deployment or not r.instance_id:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "deployment and instance_id are required"
            )
        if any(d.instance_id in ("", r.instance_id) for d in r.destinations):
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "destinations need an instance_id other than the instance being removed",
            )
        dests = [DestinationRef(d.instance_id, d.url, d.load) for d in r.destinations]
        res = await self.migrator.migrate(r.deployment, r.instance_id, r.url, dests)
        await persisted(context, self.sessions.persist)
        return kvmeta_pb2.MigrateSessionsResponse(
            sessions=[
                kvmeta_pb2.SessionMigration(
                    tenant=mv.key[1],
                    session_id=mv.key[2],
                    fate=_FATE_PB[mv.fate],
                    instance_id=mv.instance,
                    blocks=mv.blocks,
                    reason=mv.reason,
                )
                for mv in res.plan.moves
            ],
            offload_requested=res.offload_requested,
            offloaded=res.offloaded,
            offloads_to_tier=res.offloads_to_tier,
            engine_detail=res.engine_detail,
            offload_settled=res.offload_settled,
            prefetch_started=res.prefetch_started,
        )


def _home_pb(iid: str, h: HomeKV, active: HomeKV) -> kvmeta_pb2.SessionHome:
    return kvmeta_pb2.SessionHome(
        instance_id=iid,
        sessions=h.sessions,
        blocks=h.blocks,
        tokens=h.tokens,
        active_sessions=active.sessions,
        active_blocks=active.blocks,
        active_tokens=active.tokens,
    )
