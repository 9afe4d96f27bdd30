"""The chaos suite: the local stack (``tideserve up``, simulated engines) under steady
streaming load while services are kill -9ed (and restarted by ``up``), an engine is killed,
and, for the degraded modes, kvmeta and telemetry hang (SIGSTOP), Redis is stopped and
Postgres hangs, each until the load has made progress without it, then comes back.

Invariants asserted (correctness only, never timing): no accepted request is lost (each
completed, or was retried until it did: see tests/chaos/load.py), every answer is a
response or a well-formed error, the stack survives (``down`` stops it cleanly), and after
each fault the stack recovers: every service SERVING again, the gateway's fleet view lists
exactly the live engines as healthy, kvmeta's index lists every live engine that served a
request, none of them stale, and a fresh request completes. The time to recover from each
fault is measured and reported in the JSON summary (printed, and written to
``$TIDESERVE_CHAOS_REPORT`` when set).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil
import pytest
from tideserve.v1 import kvmeta_pb2, kvmeta_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc

from services.common.embedded import EmbeddedPostgres, EmbeddedRedis, start_postgres, start_redis
from services.common.local.procs import is_alive
from services.common.local.state import ProcEntry, read_state
from services.stack.control import recorded_engines
from services.stack.health import Health, check_grpc_health
from services.stack.settings import StackSettings
from tests.chaos.load import Load
from tests.chaos.profiles import SERVICES, Profile
from tests.chaos.proxy import CuttableProxy
from tests.helpers.ports import free_ports
from tests.helpers.stack import RunningStack, running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

RECOVERY_BOUND_S = 120.0  # a fault not recovered from by then is a failure (not a timing test)


def _config(profile: Profile, deployment: str) -> dict[str, Any]:
    ports = iter(free_ports(10 + profile.engines))
    layout: dict[str, Any] = {s: {"grpc_port": next(ports), "metrics_port": 0} for s in SERVICES}
    # one address for two gateway replicas: the stack's and the one the test cuts off Redis
    layout["scheduler"].update(
        http_port=next(ports),
        deployment=deployment,
        health_interval_s=0.5,
        http_reuse_port=True,
        share_state=True,
    )
    layout["cut_replica_grpc_port"] = next(ports)
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    layout["stack"] = {
        "engine_ports": [next(ports) for _ in range(profile.engines)],
        "service_restarts": 20,
    }
    if "secure" in StackSettings.model_fields:
        # Reliability, not access control: the suite reads the fleet view and the KV index
        # over plain gRPC (the secured stack's own tests cover tokens and TLS).
        layout["stack"]["secure"] = False
    return layout


class CutReplica:
    """A second gateway replica on the stack's HTTP address (SO_REUSEPORT, shared state),
    started by the test as the stack starts its own, but reaching Redis through a proxy the
    test can cut: a gateway partitioned from Redis while the rest of the stack is not."""

    def __init__(self, root: Path, redis_port: int, grpc_port: int) -> None:
        self.proxy = CuttableProxy("127.0.0.1", redis_port)
        self.grpc_port = grpc_port
        self.log = root / "scheduler-cut.log"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, model: ProcEntry) -> None:
        """Run it like ``model`` (the stack's scheduler): same command line and environment
        but its own gRPC port, no metrics port, its replica id and the proxy's Redis URL."""
        self._spawn(model, await self.proxy.start())

    def _spawn(self, model: ProcEntry, port: int) -> None:
        src = psutil.Process(model.pid)
        argv = src.cmdline()
        argv[argv.index("--grpc-port") + 1] = str(self.grpc_port)
        env = src.environ() | {
            "TIDESERVE_GRPC_PORT": str(self.grpc_port),
            "TIDESERVE_METRICS_PORT": "0",
            "TIDESERVE_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "TIDESERVE_SCHEDULER__REPLICA_ID": "scheduler-cut",
        }
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


@dataclass
class Infra:
    """The Postgres and Redis the stack uses, owned by the test so it can restart them."""

    root: Path
    redis: EmbeddedRedis
    postgres: EmbeddedPostgres

    async def stop_redis(self) -> None:
        await asyncio.to_thread(self.redis.stop)

    async def start_redis(self, port: int) -> None:
        self.redis = await asyncio.to_thread(start_redis, self.root / "redis", port)

    def postgres_processes(self) -> list[psutil.Process]:
        main = psutil.Process(self.postgres.pid)
        return [main, *main.children(recursive=True)]

    async def restart_postgres(self) -> None:
        await asyncio.to_thread(self.postgres.restart)


class Chaos:
    def __init__(
        self,
        stack: RunningStack,
        config: dict[str, Any],
        dep: str,
        infra: Infra,
        replica: CutReplica,
    ):
        self.stack = stack
        self.replica = replica
        self.config = config
        self.dep = dep
        self.infra = infra
        self.base = f"http://127.0.0.1:{config['scheduler']['http_port']}"
        self.probe = Load(self.base, workers=0, give_up_s=5.0)
        self.dead_engines: set[str] = set()

    def _address(self, service: str) -> str:
        return f"127.0.0.1:{self.config[service]['grpc_port']}"

    def _state_entry(self, name: str) -> ProcEntry:
        state = read_state(self.stack.state_dir)
        assert state is not None
        return next(p for p in state.processes if p.name == name)

    async def served(self, http: aiohttp.ClientSession) -> set[str]:
        """Live engines that have served at least one request (their own request counter)."""
        out = set()
        for e in self.live_engines():
            async with http.get(f"{e.url}/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith("sglang:num_requests_total") and float(line.split()[-1]) > 0:
                    out.add(e.name)
        return out

    def live_engines(self) -> list[ProcEntry]:
        state = read_state(self.stack.state_dir)
        assert state is not None
        return [e for e in recorded_engines(state) if is_alive(e.ref)]

    async def inject(self, fault: str) -> tuple[str, Callable[[], Awaitable[None]] | None]:
        """Inject ``fault``; returns what was done, for the report, and for a degraded mode
        how to end it."""
        if fault.startswith("hang:"):
            name = fault.split(":", 1)[1]
            pid = self.infra.redis.pid if name == "redis" else self._state_entry(name).pid
            os.kill(pid, signal.SIGSTOP)

            async def resume() -> None:
                os.kill(pid, signal.SIGCONT)

            return f"{name} hung (SIGSTOP)", resume
        if fault == "cut:gateway":
            await self.replica.proxy.cut()
            return "gateway replica cut off from Redis", self._restore_proxy
        if fault == "down:redis":
            port = self.infra.redis.port
            await self.infra.stop_redis()
            return "Redis stopped", lambda: self.infra.start_redis(port)
        if fault == "down:postgres":
            procs = self.infra.postgres_processes()
            for p in procs:
                p.suspend()

            async def resume_and_restart() -> None:
                for p in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.resume()
                await self.infra.restart_postgres()

            return "Postgres hung (SIGSTOP), then restarted", resume_and_restart
        return await self._kill(fault), None

    async def _restore_proxy(self) -> None:
        await self.replica.proxy.start()

    async def _kill(self, fault: str) -> str:
        if fault.startswith("kill:"):
            entry = self._state_entry(fault.split(":", 1)[1])
            os.kill(entry.pid, signal.SIGKILL)
            return f"kill -9 {entry.name} (pid {entry.pid})"
        if fault == "kill-engine":
            victim = self.live_engines()[0]
            os.kill(victim.pid, signal.SIGKILL)
            self.dead_engines.add(victim.name)
            return f"kill -9 {victim.name} (pid {victim.pid})"
        raise AssertionError(f"unknown fault {fault}")

    async def missing(self, http: aiohttp.ClientSession, kv: bool = True) -> str | None:
        """What is not yet recovered (None: everything is); ``kv``: kvmeta's index too (it
        knows a deployment once its engines have published KV events)."""
        for service in SERVICES:
            entry = self._state_entry(service)
            if not is_alive(entry.ref):
                return f"{service} not running"
            health = await asyncio.to_thread(check_grpc_health, self._address(service), "", 2.0)
            if health is not Health.SERVING:
                return f"{service} {health.value}"
        cut = f"127.0.0.1:{self.replica.grpc_port}"
        health = await asyncio.to_thread(check_grpc_health, cut, "", 2.0)
        if health is not Health.SERVING:
            return f"scheduler-cut {health.value}"
        live = {e.name for e in self.live_engines()}
        for name, address in (("scheduler", self._address("scheduler")), ("scheduler-cut", cut)):
            async with grpc.aio.insecure_channel(address) as ch:
                resp = await scheduler_pb2_grpc.SchedulerServiceStub(ch).ListEndpoints(
                    scheduler_pb2.ListEndpointsRequest(deployment=self.dep), timeout=5
                )
            healthy = {e.instance.instance_id for e in resp.endpoints if e.healthy}
            if healthy != live:
                return f"{name}'s fleet view: healthy {sorted(healthy)}, live {sorted(live)}"
        if not kv:
            return None
        async with grpc.aio.insecure_channel(self._address("kvmeta")) as ch:
            idx = await kvmeta_pb2_grpc.KVMetaServiceStub(ch).ListIndexedInstances(
                kvmeta_pb2.ListIndexedInstancesRequest(deployment=self.dep), timeout=5
            )
        # Only engines that stored blocks are indexed: a cache-aware gateway may keep the
        # load's two prefixes on one engine (seen: 11,376 requests on one, none on the other),
        # and an engine that served nothing is rightly not listed. Every live engine that
        # served a request must be listed and fresh again.
        fresh = {i.instance_id for i in idx.instances if not i.stale}
        stale = {i.instance_id for i in idx.instances if i.stale} & live
        served = await self.served(http)
        if stale or not served <= fresh or not fresh & live:
            return (
                f"KV index: stale {sorted(stale)}, fresh {sorted(fresh)}, "
                f"engines that served requests {sorted(served)}, live {sorted(live)}"
            )
        # several blocks of the engines' block size: a probe always stores some
        prompt = " ".join(f"probe{uuid.uuid4().hex[:6]}w{i}" for i in range(200))
        if await self.probe.request(http, prompt) != "ok":
            return "a probe request did not complete"
        return None

    async def recover(self, since: float, kv: bool = True) -> tuple[float, str]:
        """Wait (bounded) until nothing is missing; the seconds since ``since``, and the last
        thing that was missing."""
        last = "nothing"
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                try:
                    why = await self.missing(http, kv)
                except grpc.aio.AioRpcError as exc:
                    why = f"{exc.code().name}: {exc.details()}"
                except OSError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                if why is None:
                    return time.monotonic() - since, last
                last = why
                if time.monotonic() - since > RECOVERY_BOUND_S:
                    raise AssertionError(f"not recovered after {RECOVERY_BOUND_S:g}s: {why}")
                await asyncio.sleep(0.1)


async def _until(
    pred: Callable[[], bool], what: str = "", within_s: float = RECOVERY_BOUND_S
) -> None:
    deadline = time.monotonic() + within_s
    while not pred():
        assert time.monotonic() < deadline, f"the load made no progress {what}".strip()
        await asyncio.sleep(0.05)


async def _progress(load: Load, since: float, n: int, hold_s: float, what: str) -> None:
    """Until ``n`` requests sent after ``since`` completed, and ``hold_s`` passed."""
    hold = since + hold_s
    await _until(lambda: load.report.completed_since(since) >= n and time.monotonic() >= hold, what)


async def _fault(chaos: Chaos, load: Load, profile: Profile, fault: str) -> dict[str, Any]:
    t0 = time.monotonic()
    what, heal = await chaos.inject(fault)
    row: dict[str, Any] = {"fault": what}
    if heal is not None:
        # the degraded mode: requests sent while it lasts must complete without what is down
        try:
            await _progress(load, t0, 2 * profile.workers, profile.down_s, f"while {what}")
        finally:
            row["completed_while_down"] = load.report.completed_since(t0)
            row["down_s"] = round(time.monotonic() - t0, 2)
            await heal()
        t0 = time.monotonic()
    recovery_s, last_missing = await chaos.recover(t0)
    row.update(recovery_s=round(recovery_s, 2), last_missing=last_missing)
    return row


async def _run(chaos: Chaos, profile: Profile) -> dict[str, Any]:
    await chaos.replica.start(chaos._state_entry("scheduler"))
    await chaos.recover(time.monotonic(), kv=False)  # the second replica serves, sees the fleet
    load = Load(chaos.base, workers=profile.workers)
    load.start()
    faults: list[dict[str, Any]] = []
    try:
        await _progress(load, 0.0, profile.workers, 0.0, "before the first fault")
        for fault in profile.faults:
            faults.append(await _fault(chaos, load, profile, fault))
            now = time.monotonic()
            await _progress(load, now, profile.workers, profile.settle_s, f"after {fault}")
    finally:
        report = await load.stop()
    return {
        "profile": profile.name,
        "faults_injected": len(faults),
        "faults": faults,
        "max_recovery_s": max(f["recovery_s"] for f in faults),
        **report.as_json(),
        "probe_errors_by_kind": dict(chaos.probe.report.attempt_errors),
    }


def _log_errors(paths: list[Path], limit: int = 5) -> list[str]:
    """The first ``limit`` tracebacks and aiohttp handler errors in the stack's logs (file
    name and up to 25 lines each), so that an intermittent failure says where it came from
    even when the logs are gone."""
    out: list[str] = []
    for path in paths:
        if not path.exists():
            continue
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if "Traceback (most recent call last)" in line or "Error handling request" in line:
                out.append(f"{path.name}:{i + 1}: " + "\n".join(lines[i : i + 25]))
                if len(out) >= limit:
                    return out
    return out


def _emit(summary: dict[str, Any]) -> None:
    text = json.dumps(summary, indent=2)
    print(text)
    out = os.environ.get("TIDESERVE_CHAOS_REPORT")
    if out:
        Path(out).write_text(text + "\n")


async def test_stack_survives_faults_under_load(chaos_profile: Profile) -> None:
    root = Path(tempfile.mkdtemp(prefix="tschaos-"))  # short: unix sockets live under it
    os.chmod(root, 0o755)  # the embedded postgres system user must reach it (as root)
    redis = await asyncio.to_thread(start_redis, root / "redis", free_ports(1)[0])
    postgres: EmbeddedPostgres | None = None
    try:
        postgres = await asyncio.to_thread(start_postgres, root / "pg")
        infra = Infra(root, redis, postgres)
        dep = f"chaos-{uuid.uuid4().hex[:6]}"
        config = _config(chaos_profile, dep)
        flags = ["--engines", str(chaos_profile.engines), "--engine-profile", "test",
                 "--engine-speedup", "20", "--engine-kv-blocks", "512"]  # fmt: skip
        replica = CutReplica(root, redis.port, config.pop("cut_replica_grpc_port"))
        with running_stack(config, flags, postgres_url=postgres.url, redis_url=redis.url) as stack:
            try:
                summary = await _run(Chaos(stack, config, dep, infra, replica), chaos_profile)
            finally:
                replica.stop()
                await replica.proxy.cut()
                keep = os.environ.get("TIDESERVE_CHAOS_LOGS")
                logs = [*sorted((stack.state_dir / "logs").glob("*.log")), replica.log]
                if "summary" in locals():  # a failure's cause, in the assertion message
                    summary["log_errors"] = _log_errors(logs)
                if keep:  # the services' and engines' logs, for a failure's post-mortem
                    shutil.copytree(stack.state_dir / "logs", keep, dirs_exist_ok=True)
                    if replica.log.exists():
                        shutil.copy(replica.log, keep)
        _emit(summary)
    finally:
        infra_redis = locals().get("infra")
        await asyncio.to_thread((infra_redis.redis if infra_redis else redis).stop)
        if postgres is not None:
            await asyncio.to_thread(postgres.stop)
        shutil.rmtree(root, ignore_errors=True)
    assert summary["lost"] == 0, summary
    assert summary["malformed"] == 0, summary
    # a gateway bug answers 500 (OpenAI-style since errors.internal_errors): never expected
    assert "http 500" not in summary["errors_by_kind"], summary
    assert summary["faults_injected"] == len(chaos_profile.faults)
