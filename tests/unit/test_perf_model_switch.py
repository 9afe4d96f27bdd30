"""The gateway side of the fitted performance model: the switch rule, the predicted-TTFT
plugins repricing when it switches, the GetPerfModel feed, and the engine load at pick in
the request record."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from tideserve.v1 import events_pb2, telemetry_pb2

from services.common.perfcoef import Coefficients, from_pb
from services.common.routing.registry import REGISTRY, PluginEnv
from services.common.routing.types import Choice, Pick
from services.scheduler.core.perf_switch import PerfModelSwitch
from services.scheduler.core.records import fill_decision
from services.scheduler.feeds.perf_model import PerfModelFeed
from tests.helpers.waits import eventually
from tests.unit._routing_helpers import LinearModel, ctx, ep, req

# The fleet is twice as slow as LinearModel (0.1 ms/token) says: 0.2 ms per token.
SLOW = Coefficients(0.0, 0.2, 0.0, 1.0, 0.01, 0.01, 0.2, 1.0)


@pytest.mark.parametrize(
    ("offers", "source", "version"),
    [
        ([(SLOW, 0.4)], "profile", 0),
        ([(SLOW, 0.5)], "fitted", 1),
        ([(SLOW, 0.9), (SLOW, 0.95)], "fitted", 1),  # same model: no change
        ([(SLOW, 0.9), (SLOW, 0.1)], "profile", 2),  # confidence fell: back to the profile
        ([(SLOW, 0.9), (None, 0.0)], "profile", 2),
    ],
    ids=["below", "at-threshold", "unchanged", "fell-back", "gone"],
)
def test_switch_rule(offers: list[tuple[Coefficients | None, float]], source: str,
                     version: int) -> None:  # fmt: skip
    sw = PerfModelSwitch(LinearModel(), min_confidence=0.5)
    for coef, conf in offers:
        sw.offer(coef, conf)
    assert (sw.source, sw.version) == (source, version)
    assert sw.prefill_ms(1000) == pytest.approx(200.0 if source == "fitted" else 100.0)


# What a fit on short, mostly cached prompts can give without bounds: the quadratic term
# negative, 0 ms at 2,000 tokens and less beyond (the chaos suite's 500s, before the bound).
NEGATIVE_N2 = Coefficients(2.0, 0.001, -1e-6, 1.0, 0.01, 0.01, 0.2, 1.0)


@pytest.mark.parametrize(
    ("coef", "usable"),
    [
        (SLOW, True),
        (NEGATIVE_N2, False),
        (Coefficients(5.0, -0.001, 0.0, 1.0, 0.01, 0.01, 0.2, 1.0), False),
        (Coefficients(-1.0, 0.1, 0.0, 1.0, 0.01, 0.01, 0.2, 1.0), False),
        (Coefficients(0.0, 0.0, 0.0, 1.0, 0.01, 0.01, 0.2, 1.0), False),
        (Coefficients(3.0, 0.0, 0.0, 1.0, 0.01, 0.01, 0.2, 1.0), True),  # flat, but > 0
    ],
    ids=["fine", "negative-n2", "negative-per-token", "negative-base", "all-zero", "flat"],
)
def test_a_fit_that_is_not_a_model_of_prefill_is_refused(coef: Coefficients,
                                                         usable: bool) -> None:  # fmt: skip
    sw = PerfModelSwitch(LinearModel(), min_confidence=0.5)
    assert sw.offer(coef, 0.99) is usable
    assert sw.source == ("fitted" if usable else "profile")
    assert all(sw.prefill_ms(n) > 0 for n in (1, 4096, 131_072))


@pytest.mark.parametrize("plugin", ["ttft-cost", "pd-decider"])
def test_plugins_survive_a_model_that_prices_a_chunk_at_zero(plugin: str) -> None:
    """Defence in depth behind the switch's rule: a model that says 0 ms (a custom one)
    makes the plugins price it as very fast, on every pick, instead of raising."""

    class Zero:
        version = 1

        def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
            return 0.0 if self.version > 1 else 0.1 * uncached_tokens

    model = Zero()
    env = PluginEnv(perf_profile=lambda name: model, block_size=4)
    spec = REGISTRY[plugin]
    p: Any = spec.factory(plugin, spec.params.model_validate({}), env)
    model.version = 2
    for _ in range(2):
        if plugin == "pd-decider":
            assert p.tps > 1e9
        else:
            c = ctx()
            p.prepare(c, req(prompt_tokens=1000), [ep("a", pending_prefill_tokens=10_000)])
            assert c.predicted_ttft_ms["a"] == pytest.approx(0.0, abs=0.01)


@pytest.mark.parametrize("plugin", ["ttft-cost", "pd-decider"])
def test_plugins_reprice_when_the_fit_passes_the_confidence(plugin: str) -> None:
    sw = PerfModelSwitch(LinearModel(), min_confidence=0.5)
    env = PluginEnv(perf_profile=lambda name: sw, block_size=4)
    spec = REGISTRY[plugin]
    p: Any = spec.factory(plugin, spec.params.model_validate({}), env)
    e = ep("a", pending_prefill_tokens=10_000)

    def predicted() -> float:
        if plugin == "pd-decider":
            return float(1000.0 * 10_000 / p.tps)
        c = ctx()
        p.prepare(c, req(prompt_tokens=1000), [e])
        return float(c.predicted_ttft_ms["a"])

    before = predicted()  # 10k queued at 10k tok/s + 1000 tokens at 0.1 ms
    sw.offer(SLOW, 0.3)
    assert predicted() == before
    sw.offer(SLOW, 0.8)
    assert predicted() == pytest.approx(2 * before)


class FakeChannel:
    """A grpc.aio channel whose GetPerfModel answers from a list (an exception = error)."""

    def __init__(self, answers: list[telemetry_pb2.PerfModel | Exception]) -> None:
        self.answers = answers
        self.requests: list[telemetry_pb2.GetPerfModelRequest] = []

    closed = False

    async def close(self) -> None:
        self.closed = True

    def unary_unary(self, method: str, **_: Any) -> Any:
        assert method == "/tideserve.v1.TelemetryService/GetPerfModel"

        async def call(req: telemetry_pb2.GetPerfModelRequest, **_kw: Any) -> Any:
            self.requests.append(req)
            a = self.answers.pop(0)
            if isinstance(a, Exception):
                raise a
            return telemetry_pb2.GetPerfModelResponse(model=a)

        return call


def _pb(conf: float) -> telemetry_pb2.PerfModel:
    return telemetry_pb2.PerfModel(
        prefill_ms_per_token=0.2, decode_base_ms=1.0, prefill_confidence=conf, samples=500
    )


async def test_feed_offers_each_answer_and_survives_errors() -> None:
    err = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                               grpc.aio.Metadata(), "down")  # fmt: skip
    chan = FakeChannel([_pb(0.2), err, _pb(0.9), _pb(0.9)])
    sw = PerfModelSwitch(LinearModel(), min_confidence=0.5)
    opened: list[str] = []

    def channel(address: str) -> Any:
        opened.append(address)
        return chan

    feed = PerfModelFeed("telemetry:1", sw, deployment="d", interval_s=1.0, channel=channel)
    changed = [await feed.refresh_once() for _ in range(4)]
    assert opened == ["telemetry:1"]  # opened once, on first use
    assert changed == [False, False, True, False]
    assert feed.stats == {"refreshed": 3, "switched": 1, "errors": 1, "implausible": 0}
    assert sw.fitted == from_pb(_pb(0.9)) and sw.source == "fitted"
    assert {r.deployment for r in chan.requests} == {"d"}
    await feed.stop()
    assert chan.closed


async def test_feed_counts_confident_fits_that_are_not_models_of_prefill() -> None:
    bad = telemetry_pb2.PerfModel(prefill_base_ms=2.0, prefill_ms_per_token=0.001,
                                  prefill_ms_per_token2=-1e-6, prefill_confidence=0.9)  # fmt: skip
    chan = FakeChannel([bad, bad, _pb(0.9)])
    sw = PerfModelSwitch(LinearModel(), min_confidence=0.5)
    feed = PerfModelFeed("t:1", sw, deployment="d", interval_s=1.0, channel=lambda _a: chan)
    assert [await feed.refresh_once() for _ in range(3)] == [False, False, True]
    assert (feed.stats["implausible"], sw.source) == (2, "fitted")
    await feed.stop()


async def test_feed_started_outside_a_loop_opens_its_channel_inside() -> None:
    """The CLI builds the Scheduler before its event loop runs: the feed's channel must be
    made in the loop that uses it."""
    loop = asyncio.get_running_loop()
    chan = FakeChannel([_pb(0.9)])
    made_in: list[asyncio.AbstractEventLoop] = []

    def channel(address: str) -> Any:
        made_in.append(asyncio.get_running_loop())
        return chan

    feed = PerfModelFeed("t:1", PerfModelSwitch(LinearModel(), 0.5), deployment="d",
                         interval_s=60.0, channel=channel)  # fmt: skip
    feed.start()
    await eventually(lambda: _done(feed.stats["refreshed"] == 1))
    await feed.stop()
    assert made_in == [loop]


async def _done(value: bool) -> bool:
    return value


@pytest.mark.parametrize(
    ("disaggregated", "pending"),
    [(False, 300 + 50), (True, 7000 + 0)],
    ids=["aggregated", "disaggregated"],
)
def test_record_carries_the_engine_load_at_pick(disaggregated: bool, pending: int) -> None:
    decode = ep("d1", pending_prefill_tokens=300, reserved_tokens=50, running=12,
                tokens_in_flight=4000)  # fmt: skip
    prefill = ep("p1", pending_prefill_tokens=7000, running=2)
    pick = Pick(
        decode=Choice(decode, 1.0),
        prefill=Choice(prefill, 1.0) if disaggregated else None,
        profile="default",
    )
    rec = events_pb2.RequestRecord()
    fill_decision(rec, pick)
    assert (rec.engine_pending_prefill_tokens, rec.engine_running, rec.engine_tokens_in_flight) == (
        pending, 12, 4000,
    )  # fmt: skip


@pytest.mark.parametrize("telemetry", ["127.0.0.1:9", ""], ids=["telemetry-on", "off"])
def test_gateway_plugins_price_with_the_switch_when_telemetry_is_set(telemetry: str) -> None:
    from services.common.routing.plugins.cost import TTFTCost
    from services.common.routing.plugins.pd import PDDecider
    from services.common.routing.plugins.pd_price import PDPrice
    from services.scheduler.compose import Scheduler
    from services.scheduler.settings import SchedulerSettings

    settings = SchedulerSettings(endpoints=["http://127.0.0.1:1"], telemetry_address=telemetry)
    sch = Scheduler(settings)
    priced = [
        x
        for prof in sch.core.scheduler.profiles.values()
        for x in [*prof.preparers, *(p for p, _ in prof.scorers), prof.decider]
        if isinstance(x, TTFTCost | PDDecider | PDPrice)
    ]
    assert priced  # the shipped profiles use ttft-cost and a P/D decider
    if telemetry:
        assert sch.perf_model is not None and sch.perf_feed is not None
        assert all(x.model is sch.perf_model for x in priced)
    else:
        assert sch.perf_model is None and sch.perf_feed is None
        assert not any(isinstance(x.model, PerfModelSwitch) for x in priced)


class _DecodingProfile(LinearModel):
    kv_capacity_tokens = 50_000

    def decode_step_ms(self, batch: int, context_tokens: int) -> float:
        return 5.0 + batch

    def transfer_ms(self, tokens: int) -> float:
        return 2.0 + 0.001 * tokens


@pytest.mark.parametrize(
    ("static", "fitted", "step_ms", "kv_capacity", "xfer_ms"),
    [
        (_DecodingProfile(), None, 9.0, 50_000, 3.0),  # the profile's 5 + 4
        (_DecodingProfile(), SLOW, 1.0 + 0.04 + 0.01 * 1000 / 1000, 50_000, 3.0),  # the fit's
        (LinearModel(), None, 0.0, 0, 0.0),  # a static model that prices no decode
    ],
    ids=["profile", "fitted", "no-decode-model"],
)
def test_switch_prices_decode_steps(
    static: Any, fitted: Coefficients | None, step_ms: float, kv_capacity: int, xfer_ms: float
) -> None:
    s = PerfModelSwitch(static, 0.5)
    s.offer(fitted, 1.0)
    assert s.decode_step_ms(4, 1000) == pytest.approx(step_ms)
    assert s.kv_capacity_tokens == kv_capacity
    assert s.transfer_ms(1000) == pytest.approx(xfer_ms)  # the link is the static model's
