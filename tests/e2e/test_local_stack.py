"""`tideserve up` / `status` / `down` as real processes: embedded Postgres and Redis, the four
services, grpc health and reflection, and nothing left behind.

Every port is an ephemeral port that was free a moment ago (written into a config file), never
a design default, so this runs beside other stacks and tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.local.client import cli_security
from services.common.local.procs import ProcRef, is_alive, stop_processes
from services.common.local.state import read_state
from services.common.security.channels import sync_channel
from services.stack.health import Health, check_grpc_health
from tests.helpers.ports import free_ports
from tests.helpers.stack import cli, wait_running

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 240.0  # 2 shared cores: four Python services can be slow to import
SERVICES = {
    "scheduler": "tideserve.v1.SchedulerService",
    "kvmeta": "tideserve.v1.KVMetaService",
    "autoscaler": "tideserve.v1.AutoscalerService",
    "telemetry": "tideserve.v1.TelemetryService",
}


@dataclass
class Stack:
    state_dir: Path
    config: Path
    ports: dict[str, dict[str, int]]
    redis_port: int


@pytest.fixture
def stack_dirs() -> Iterator[Stack]:
    # short path: the embedded Postgres unix socket lives under it
    state_dir = Path(tempfile.mkdtemp(prefix="tse2e-"))
    ports = iter(free_ports(11))
    layout: dict[str, dict[str, int]] = {
        name: {"grpc_port": next(ports), "metrics_port": next(ports)} for name in SERVICES
    }
    layout["scheduler"]["http_port"] = next(ports)
    layout["kvmeta"]["metadata_http_port"] = next(ports)
    redis_port = next(ports)
    config = state_dir / "tideserve.yaml"
    config.write_text(
        # one gateway: the default (one per core) would depend on the machine; the services
        # alone: no engine (the default starts two)
        yaml.safe_dump(
            {
                **layout,
                "stack": {"redis_port": redis_port, "gateways": 1, "engines": 0},
                "log_format": "text",
            }
        )
    )
    stack = Stack(state_dir, config, layout, redis_port)
    try:
        yield stack
    finally:
        _force_down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


def _force_down(state_dir: Path) -> None:
    """Last-resort cleanup after a failed test: `down`, then kill anything still recorded."""
    if read_state(state_dir) is None:
        return
    subprocess.run([*cli(), "down", "--state-dir", str(state_dir), "--timeout", "20"], timeout=120)
    state = read_state(state_dir)
    if state is not None:
        stop_processes([state.up.ref, *(p.ref for p in state.processes)], 5.0)


def _stack_processes(state_dir: Path) -> list[psutil.Process]:
    """Processes whose command line mentions the state dir (services, postgres, redis, up)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(state_dir) in cmdline and proc.pid != os.getpid():
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
    return found


def _reflected_services(address: str, state_dir: Path) -> set[str]:
    """Reflection needs a read token on the secured stack: the CLI's, from its state dir."""
    with sync_channel(address, cli_security(address, state_dir)) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = stub.ServerReflectionInfo(iter([request]), timeout=10)
        return {svc.name for resp in responses for svc in resp.list_services_response.service}


