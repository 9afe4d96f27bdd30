"""The performance-model shell: feeds :class:`~.state.ModelState` from committed records
(``RecordObserver``), the engines' load snapshots (``{prefix}:load:{deployment}``), the
membership stream (``{prefix}:membership``, replayed from the start: start-up times) and
``/metrics`` scrapes of the engines that publish nothing, and answers ``GetPerfModel`` /
``GetRecommendation`` (``ModelRpc``).

Fits are computed on demand and cached per deployment x role for ``refit_interval_s``
(so no refit task runs; a fit of a few thousand samples takes milliseconds). Unknown
deployments (neither followed nor seen in any record, snapshot or event) raise
``LookupError``; a followed deployment without data answers the prior (confidence 0).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp
import redis.asyncio as aioredis
from tideserve.v1 import common_pb2, events_pb2, telemetry_pb2

from services.common.perfcoef import prior_coefficients
from services.common.perfmodel import get_profile
from services.common.streams import Start, StreamFollower, stream_name
from services.common.streams.ids import NEWEST
from services.common.tasks import pause, stop_tasks
from services.telemetry.model.fit import RoleFit, RoleSamples, fit_role
from services.telemetry.model.recommend import Capacity, SloClass, recommend
from services.telemetry.model.scrape import EngineFigures, decode_between, parse_engine_page
from services.telemetry.model.settings import ModelSettings
from services.telemetry.model.state import ModelState, RoleKey
from services.telemetry.model.translate import (
    perf_model_pb,
    recommendation_pb,
    slo_classes,
    traffic_mix,
)
from services.telemetry.ports import WindowSource

__all__ = ["ModelService"]

log = logging.getLogger(__name__)

_W, _P, _D = common_pb2.ROLE_WORKER, common_pb2.ROLE_PREFILL, common_pb2.ROLE_DECODE


class ModelService:
    """``RecordObserver`` + ``ModelRpc`` over one :class:`ModelState`. ``redis`` None = no
    stream feeds (records and scrapes only); ``wall`` is epoch seconds."""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        windows: WindowSource,
        redis: aioredis.Redis | None = None,
        prefix: str = "ts",
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.profile = get_profile(settings.profile)  # KeyError for an unknown profile
        self.prior = prior_coefficients(self.profile)
        self.cfg = settings.fit_config()
        self.state = ModelState(self.cfg, self.profile.kv_bytes_per_token, settings.block_size)
        self.windows = windows
        self.redis = redis
        self.prefix = prefix
        self._wall = wall
        self._fits: dict[RoleKey, RoleFit] = {}
        self._followers: list[StreamFollower[events_pb2.LoadSnapshot]] = []
        self._membership: StreamFollower[events_pb2.MembershipEvent] | None = None
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.scrape_errors = 0

    # -- RecordObserver ------------------------------------------------------------------
    def observe_records(self, now_ms: int, records: Sequence[events_pb2.RequestRecord]) -> None:
        self.state.observe_records(records)

    # -- fits ----------------------------------------------------------------------------
    def _known(self, deployment: str) -> bool:
        return deployment in self.settings.deployments or deployment in self.state.deployments()

    def default_role(self, deployment: str) -> int:
        """The role that prefills: prefill when the deployment has prefill instances or
        samples, else worker."""
        if (deployment, _P) in self.state.samples:
            return _P
        roles = (r for (d, _), r in self.state.roles.items() if d == deployment)
        return _P if _P in set(roles) else _W

    def fit(self, deployment: str, role: int, now_ms: int) -> RoleFit:
        """The cached fit of ``deployment`` x ``role`` (refitted when older than the refit
        interval); LookupError for an unknown deployment."""
        if not self._known(deployment):
            raise LookupError(f"unknown deployment {deployment!r}")
        key = (deployment, role)
        cached = self._fits.get(key)
        if cached is not None and now_ms - cached.fitted_ms < self.settings.refit_interval_s * 1e3:
            return cached
        samples = self.state.samples.get(key) or RoleSamples(1)
        fit = self._fits[key] = fit_role(samples, self.prior, self.cfg, now_ms)
        return fit

    # -- ModelRpc ------------------------------------------------------------------------
    def perf_model(
        self, request: telemetry_pb2.GetPerfModelRequest, now_ms: int
    ) -> telemetry_pb2.GetPerfModelResponse:
        dep = request.deployment
        role = int(request.role) or (self.default_role(dep) if self._known(dep) else _W)
        fit = self.fit(dep, role, now_ms)
        model = perf_model_pb(
            fit,
            deployment=dep,
            role=role,
            profile=self.profile.name,
            kv_bytes_per_token=self.profile.kv_bytes_per_token,
        )
        return telemetry_pb2.GetPerfModelResponse(model=model)

    def recommendation(
        self, request: telemetry_pb2.GetRecommendationRequest, now_ms: int
    ) -> telemetry_pb2.GetRecommendationResponse:
        dep = request.deployment
        if request.window_s < 0:
            raise ValueError("window_s must be >= 0 (0 = the default window)")
        window_s = request.window_s or self.settings.recommend_window_s
        if not self._known(dep):
            raise LookupError(f"unknown deployment {dep!r}")
        total = self.windows.window(dep, window_s, now_ms).total
        mix = traffic_mix(total)
        s = self.settings
        default = SloClass("default", s.default_percentile, s.default_ttft_ms, s.default_tpot_ms)
        classes = slo_classes(total, default)
        dis = request.disaggregated
        pre = self.fit(dep, _P if dis else _W, now_ms)
        dec = self.fit(dep, _D if dis else _W, now_ms)
        cap = Capacity(
            self.profile.kv_capacity_tokens,
            self.profile.kv_bytes_per_token,
            max_batch=s.max_batch,
            max_utilization=s.max_utilization,
        )
        rec = recommend(mix, classes, pre.coefficients, dec.coefficients, cap, disaggregated=dis)
        notes = [
            f"model: prefill confidence {pre.prefill.confidence:.2f}, "
            f"decode confidence {dec.decode.confidence:.2f}"
        ]
        return recommendation_pb(rec, mix, notes)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Follow the load and membership streams (with ``redis``) and start scraping the
        configured ``/metrics`` endpoints."""
        self._stopping.clear()
        s = self.settings
        if self.redis is not None:
            if s.follow_load:
                for dep in s.deployments:
                    f = StreamFollower(
                        self.redis,
                        stream_name(self.prefix, "load", dep),
                        events_pb2.LoadSnapshot,
                        lambda m, _id: self.state.observe_snapshot(m),
                        start=NEWEST,
                        wall=self._wall,
                        name=f"model-load-{dep}",
                    )
                    f.start()
                    self._followers.append(f)
            if s.follow_membership:
                m = StreamFollower(
                    self.redis,
                    stream_name(self.prefix, "membership"),
                    events_pb2.MembershipEvent,
                    lambda e, _id: self.state.observe_membership(e),
                    start=Start.beginning(),
                    wall=self._wall,
                    name="model-membership",
                )
                m.start()
                self._membership = m
        if s.scrape_endpoints:
            self._tasks.append(asyncio.create_task(self._scrape_loop(), name="model-scrape"))

    async def stop(self) -> None:
        """Idempotent: stop the followers and the scrape loop."""
        self._stopping.set()
        followers, self._followers = self._followers, []
        for f in followers:
            await f.stop()
        if self._membership is not None:
            await self._membership.stop()
            self._membership = None
        tasks, self._tasks = self._tasks, []
        await stop_tasks(tasks)

    async def _scrape_loop(self) -> None:
        s = self.settings
        last: dict[str, EngineFigures] = {}
        timeout = aiohttp.ClientTimeout(total=s.scrape_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stopping.is_set():
                for t in s.scrape_endpoints:
                    page = await self._fetch(session, t.url.rstrip("/") + "/metrics")
                    cur = parse_engine_page(page) if page is not None else None
                    if cur is None:
                        continue
                    prev, last[t.instance_id] = last.get(t.instance_id), cur
                    if prev is None:
                        continue
                    obs = decode_between(
                        prev,
                        cur,
                        deployment=t.deployment,
                        instance_id=t.instance_id,
                        kv_capacity_tokens=self.profile.kv_capacity_tokens,
                    )
                    if obs is not None:
                        self.state.observe_decode(obs)
                if await pause(self._stopping, s.scrape_interval_s):
                    return

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return await r.text()
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError) as e:
            log.debug("scrape %s: %s", url, e)
        self.scrape_errors += 1
        return None
