"""Gateway replicas in the simulator share what live replicas share over Redis (routed
prefixes, in-flight counts), through the same pure rules, or (``share_state`` off) nothing."""

from __future__ import annotations

import pytest

from services.common.routing.types import Pick, RequestView
from services.common.scheduling import EndpointSpec
from services.sim import SimConfig, simulate
from services.sim.routing import Gateways
from tests.helpers.sim_traces import trace_of

SPECS = [EndpointSpec(f"e{i}", f"http://e{i}") for i in range(4)]
HASHES = tuple(range(100, 108))


def _picked(gw: Gateways, g: int, rid: str) -> Pick:
    view = RequestView(rid, 8 * 64, HASHES, 64, 16)
    d = gw.cores[g].pick(view, 1.0, rid, "default")
    assert isinstance(d, Pick)
    return d


@pytest.mark.parametrize("share", [True, False], ids=["shared", "not-shared"])
def test_a_pick_reaches_the_other_replica_only_when_shared(share: bool) -> None:
    gw = Gateways(SimConfig(engines=4, gateways=2, share_state=share), SPECS)
    d = _picked(gw, 0, "r0")
    target = d.decode.endpoint.instance_id
    assert gw.routed_prefix(1, HASHES, 1.0, "probe") == {}
    for source, entry in gw.take_shared(1.0):
        gw.deliver(source, entry, 1.005)
    seen = gw.routed_prefix(1, HASHES, 1.01, "probe2")
    assert (seen.get(target, 0) == len(HASHES)) == share
    gw.heartbeat(1.5)
    seen_load = gw.cores[1].fleet.view(target, 1.5)
    assert (seen_load.reserved_requests, seen_load.reserved_tokens > 0) == (
        (1, True) if share else (0, False)
    )


def test_shared_replicas_run_deterministically() -> None:
    cfg = SimConfig(engines=4, gateways=2, max_requests=24, kv_blocks=2048)
    a, _ = simulate(cfg, trace_of(24))
    b, _ = simulate(cfg, trace_of(24))
    assert a["completed"] == 24 and a["sim"]["routing"] == b["sim"]["routing"]
    assert a["ttft_ms"] == b["ttft_ms"]