def test_up_status_down_leaves_nothing_running(stack_dirs: Stack) -> None:
    state_dir = stack_dirs.state_dir
    up = subprocess.Popen(
        [
            *cli(),
            "up",
            "--state-dir",
            str(state_dir),
            "--config",
            str(stack_dirs.config),
            "--start-timeout",
            str(START_TIMEOUT_S),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        processes = wait_running(up, state_dir, START_TIMEOUT_S + 30).processes
        by_name = {p.name: p for p in processes}
        assert set(by_name) == {*SERVICES, "postgres", "redis"}
        assert by_name["redis"].url == f"redis://127.0.0.1:{stack_dirs.redis_port}/0"

        for name, full_name in SERVICES.items():
            address = f"127.0.0.1:{stack_dirs.ports[name]['grpc_port']}"
            assert by_name[name].grpc_address == address
            assert check_grpc_health(address, "", 5.0) is Health.SERVING
            assert check_grpc_health(address, full_name, 5.0) is Health.SERVING
            assert full_name in _reflected_services(address, state_dir)
            metrics = f"http://127.0.0.1:{stack_dirs.ports[name]['metrics_port']}/metrics"
            assert by_name[name].metrics_url == metrics
            # only endpoints that answer are announced, each on the port it was given
            for purpose, url in by_name[name].endpoints.items():
                port = int(url.split(":")[2].split("/")[0])
                assert port in stack_dirs.ports[name].values(), (name, purpose, url)
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    pass

        status = subprocess.run(
            [*cli(), "status", "--state-dir", str(state_dir), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["running"] is True and report["serving"] is True
        assert report["engines"] == []  # none asked for
        gateway = f"http://127.0.0.1:{stack_dirs.ports['scheduler']['http_port']}/v1"
        assert report["gateway_url"] == gateway
        assert {s["name"]: (s["health"], s["alive"]) for s in report["services"]} == {
            name: ("SERVING", True) for name in SERVICES
        }

        refs = [ProcRef(p.name, p.pid, p.create_time) for p in processes]
        assert all(is_alive(r) for r in refs)

        down = subprocess.run(
            [*cli(), "down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert "stack stopped" in down.stdout
        out, err = up.communicate(timeout=60)
        assert up.returncode == 0, err
        announced = json.loads(out.strip().splitlines()[-1])
        assert {p["name"] for p in announced["processes"]} == set(by_name)

        assert [r.name for r in refs if is_alive(r)] == []
        assert _stack_processes(state_dir) == []
        assert read_state(state_dir) is None

        again = subprocess.run(
            [*cli(), "status", "--state-dir", str(state_dir)], capture_output=True, text=True
        )
        assert again.returncode != 0
        assert "no stack running" in again.stdout
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.communicate(timeout=120)


def test_port_in_use_names_service_and_port_and_leaves_nothing(stack_dirs: Stack) -> None:
    state_dir = stack_dirs.state_dir
    port = stack_dirs.ports["kvmeta"]["grpc_port"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        result = subprocess.run(
            [*cli(), "up", "--state-dir", str(state_dir), "--config", str(stack_dirs.config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert f"kvmeta gRPC port 127.0.0.1:{port}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr  # one clear line
    assert read_state(state_dir) is None
    assert not (state_dir / "postgres").exists()  # checked before anything started
    assert _stack_processes(state_dir) == []


def test_down_cleans_up_after_up_was_killed(stack_dirs: Stack) -> None:
    """`up` dies without stopping anything (SIGKILL): `down` stops the orphaned services,
    Redis and Postgres from the recorded pids."""
    state_dir = stack_dirs.state_dir
    up = subprocess.Popen(
        [
            *cli(),
            "up",
            "--state-dir",
            str(state_dir),
            "--config",
            str(stack_dirs.config),
            "--start-timeout",
            str(START_TIMEOUT_S),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes = wait_running(up, state_dir, START_TIMEOUT_S + 30).processes
    up.kill()
    up.communicate(timeout=30)
    refs = [ProcRef(p.name, p.pid, p.create_time) for p in processes]
    assert all(is_alive(r) for r in refs)  # orphans, until `down`

    refused = subprocess.run(
        [*cli(), "up", "--state-dir", str(state_dir), "--config", str(stack_dirs.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "run `tideserve down` first" in refused.stderr

    down = subprocess.run(
        [*cli(), "down", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert down.returncode == 0, down.stdout + down.stderr
    assert [r.name for r in refs if is_alive(r)] == []
    assert _stack_processes(state_dir) == []
    assert read_state(state_dir) is None


def test_external_postgres_and_redis_are_used_and_left_running(
    stack_dirs: Stack, postgres_url: str, redis_url: str
) -> None:
    import asyncio

    from services.common.db import check_postgres
    from services.common.streams import check_redis

    state_dir = stack_dirs.state_dir
    up = subprocess.Popen(
        [
            *cli(),
            "up",
            "--state-dir",
            str(state_dir),
            "--config",
            str(stack_dirs.config),
            "--postgres-url",
            postgres_url,
            "--redis-url",
            redis_url,
            "--start-timeout",
            str(START_TIMEOUT_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        processes = wait_running(up, state_dir, START_TIMEOUT_S + 30).processes
        assert {p.name for p in processes} == set(SERVICES)  # no embedded servers
        assert not (state_dir / "postgres").exists() and not (state_dir / "redis").exists()
        down = subprocess.run(
            [*cli(), "down", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        out, err = up.communicate(timeout=60)
        assert up.returncode == 0, err
        assert "external" in out
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.communicate(timeout=120)
    assert _stack_processes(state_dir) == []
    asyncio.run(check_postgres(postgres_url))  # still up: `down` never stops external servers
    asyncio.run(check_redis(redis_url))
