"""The performance model against real simulated engines: records a gateway (in process)
writes to a real Redis while proxying to in-process simulated engines are fed to the
ModelService, whose fit moves from a wrong prior to the engines' profile and whose
recommendation, sized with that fit, moves the right way when the mix shifts; and the service's
stream feeds (membership start-up times, load snapshots' roles) on a real Redis."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from tideserve.v1 import common_pb2, events_pb2, telemetry_pb2

from services.common.perfcoef import prior_coefficients
from services.common.perfmodel import get_profile
from services.common.scheduling import EndpointSpec, build_core
from services.common.streams import StreamProducer, decode_entry, stream_name
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings
from services.scheduler.feeds.record_sink import RecordSink
from services.scheduler.http.options import GatewayOptions
from services.scheduler.http.records import record_requests
from services.scheduler.http.server import Gateway
from services.telemetry.model.service import ModelService
from services.telemetry.model.settings import ModelSettings
from tests.helpers.waits import eventually

pytestmark = pytest.mark.integration

TRUE = get_profile("test")
SPEEDUP = 0.5  # modelled time runs 2x slower than the wall clock: overheads weigh less


class NoWindows:
    def window(self, deployment: str, window_s: float, now_ms: int) -> Any:
        return telemetry_pb2.QueryWindowResponse()


class MixWindows:
    """A window source answering one traffic mix (set ``total``)."""

    def __init__(self) -> None:
        self.total = telemetry_pb2.WindowStats()

    def window(self, deployment: str, window_s: float, now_ms: int) -> Any:
        return telemetry_pb2.QueryWindowResponse(total=self.total)


def _mix(prompt: float, output: float) -> telemetry_pb2.WindowStats:
    return telemetry_pb2.WindowStats(
        request_rate_rps=50.0,
        input_tokens=telemetry_pb2.Percentiles(mean=prompt, p50=prompt * 0.8, p90=prompt * 2),
        output_tokens=telemetry_pb2.Percentiles(mean=output, p50=output, p90=output * 2),
        cache_hit_ratio=0.2,
        classes=[telemetry_pb2.ClassAttainment(slo_class="chat", percentile=90,
                                               ttft_target_ms=2000, tpot_target_ms=5)],
    )  # fmt: skip


@pytest.fixture
async def gateway(tmp_path: Path, redis_client: Any) -> AsyncIterator[tuple[str, RecordSink]]:
    servers: list[TestServer] = []
    specs = []
    for i in range(2):
        settings = EngineSettings(port=0, state_dir=tmp_path / f"e{i}", block_size=16,
                                  profile="test", speedup=SPEEDUP)  # fmt: skip
        es = TestServer(EngineServer(settings).app(), host="127.0.0.1")
        await es.start_server()
        servers.append(es)
        specs.append(EndpointSpec(f"e{i}", str(es.make_url("")).rstrip("/")))
    core = build_core(specs, perf_profile="test", block_size=16)
    gw = Gateway(core, GatewayOptions(background=False, block_size=16, backoff_ms=1, retries=1))
    sink = RecordSink(redis_client, f"ts:requests:{uuid.uuid4().hex[:6]}", flush_s=0.01)
    gw.finished.append(record_requests(sink, deployment="dep"))
    gs = TestServer(gw.app(), host="127.0.0.1")
    await gs.start_server()
    servers.append(gs)
    await gw.poll_load()
    yield str(gs.make_url("")).rstrip("/"), sink
    await sink.stop()
    for s in servers:
        await s.close()


async def _send(http: aiohttp.ClientSession, url: str, words: int, rng: random.Random) -> None:
    prompt = " ".join(f"w{rng.randrange(10**9)}" for _ in range(words))  # no cache hits
    body = {"model": "tideserve-sim", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 6, "stream": True}  # fmt: skip
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        await r.read()


async def test_fit_converges_to_the_simulators_profile(
    gateway: tuple[str, RecordSink], redis_client: Any
) -> None:
    url, sink = gateway
    rng = random.Random(7)
    async with aiohttp.ClientSession() as http:
        for _ in range(30):  # two at a time: some requests queue behind another
            await asyncio.gather(*(_send(http, url, rng.randrange(400, 4000), rng)
                                   for _ in range(2)))  # fmt: skip
    await sink.flush()
    recs = [decode_entry(f, events_pb2.RequestRecord) for _, f in
            await redis_client.xrange(sink.stream)]  # fmt: skip
    assert len(recs) == 60

    # the prior believes a device 3x slower than the engines
    settings = ModelSettings(
        profile="test*3", deployments=["dep"], min_samples=30, confident_samples=60
    )
    windows = MixWindows()
    svc = ModelService(settings, windows=windows)
    before = svc.perf_model(telemetry_pb2.GetPerfModelRequest(deployment="dep"), 0).model
    svc.observe_records(1, recs)
    m = svc.perf_model(telemetry_pb2.GetPerfModelRequest(deployment="dep"), 10**9).model
    assert before.samples == 0 and m.samples >= 60 and m.role == common_pb2.ROLE_WORKER

    def wall_prefill(pm: telemetry_pb2.PerfModel, n: int) -> float:
        return pm.prefill_base_ms + pm.prefill_ms_per_token * n + pm.prefill_ms_per_token2 * n * n

    prior = prior_coefficients(get_profile("test*3"))
    for n in (1000, 3000):
        truth = TRUE.prefill_ms(n) / SPEEDUP  # wall ms
        fitted = wall_prefill(m, n)
        # the fit left the prior (3x too slow) and landed near the truth; the wall clock
        # adds the gateway's and the engine's own overhead, hence the margin
        assert abs(fitted - truth) < 0.3 * truth, (n, fitted, truth)
        assert abs(fitted - truth) < 0.25 * abs(prior.prefill_ms(n) / SPEEDUP - truth)
    assert m.prefill_confidence > 0.6
    assert m.prefill_error < 0.2

    # the recommendation, sized with this fit, moves the right way when the mix shifts
    def rec(prompt: float, output: float) -> telemetry_pb2.GetRecommendationResponse:
        windows.total = _mix(prompt, output)
        req = telemetry_pb2.GetRecommendationRequest(deployment="dep", disaggregated=True)
        return svc.recommendation(req, 10**9)

    base, longer_prompts, longer_outputs = rec(2000, 200), rec(8000, 200), rec(2000, 800)
    assert longer_prompts.prefill_replicas > base.prefill_replicas
    assert longer_outputs.decode_replicas > base.decode_replicas
    assert longer_outputs.prefill_replicas == base.prefill_replicas


async def test_feeds_follow_membership_and_load_streams(redis_client: Any) -> None:
    prefix = f"t{uuid.uuid4().hex[:6]}"
    settings = ModelSettings(profile="test", deployments=["dep"])
    svc = ModelService(settings, windows=NoWindows(), redis=redis_client, prefix=prefix)
    producer = StreamProducer(redis_client)
    inst = common_pb2.Instance(instance_id="p1", deployment="dep", role=common_pb2.ROLE_PREFILL,
                               epoch=1, state=common_pb2.INSTANCE_STATE_STARTING)  # fmt: skip
    members = stream_name(prefix, "membership")
    added = events_pb2.MembershipEvent.KIND_ADDED
    await producer.publish(members, events_pb2.MembershipEvent(kind=added, instance=inst,
                                                               ts_ms=10_000))  # fmt: skip
    inst.state = common_pb2.INSTANCE_STATE_READY
    changed = events_pb2.MembershipEvent.KIND_STATE_CHANGED
    await producer.publish(members, events_pb2.MembershipEvent(kind=changed, instance=inst,
                                                               ts_ms=52_000))  # fmt: skip
    await svc.start()
    try:
        await eventually(lambda: _true(("dep", common_pb2.ROLE_PREFILL) in svc.state.samples))
        snap = events_pb2.LoadSnapshot(deployment="dep", instance_id="d1",
                                       role=common_pb2.ROLE_DECODE, num_running=4,
                                       decode_tokens_per_s=400.0)  # fmt: skip
        await producer.publish(stream_name(prefix, "load", "dep"), snap)
        await eventually(lambda: _true(svc.state.roles.get(("dep", "d1")) is not None))
    finally:
        await svc.stop()
        await svc.stop()  # idempotent
    m = svc.perf_model(telemetry_pb2.GetPerfModelRequest(deployment="dep"), 1).model
    assert m.role == common_pb2.ROLE_PREFILL  # the deployment prefills on prefill instances
    assert (m.startup_s, m.startup_samples) == (42.0, 1)
    decode = svc.state.samples[("dep", common_pb2.ROLE_DECODE)]
    assert list(decode.decode_fallback) == [(4, 0.0, 10.0)]  # 1000 * 4 / 400 ms


async def _true(value: bool) -> bool:
    return value
