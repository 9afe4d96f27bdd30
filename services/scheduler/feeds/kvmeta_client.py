"""Precise prefix data for the gateway: kvmeta's ``MatchPrefix`` before a scheduling cycle.

:class:`KVMetaLookup` is the gateway's ``prefix_lookup``: for a request whose profile uses
a ``precise-prefix`` plugin it asks kvmeta which candidate instances hold how much of the
prompt's block-hash chain, per tier, under a short deadline. Any failure (deadline,
kvmeta down, unknown deployment, bad answer) returns None — the cycle then runs without
precise data (the precise scorer gives every endpoint 0) — and is counted in ``stats``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

import grpc
from tideserve.v1 import common_pb2, kvmeta_pb2

from services.common.routing.framework import Scheduler
from services.common.routing.plugins.estimate import PrefixEstimate
from services.common.routing.plugins.prefix import PrecisePrefix
from services.common.routing.types import PrefixMatch, RequestView, Tier

__all__ = ["MATCH_PREFIX", "KVMetaLookup", "precise_profiles", "to_matches"]

MATCH_PREFIX = "/tideserve.v1.KVMetaService/MatchPrefix"
LOG_EVERY_S = 60.0
"""At most one warning per failure kind in this long (the counts are in ``stats``)."""

log = logging.getLogger(__name__)

_TIERS: dict[int, Tier] = {
    common_pb2.TIER_GPU: "gpu",
    common_pb2.TIER_CPU: "cpu",
    common_pb2.TIER_SSD: "ssd",
    common_pb2.TIER_REMOTE: "remote",
}


def precise_profiles(scheduler: Scheduler) -> frozenset[str]:
    """Names of the profiles whose cycle reads precise prefix data (a ``precise-prefix`` or
    ``prefix-estimate`` plugin in the profile or in its prefill profile); ``""`` stands for the default."""
    out: set[str] = set()
    for name, prof in scheduler.profiles.items():
        used = [prof]
        if prof.prefill_profile in scheduler.profiles:
            used.append(scheduler.profiles[prof.prefill_profile])
        for p in used:
            plugins = [*p.preparers, *(s for s, _ in p.scorers)]
            if any(isinstance(x, PrecisePrefix | PrefixEstimate) for x in plugins):
                out.add(name)
    if scheduler.default_profile in out:
        out.add("")
    return frozenset(out)


# Single-tier answers (the common case) as shared, read-only PrefixMatch objects keyed by
# (matched blocks, tier, tier blocks); bounded: cleared when it fills.
_SINGLE: dict[tuple[int, int, int], PrefixMatch] = {}
_SINGLE_MAX = 65_536


def to_matches(resp: kvmeta_pb2.MatchPrefixResponse) -> dict[str, PrefixMatch]:
    """kvmeta's answer as the routing core's ``prefix_matches`` (unknown tiers dropped;
    instances without a matched block left out). The PrefixMatch objects (and their
    ``tiers``) may be shared between answers: read-only."""
    out: dict[str, PrefixMatch] = {}
    for m in resp.matches:
        n = m.matched_blocks
        if n <= 0:
            continue
        ts = m.tiers
        if len(ts) == 1:
            t = ts[0]
            key = (n, t.tier, t.blocks)
            pm = _SINGLE.get(key)
            if pm is None:
                name = _TIERS.get(key[1])
                one: dict[Tier, int] = {name: key[2]} if name is not None and key[2] > 0 else {}
                if len(_SINGLE) >= _SINGLE_MAX:
                    _SINGLE.clear()
                pm = _SINGLE[key] = PrefixMatch(matched_blocks=n, tiers=one)
            out[m.instance_id] = pm
            continue
        tiers: dict[Tier, int] = {}
        for t in ts:
            name = _TIERS.get(t.tier)
            if name is not None and t.blocks > 0:
                tiers[name] = tiers.get(name, 0) + t.blocks
        out[m.instance_id] = PrefixMatch(matched_blocks=n, tiers=tiers)
    return out


class KVMetaLookup:
    """``await lookup(view, deployment, tenant, profile)`` → matches or None.

    ``candidates()`` gives the instance ids to ask about (e.g. the fleet's ids); ``profiles``
    limits lookups to profiles that use precise data (None = always look up). Never raises
    for RPC failures; counts them in ``stats`` (``errors``, ``timeouts``, ``unknown``) and logs
    an error at most once per kind every :data:`LOG_EVERY_S`.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        candidates: Callable[[], Sequence[str]] = list,
        profiles: frozenset[str] | None = None,
        deadline_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._call = channel.unary_unary(
            MATCH_PREFIX,
            request_serializer=kvmeta_pb2.MatchPrefixRequest.SerializeToString,
            response_deserializer=kvmeta_pb2.MatchPrefixResponse.FromString,
        )
        self.candidates = candidates
        self.profiles = profiles
        self.deadline_s = deadline_s
        self.clock = clock
        self.stats: dict[str, int] = {
            "calls": 0,
            "ok": 0,
            "skipped": 0,
            "timeouts": 0,
            "unknown": 0,
            "errors": 0,
        }
        self.last_ms = 0.0
        self._warned: dict[str, float] = {}

    def _warn(self, what: str) -> None:
        kind = what.split(":", 1)[0].split("(", 1)[0]
        now = self.clock()
        if now - self._warned.get(kind, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._warned[kind] = now
            log.warning(
                "kvmeta MatchPrefix failed (%s); routing without precise data (%d errors)",
                what,
                self.stats["errors"],
            )

    def wants(self, profile: str) -> bool:
        return self.profiles is None or profile in self.profiles

    async def __call__(
        self, view: RequestView, deployment: str, tenant: str = "", profile: str = ""
    ) -> Mapping[str, PrefixMatch] | None:
        if not view.block_hashes or not self.wants(profile):
            self.stats["skipped"] += 1
            return None
        req = kvmeta_pb2.MatchPrefixRequest(
            deployment=deployment,
            tenant=tenant,
            block_hashes=view.block_hashes,
            candidate_instances=list(self.candidates()),
            lora=view.lora,
        )
        self.stats["calls"] += 1
        t0 = self.clock()
        try:
            resp = await self._call(req, timeout=self.deadline_s)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.stats["timeouts"] += 1
            elif code == grpc.StatusCode.NOT_FOUND:
                self.stats["unknown"] += 1  # kvmeta has no event of this deployment yet
            else:
                self.stats["errors"] += 1
                self._warn(f"{code.name}: {e.details()}")
            return None
        except Exception as e:  # a broken channel or answer must never fail the request
            self.stats["errors"] += 1
            self._warn(repr(e))
            return None
        finally:
            self.last_ms = (self.clock() - t0) * 1000.0
        if not isinstance(resp, kvmeta_pb2.MatchPrefixResponse):
            self.stats["errors"] += 1
            return None
        self.stats["ok"] += 1
        return to_matches(resp)
