"""`tideserve up`'s engines are a deployment of its autoscaler (local driver), as real
processes:

- `tideserve apply` of the stack's deployment with one more engine (replicas and min_replicas
  2: the stored desired count is clamped into the new [min, max]) adds `engine-2` (on a port
  after the planned ones), the gateway routes to it and serves through it, `status` lists it
  and `down` stops it;
- `up` and then the autoscaler SIGKILLed: the engines outlive both (nothing adopts them), and
  `tideserve down` still finds them through the driver's pid record and stops them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml
from tideserve.v1 import autoscaler_pb2, autoscaler_pb2_grpc

from services.autoscaler.translate import spec_from_proto
from services.common.local.client import cli_security
from services.common.local.procs import is_alive
from services.common.local.state import StackState
from services.common.security.channels import sync_channel
from services.stack.autoscaled import gateway_ready
from services.stack.control import recorded_engines
from tests.helpers.engine_stack import metric_total, start_engine_stack, stream_sse
from tests.helpers.stack import cli, status_json
from tests.helpers.waits import eventually

pytestmark = pytest.mark.e2e


def _address(state: StackState, name: str) -> str:
    entry = next(p for p in state.processes if p.name == name)
    assert entry.grpc_address is not None
    return entry.grpc_address


async def test_apply_adds_an_engine_the_gateway_serves_through(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    with start_engine_stack(
        postgres_url, redis_url, 1, ["--engines", "1", "--engine-speedup", "20"]
    ) as stack:
        state = stack.state()
        autoscaler = _address(state, "autoscaler")
        scheduler = _address(state, "scheduler")
        assert set(stack.engines) == {"engine-1"}
        # the stack is secured: reads need its admin token too
        security = cli_security(autoscaler, stack.state_dir)
        assert security.token is not None
        assert gateway_ready(scheduler, stack.deployment, 5.0, security) == {"engine-1"}

        # the stack's deployment as stored, with one more engine, through the CLI
        with sync_channel(autoscaler, security) as ch:
            got = autoscaler_pb2_grpc.AutoscalerServiceStub(ch).GetDeployment(
                autoscaler_pb2.GetDeploymentRequest(name=stack.deployment), timeout=10
            )
        data = spec_from_proto(got.spec).model_dump(mode="json", exclude={"generation"})
        (role,) = data["roles"]
        assert (role["name"], role["replicas"], role["restart_policy"]) == ("engine", 1, "never")
        # the planner owns a role's count (a changed `replicas` alone keeps the stored
        # desired count, clamped into [min, max]): one more engine = a raised floor
        role["replicas"] = role["min_replicas"] = 2
        state_dir = ["--state-dir", str(stack.state_dir)]  # where the CLI finds the token
        spec_file = tmp_path / "more.yaml"
        spec_file.write_text(yaml.safe_dump(data))
        res = await asyncio.to_thread(
            subprocess.run,
            [*cli(), "apply", "-f", str(spec_file), "--autoscaler", autoscaler, *state_dir],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr

        async def routed() -> bool:
            ids = await asyncio.to_thread(gateway_ready, scheduler, stack.deployment, 5.0, security)
            return ids == {"engine-1", "engine-2"}

        await eventually(routed, within_s=120)
        added = {e.name: e for e in recorded_engines(stack.state())}["engine-2"]
        assert added.url not in {e.url for e in stack.engines.values()}
        assert added.role == "aggregated" and is_alive(added.ref)

        # the gateway serves through the new engine (it computes prompts: its counter moves)
        async with aiohttp.ClientSession() as s:

            async def served_by_new() -> bool:
                outs = await asyncio.gather(
                    *(
                        stream_sse(
                            s,
                            stack.gateway + "/v1/chat/completions",
                            {
                                "model": "tideserve-sim",
                                "messages": [{"role": "user", "content": f"q{i} " * 200}],
                                "max_tokens": 16,
                            },
                        )
                        for i in range(6)
                    )
                )
                assert all(o.status == 200 and o.done and o.error is None for o in outs), outs
                async with s.get(f"{added.url}/metrics") as r:
                    return metric_total(await r.text(), "sglang:prompt_tokens_total") > 0

            await eventually(served_by_new, within_s=60)

        code, report = await asyncio.to_thread(status_json, stack.state_dir)
        assert code == 0, report
        assert {e["name"]: e["health"] for e in report["engines"]} == {
            "engine-1": "SERVING",
            "engine-2": "SERVING",
        }
    assert not is_alive(added.ref)  # `down` stopped the added engine too


def test_down_stops_the_engines_of_a_killed_up_and_autoscaler(
    postgres_url: str, redis_url: str
) -> None:
    with start_engine_stack(
        postgres_url, redis_url, 2, ["--engines", "2", "--engine-speedup", "20"], up_exit=None
    ) as stack:
        state = stack.state()
        stack.up.kill()  # nothing supervises any more ...
        stack.up.wait(30)
        autoscaler = next(p for p in state.processes if p.name == "autoscaler")
        os.kill(autoscaler.pid, signal.SIGKILL)  # ... and nothing can stop the engines

        async def autoscaler_gone() -> bool:
            return not is_alive(autoscaler.ref)

        asyncio.run(eventually(autoscaler_gone, within_s=30))
        assert all(is_alive(e.ref) for e in stack.engines.values())  # orphans, still running
    # start_engine_stack ran `tideserve down` (exit 0) and checked that nothing recorded,
    # engines included, is left running
    assert not any(is_alive(e.ref) for e in stack.engines.values())
