"""``tideserve up --engine vllm --model-path DIR``: the whole local stack on two real vLLM
engines, bridges included, as a user with a GPU box would run it (here with the CPU build,
started through ``--engine-command``).

- the autoscaler's local driver runs both engines (engine-1, engine-2) with their kv-bridge
  sidecars; ``up`` reports them READY once every gateway routes to them;
- the gateway serves the model under its served name, tokenized by the model's tokenizer;
- each engine's own KV events reach the stack's Redis under its instance id, and kvmeta
  indexes them: a session's first turn sent to engine-2 past the gateway brings its next turn,
  sent through the gateway with no session header, to engine-2, with the cached tokens the
  gateway predicted equal to vLLM's;
- ``down`` stops the engines and their bridges."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.security.channels import ClientSecurity, aio_channel
from services.common.streams import decode_entry
from services.common.tokens import token_path
from services.scheduler.http.openai import parse_request
from services.stack.secure import load_or_create
from tests.helpers.engine_stack import SERVICES, recorded_engines, request_records
from tests.helpers.ports import free_ports
from tests.helpers.stack import RunningStack, running_stack
from tests.helpers.vllm import BLOCK_SIZE, CPU_ENV, MAX_MODEL_LEN, MODEL_NAME, START_TIMEOUT_S
from tests.helpers.waits import eventually
from tests.real_engines.test_vllm_routing import post, turn

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def stack(
    vllm_py: Path, real_model: Path, postgres_url: str, redis_url: str
) -> Iterator[tuple[RunningStack, dict[str, Any]]]:
    ports = iter(free_ports(8))
    layout: dict[str, Any] = {
        name: {"grpc_port": next(ports), "metrics_port": 0} for name in SERVICES
    }
    deployment = f"rt-{uuid.uuid4().hex[:8]}"  # own KV streams in the shared Redis
    # The gateway asks kvmeta where a prefix is within kvmeta_deadline_ms (20 ms by default)
    # and routes without that answer when it is late, by design. This checks that the
    # engines' KV events drive routing, not that kvmeta answers in 20 ms on a loaded CI
    # machine (where a late answer sent the turn to the other engine), so the wait is long.
    layout["scheduler"].update(
        http_port=next(ports),
        deployment=deployment,
        block_size=BLOCK_SIZE,
        health_interval_s=0.5,
        kvmeta_deadline_ms=5000.0,
    )
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    config = {
        **layout,
        "stack": {
            "engine_ports": [next(ports), next(ports)],
            "engine_start_timeout_s": 2 * START_TIMEOUT_S,
        },
    }
    vllm_args = f"--enforce-eager --max-model-len {MAX_MODEL_LEN} --num-gpu-blocks-override 96"
    flags = [
        "--engine", "vllm", "--model-path", str(real_model), "--model-name", MODEL_NAME,
        "--engines", "2",
        "--engine-command", f"{vllm_py} -m vllm.entrypoints.openai.api_server",
        "--engine-arg", vllm_args,
    ]  # fmt: skip
    with running_stack(
        config,
        flags,
        postgres_url=postgres_url,
        redis_url=redis_url,
        start_timeout_s=2 * START_TIMEOUT_S,
        env=CPU_ENV,
    ) as running:
        yield running, layout
    # down stopped every engine and its bridge (running_stack checks the recorded ones)
    assert "engine-1" in running.out and "engine-2" in running.out


async def _stored_by(redis_url: str, deployment: str) -> set[str]:
    """Instances with a BlockStored batch on the deployment's KV stream."""
    rc = aioredis.Redis.from_url(redis_url)
    try:
        out = set()
        for _id, fields in await rc.xrange(f"ts:kv:{deployment}"):
            batch = decode_entry(fields, events_pb2.KVEventBatch)
            if any(e.kind == events_pb2.KVEvent.KIND_BLOCK_STORED for e in batch.events):
                out.add(batch.instance_id)
        return out
    finally:
        await rc.aclose()


async def _kvmeta_holds(
    running: RunningStack, layout: dict[str, Any], instance: str, hashes: list[int]
) -> int:
    token = load_or_create(running.state_dir).admin_token()
    address = f"127.0.0.1:{layout['kvmeta']['grpc_port']}"
    async with aio_channel(address, ClientSecurity(token=token)) as ch:
        stub: Any = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
        try:
            resp = await stub.MatchPrefix(
                kvmeta_pb2.MatchPrefixRequest(
                    deployment=layout["scheduler"]["deployment"],
                    block_hashes=hashes,
                    candidate_instances=[instance],
                ),
                timeout=5,
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:  # no event of the deployment yet
                return 0
            raise
    return max((m.matched_blocks for m in resp.matches if m.instance_id == instance), default=0)


async def test_up_serves_real_vllm_engines_with_their_kv_events(
    stack: tuple[RunningStack, dict[str, Any]], real_model: Path, redis_url: str
) -> None:
    running, layout = stack
    deployment = layout["scheduler"]["deployment"]
    gateway = f"http://127.0.0.1:{layout['scheduler']['http_port']}"
    engines = {e.name: e for e in recorded_engines(running.state)}
    assert sorted(engines) == ["engine-1", "engine-2"]
    async with aiohttp.ClientSession() as http, http.get(gateway + "/v1/models") as r:
        assert [m["id"] for m in (await r.json())["data"]] == [MODEL_NAME]

    # Turn 1 on engine-2, past the gateway: only engine-2's own events can tell where it is.
    first = await post(str(engines["engine-2"].url), turn(11, 1))
    assert first["usage"]["prompt_tokens"] > 3 * BLOCK_SIZE
    tokens = token_path(str(real_model), "vllm")
    parsed = parse_request(
        "chat", json.dumps(turn(11, 2)).encode(), {}, models=(), classes=(), tokens=tokens
    )
    hashes = tokens.block_hashes(parsed.prompt_ids, BLOCK_SIZE)

    async def indexed() -> bool:
        return await _kvmeta_holds(running, layout, "engine-2", hashes) >= 3

    await eventually(indexed, within_s=60)

    second = await post(gateway, turn(11, 2))
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    (record,) = [
        r for r in await request_records(redis_url, deployment, 1) if r.deployment == deployment
    ]
    assert record.decode_instance == "engine-2", record
    assert cached >= 3 * BLOCK_SIZE
    assert record.predicted_cached_tokens == record.cached_tokens == cached

    # engine-1's bridge publishes under its id too
    await post(str(engines["engine-1"].url), turn(12, 1))

    async def both() -> bool:
        return await _stored_by(redis_url, deployment) == {"engine-1", "engine-2"}

    await eventually(both, within_s=60)
    logs = sorted(p.name for p in (running.state_dir / "logs").glob("*.sidecar0.log"))
    assert logs == ["engine-1.sidecar0.log", "engine-2.sidecar0.log"]
