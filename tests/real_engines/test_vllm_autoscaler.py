"""The autoscaler's local driver runs a deployment of real vLLM engines, each instance with
its kv-bridge as a sidecar, and scales it 1 -> 2 -> 1 under load: the new engine's KV events
reach the index under its instance id, the victim is drained before it stops, and no request
is lost."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis
from tideserve.v1 import events_pb2

from services.common.planner.driver_base import Role, RoleTarget
from services.common.streams import decode_entry
from tests.helpers.autoscale import ClosedLoop, Rig, autoscaled_gateway
from tests.helpers.kvmeta import serve_kvmeta
from tests.helpers.vllm import BLOCK_SIZE, CPU_ENV, MAX_MODEL_LEN, MODEL_NAME, START_TIMEOUT_S
from tests.helpers.waits import eventually

# the scale-out starts an engine while another one serves the load, on 2 cores
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

# a shared system-prompt-like start of every request: full 128-token blocks, so engines store
# (and their bridges publish) blocks
PREAMBLE = " ".join(f"rule{i} agents read code and call tools" for i in range(60))


def vllm_role(python: Path, model: Path, redis_url: str, prefix: str) -> RoleTarget:
    """A worker role of vLLM processes; the KV events on ipc paths in the instance's own
    state directory (``{{``/``}}``: literal braces of the JSON, not placeholders)."""
    events = json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "ipc://{state_dir}/kv",
            "replay_endpoint": "ipc://{state_dir}/kv-replay",
            "topic": "kv",
        }
    )
    events = events.replace("{", "{{").replace("}", "}}")
    events = events.replace("{{state_dir}}", "{state_dir}")
    bridge = (
        sys.executable, "-m", "services.cli", "kv-bridge", "--engine", "vllm",
        "--endpoint", "ipc://{state_dir}/kv", "--replay-endpoint", "ipc://{state_dir}/kv-replay",
        "--topic", "kv", "--deployment", "{deployment}", "--instance-id", "{instance_id}",
        "--redis-url", redis_url, "--stream-prefix", prefix,
    )  # fmt: skip
    return RoleTarget(
        deployment="",
        name="worker",
        role=Role.WORKER,
        replicas=1,
        engine_kind="vllm",
        command=(
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--enforce-eager",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--enable-prompt-tokens-details",
            "--num-gpu-blocks-override",
            "64",
            "--kv-events-config",
            events,
        ),
        env=CPU_ENV,
        startup_timeout_s=2 * START_TIMEOUT_S,
        sidecars=(bridge,),
    )


async def test_scale_vllm_1_2_1_with_bridges_loses_nothing(
    vllm_py: Path, real_model: Path, redis_url: str, tmp_path: Path
) -> None:
    prefix = f"rtas{uuid.uuid4().hex[:8]}"
    redis = aioredis.Redis.from_url(redis_url)
    role = vllm_role(vllm_py, real_model, redis_url, prefix)
    try:
        async with (
            serve_kvmeta(redis, prefix) as (kvmeta, _),
            autoscaled_gateway(
                redis_url,
                tmp_path,
                prefix=prefix,
                role=role,
                stop_grace_s=30.0,
                models=[MODEL_NAME],
                model_path=real_model,
                hash_scheme="vllm",
                block_size=BLOCK_SIZE,
                kvmeta_address=kvmeta,
            ) as rig,
        ):

            async def serving(n: int) -> bool:
                status = rig.reconciler.status(rig.deployment)
                return len(await rig.serving()) == n and status is not None and status.converged

            rig.reconciler.apply(rig.target(1, "real engines: start"))
            await eventually(lambda: serving(1), within_s=START_TIMEOUT_S)
            (first,) = await rig.serving()
            load = ClosedLoop(
                rig.gateway, clients=2, max_tokens=16, model=MODEL_NAME, preamble=PREAMBLE
            )
            load.start()
            await eventually(lambda: _answered(load, 6), within_s=120)

            rig.reconciler.apply(rig.target(2, "real engines: scale-out"))
            await eventually(lambda: serving(2), within_s=2 * START_TIMEOUT_S)
            (second,) = await rig.serving() - {first}
            # the new engine's own events, through its sidecar bridge, under its id (sent
            # past the gateway, which keeps the shared prefix on the first engine)
            url = {i.instance_id: i.endpoint for i in rig.driver.instances(rig.deployment)}
            await _chat(url[second], PREAMBLE + "directly")
            await eventually(lambda: _indexed(rig, second), within_s=120)

            rig.reconciler.apply(rig.target(1, "real engines: scale-in"), {"worker": [first]})
            await eventually(lambda: serving(1), within_s=120)
            await eventually(lambda: _gone(rig, 1), within_s=120)
            await load.stop()
            sidecar_logs = sorted(p.name for p in (tmp_path / "engines" / "logs").glob("*.log"))
    finally:
        await redis.aclose()

    assert load.sent == len(load.outcomes) > 6
    assert load.failures() == []
    drains = dict(rig.drainer.results)
    assert set(drains) == {first} and drains[first].drained, drains
    assert f"{first}.sidecar0.log" in sidecar_logs and f"{second}.sidecar0.log" in sidecar_logs


async def _chat(url: str, text: str) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()


async def _answered(load: ClosedLoop, n: int) -> bool:
    return len(load.outcomes) >= n


async def _gone(rig: Rig, n: int) -> bool:
    return len(rig.reconciler.instances(rig.deployment)) == n


async def _indexed(rig: Rig, instance: str) -> bool:
    """A stored block of ``instance`` is on the deployment's KV stream."""
    for _id, fields in await rig.redis.xrange(f"{rig.prefix}:kv:{rig.deployment}"):
        batch = decode_entry(fields, events_pb2.KVEventBatch)
        if batch.instance_id == instance and any(
            e.kind == events_pb2.KVEvent.KIND_BLOCK_STORED for e in batch.events
        ):
            return True
    return False
