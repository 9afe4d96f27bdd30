"""Gateway Prometheus metrics over HTTP: the gateway's own ``/metrics`` and the service's
``metrics_port`` (one registry passed down from ``main``, not the global default), in front
of an in-process simulated engine (free ports, no Redis); configured tenants over gRPC."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from tideserve.v1 import scheduler_pb2

from services.common.scheduling import EndpointSpec, build_core
from services.scheduler.grpc.servicer import SchedulerServicer
from services.scheduler.settings import SchedulerSettings
from services.scheduler.slo import DEFAULT_SLO_CLASSES, queue_config
from tests.helpers.engines import EngineFleet
from tests.helpers.ports import free_ports
from tests.helpers.scheduler import scheduler_service, scheduler_stub


@pytest.fixture
async def engine_url(tmp_path: Path) -> AsyncIterator[str]:
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    _, url = await fleet.start()
    yield url
    await fleet.close()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(**kw: Any) -> dict[str, Any]:
    return {
        "model": "tideserve-sim",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        **kw,
    }


async def test_service_metrics_on_gateway_port_and_metrics_port(
    engine_url: str, tmp_path: Path
) -> None:
    http_port, metrics_port = free_ports(2)
    settings = SchedulerSettings(
        grpc_port=0,
        http_port=http_port,
        metrics_port=metrics_port,
        endpoints=[engine_url],
        block_size=16,
        perf_profile="test",
        max_body_bytes=4096,
        tenants={"acme": 2.0},
        state_dir=tmp_path,
    )
    base = f"http://127.0.0.1:{http_port}"
    hdr = {"X-Tideserve-Tenant": "acme", "X-Tideserve-Class": "interactive"}
    bad: list[tuple[bytes, dict[str, str], int]] = [
        (b"{nope", hdr, 400),
        (json.dumps(chat(max_tokens=-3)).encode(), hdr, 400),
        (json.dumps(chat()).encode(), {**hdr, "X-Tideserve-Class": "gold"}, 400),
        (json.dumps(chat()).encode(), {"X-Tideserve-Tenant": "evil"}, 400),
        (json.dumps(chat(pad="x" * 8000)).encode(), hdr, 413),
    ]
    async with (
        scheduler_service(settings),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        for _ in range(50):  # the engine's models are learnt by the first load poll
            async with http.get(base + "/v1/models") as r:
                if (await r.json())["data"]:
                    break
            await asyncio.sleep(0.05)
        async with http.post(base + "/v1/chat/completions", json=chat(), headers=hdr) as r:
            assert r.status == 200, await r.text()
        async with http.post(
            base + "/v1/chat/completions", json=chat(stream=True), headers=hdr
        ) as r:
            assert r.status == 200
            await r.read()
        for body, headers, status in bad:
            async with http.post(
                base + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json", **headers},
            ) as r:
                err = await r.json()
                assert r.status == status, err
                assert set(err["error"]) == {"message", "type", "param", "code"}
        async with http.get(base + "/metrics") as r:
            assert r.status == 200
            on_http = _samples(await r.text())
        async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            assert r.status == 200
            on_port = _samples(await r.text())
    route = "/v1/chat/completions"
    for s in (on_http, on_port):
        req = "tideserve_gateway_requests_total"
        assert _get(s, req, route=route, outcome="ok", status="200") == 2
        assert _get(s, req, route=route, outcome="client_error", status="400") == 4
        assert _get(s, req, route=route, outcome="client_error", status="413") == 1
        bad_n = "tideserve_gateway_bad_requests_total"
        assert _get(s, bad_n, reason="invalid_json", param="") == 1
        assert _get(s, bad_n, reason="invalid_value", param="max_tokens") == 1
        assert _get(s, bad_n, reason="invalid_value", param="slo_class") == 1
        assert _get(s, bad_n, reason="invalid_value", param="tenant") == 1
        assert _get(s, bad_n, reason="body_too_large", param="") == 1
        assert _get(s, "tideserve_gateway_ttft_seconds_count", slo_class="interactive") == 2
        assert _get(s, "tideserve_gateway_e2e_seconds_count", slo_class="interactive") == 2
        assert _get(s, "tideserve_gateway_tpot_seconds_count", slo_class="interactive") == 1
        assert _get(s, "tideserve_gateway_queue_depth", slo_class="batch") == 0
        iid = engine_url.removeprefix("http://")
        assert _get(s, "tideserve_gateway_endpoint_healthy", instance=iid) == 1
        assert _get(s, "tideserve_gateway_endpoint_circuit", instance=iid, state="closed") == 1
    # the service's registry is its own: nothing of the gateway in the process-global one
    assert REGISTRY.get_sample_value("tideserve_gateway_retries_total") is None


@pytest.mark.parametrize(
    ("tenant", "code"),
    [
        ("acme", grpc.StatusCode.OK),
        ("evil", grpc.StatusCode.NOT_FOUND),
        ("", grpc.StatusCode.NOT_FOUND),
    ],
    ids=["known", "unknown", "missing"],
)
async def test_grpc_pick_refuses_unknown_tenants_when_configured(
    tenant: str, code: grpc.StatusCode
) -> None:
    core = build_core(
        [EndpointSpec("w1", "http://127.0.0.1:1", deployment="d")],
        perf_profile="test",
        queue=queue_config(DEFAULT_SLO_CLASSES, default_class="agent", tenants={"acme": 1.0}),
    )
    async with scheduler_stub(SchedulerServicer(core, deployment="d", block_size=16)) as stub:
        req = scheduler_pb2.PickRequest(deployment="d", prompt_text="a b c", tenant=tenant)
        try:
            await stub.Pick(req)
            got = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as e:
            got = e.code()
    assert got == code
