"""The autoscaler's kvmeta client for agent sessions (translation only).

- :meth:`KVMetaSessions.homes`: per instance of a deployment, the blocks of the live agent
  sessions homed there (``ListSessionHomes``), which the planner weighs scale-in victims by,
  and the context tokens of the active ones, which its scale-in floor keeps room for;
- :meth:`KVMetaSessions.migrate`: after a victim was drained and before it is removed, ask
  kvmeta to move its sessions (``MigrateSessions``) to the instances of its role that stay.
  Load is not sent: kvmeta places a session on its rendezvous home, the instance the router
  sends its next turn to, which does not depend on load.

A failed migration never blocks a scale-in: :meth:`~KVMetaSessions.migrate` logs it and
returns a line saying so, and the driver removes the instance anyway (its sessions' KV is
then lost, as without kvmeta).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc

from services.common.planner.driver_base import InstanceState, InstanceStatus

__all__ = ["HomeLoad", "KVMetaSessions", "peers_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HomeLoad:
    """One instance's agent sessions as kvmeta counts them: the live ones' blocks (victim
    cost) and the active ones' context tokens (the planner's scale-in floor)."""

    blocks: int = 0
    active_tokens: int = 0


def peers_of(victim: InstanceStatus, instances: Sequence[InstanceStatus]) -> list[InstanceStatus]:
    """The READY instances of the victim's deployment and role other than the victim."""
    return [
        s
        for s in instances
        if s.deployment == victim.deployment
        and s.role_name == victim.role_name
        and s.instance_id != victim.instance_id
        and s.state == InstanceState.READY
    ]


class KVMetaSessions:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 30.0) -> None:
        self._channel = channel
        self._stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
        self.timeout_s = timeout_s

    async def close(self) -> None:
        await self._channel.close()

    async def homes(self, deployment: str) -> dict[str, HomeLoad]:
        """``{instance id: its sessions' load}``; an RPC error propagates."""
        resp = await self._stub.ListSessionHomes(
            kvmeta_pb2.ListSessionHomesRequest(deployment=deployment), timeout=self.timeout_s
        )
        return {h.instance_id: HomeLoad(int(h.blocks), int(h.active_tokens)) for h in resp.homes}

    async def migrate(self, victim: InstanceStatus, peers: Sequence[InstanceStatus]) -> str:
        """Move the victim's sessions to ``peers``; a one-line summary (never raises)."""
        req = kvmeta_pb2.MigrateSessionsRequest(
            deployment=victim.deployment,
            instance_id=victim.instance_id,
            url=victim.endpoint,
            destinations=[
                kvmeta_pb2.MigrationDestination(instance_id=p.instance_id, url=p.endpoint)
                for p in peers
            ],
        )
        try:
            resp = await self._stub.MigrateSessions(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            # UNAVAILABLE may also mean "applied, not yet persisted": kvmeta says which
            log.warning("%s: session migration: kvmeta answered %s: %s",
                        victim.instance_id, e.code().name, e.details())  # fmt: skip
            return f"session migration: kvmeta answered {e.code().name}"
        if not resp.sessions:
            return ""
        fates = {f: 0 for f in ("move", "tier", "drop")}
        names = {
            kvmeta_pb2.MIGRATION_FATE_MOVE: "move",
            kvmeta_pb2.MIGRATION_FATE_TIER: "tier",
            kvmeta_pb2.MIGRATION_FATE_DROP: "drop",
        }
        for m in resp.sessions:
            fates[names.get(m.fate, "drop")] += 1
        line = (
            f"sessions: {fates['move']} re-homed, {fates['tier']} to the tier, "
            f"{fates['drop']} dropped"
        )
        if resp.engine_detail:
            line += f" (blocks not offloaded: {resp.engine_detail})"
        elif resp.offload_requested and resp.offloads_to_tier and not resp.offload_settled:
            line += " (some blocks may not have reached the tier)"
        if resp.prefetch_started:
            line += f", {resp.prefetch_started} fetching their prefix at their new home"
        return line
