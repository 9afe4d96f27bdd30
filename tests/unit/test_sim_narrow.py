"""The simulator's candidate pre-filter (services/sim/narrow.py) changes no decision: the
same run with and without it gives the same results, with it scoring fewer candidates."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from services.common.routing.types import EndpointSnapshot, EndpointView, Pick, RequestView
from services.common.scheduling import EndpointSpec, build_core
from services.sim import SimConfig
from services.sim.narrow import NarrowScheduler
from services.sim.results import summary
from services.sim.run import Simulation
from tests.unit.test_sim_step_model import trace

BASE = SimConfig(engines=48, kv_blocks=4096, rate_scale=3.0)


def run(cfg: SimConfig, narrow: bool) -> tuple[str, list[str], int]:
    """(the summary without wall-clock keys, every request's instance, narrowed cycles)."""
    sim = Simulation(cfg, trace(400), narrow=narrow)
    done = sim.run()
    doc: dict[str, Any] = summary(done, wall_s=1.0, cpu_s=1.0)
    doc.pop("wall")
    cycles = sum(
        c.scheduler.narrowed for c in sim.gw.cores if isinstance(c.scheduler, NarrowScheduler)
    )
    return json.dumps(doc, sort_keys=True), [r.target for r in done.requests], cycles


@pytest.mark.parametrize(
    ("cfg", "narrows"),
    [
        (BASE, True),
        (replace(BASE, engines=96), True),  # the bound pre-filter (services/sim/bound.py)
        (replace(BASE, engines=96, profile="tpot-guard", load_source="stream"), True),
        (replace(BASE, engines=96, precise=True, gateways=2), True),
        (replace(BASE, gateways=2, load_source="stream"), True),
        (replace(BASE, precise=True), True),
        (replace(BASE, profile="prefix-ready"), True),
        (replace(BASE, gateways=2, scrape_queue_estimate=True), True),
        (replace(BASE, profile="least_load"), True),
        (replace(BASE, profile="decode-tpot"), True),
        (replace(BASE, engines=96, profile="decode-tpot", load_source="stream"), True),
        (replace(BASE, profile="power_of_two"), False),  # random picks: never narrowed
        (replace(BASE, profile="cache_aware"), False),  # a plugin outside SAFE
        (SimConfig(prefill=8, decode=24, kv_blocks=4096, rate_scale=3.0), False),  # P/D
    ],
    ids=["default", "bound", "bound-tpot-guard-stream", "bound-precise-two-gateways", "two-gateways-stream", "precise", "prefix-ready",
         "two-gateways-scrape-queue-estimate", "least-load", "decode-tpot",
         "bound-decode-tpot-stream", "power-of-two", "cache-aware",
         "pd"],
)  # fmt: skip
def test_the_pre_filter_keeps_every_decision(cfg: SimConfig, narrows: bool) -> None:
    want_doc, want_targets, none = run(cfg, narrow=False)
    got_doc, got_targets, cycles = run(cfg, narrow=True)
    assert none == 0
    assert (cycles > 0) == narrows
    assert got_targets == want_targets
    assert got_doc == want_doc


def views(n: int) -> EndpointSnapshot:
    """``n`` endpoints with equal load fields (what no scrape tells apart)."""
    return EndpointSnapshot(
        [EndpointView(f"worker-{i}", running=1, kv_usage=0.25) for i in range(n)]
    )


@pytest.mark.parametrize("narrow", [False, True], ids=["whole-fleet", "narrowed"])
def test_an_unanswered_pick_keeps_its_instance_apart(narrow: bool) -> None:
    """ttft-cost's interference prices this gateway's unanswered picks: an instance equal
    to the others in every load field but holding one must not stand for them."""
    core = build_core([EndpointSpec(f"worker-{i}", f"http://w{i}") for i in range(4)])
    sched = NarrowScheduler(core.scheduler) if narrow else core.scheduler
    first = sched.schedule(RequestView("a", 2000, (11, 12), 64, 8), views(4), 0.0, "default")
    again = sched.schedule(RequestView("b", 2000, (21, 22), 64, 8), views(4), 0.0, "default")
    assert isinstance(first, Pick) and isinstance(again, Pick)
    assert first.decode.endpoint.instance_id == "worker-0"
    assert again.decode.endpoint.instance_id == "worker-1"  # worker-0 awaits its answer
