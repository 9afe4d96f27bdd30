"""kill -9 of a real kvmeta process loses nothing acknowledged (index and objects)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import psycopg
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tideserve.v1 import common_pb2, events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.streams import encode_entry, stream_name
from services.common.tokens import block_hashes
from tests.helpers.ports import free_port

pytestmark = pytest.mark.integration

H = block_hashes(list(range(160)), 16)  # 10 blocks
STORED = events_pb2.KVEvent.KIND_BLOCK_STORED
START_TIMEOUT_S = 60.0


def start(
    tmp: Path, port: int, pg: str, rd: str, prefix: str, interval: float
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TIDESERVE_")}
    env.update(
        {
            "TIDESERVE_METADATA_HTTP_PORT": "0",
            "TIDESERVE_STREAM_PREFIX": prefix,
            "TIDESERVE_KVMETA__CHECKPOINT_INTERVAL_S": str(interval),
            "TIDESERVE_LOG_FORMAT": "text",
        }
    )
    args = [
        "--grpc-port",
        str(port),
        "--metrics-port",
        "0",
        "--postgres-url",
        pg,
        "--redis-url",
        rd,
    ]
    with (tmp / "kvmeta.stderr").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "services.kvmeta", *args],
            cwd=tmp,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def wait_until(pred, proc: subprocess.Popen[bytes], tmp: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert proc.poll() is None, (tmp / "kvmeta.stderr").read_text()
        try:
            if pred():
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, (tmp / "kvmeta.stderr").read_text()[-3000:]
        time.sleep(0.1)


def serving(channel: grpc.Channel) -> bool:
    r = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=2
    )
    return bool(r.status == health_pb2.HealthCheckResponse.SERVING)


def matches(stub: kvmeta_pb2_grpc.KVMetaServiceStub) -> dict[str, int]:
    resp = stub.MatchPrefix(
        kvmeta_pb2.MatchPrefixRequest(deployment="dep", block_hashes=H), timeout=5
    )
    return {m.instance_id: m.matched_blocks for m in resp.matches}


@pytest.mark.parametrize("interval", [0.2, 0.0], ids=["with-checkpoints", "stream-replay-only"])
def test_kill_9_and_restart_loses_nothing(
    tmp_path: Path, postgres_db_url: str, redis_url: str, interval: float
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    kvs = stream_name(prefix, "kv", "dep")
    rd = redis.Redis.from_url(redis_url)
    port = free_port()

    def publish(inst: str, seq: int, hashes: list[int]) -> None:
        b = events_pb2.KVEventBatch(
            deployment="dep",
            instance_id=inst,
            epoch=1,
            seq=seq,
            block_size=16,
            events=[events_pb2.KVEvent(kind=STORED, tier=common_pb2.TIER_GPU, block_hashes=hashes)],
        )
        rd.xadd(kvs, encode_entry(b))  # type: ignore[arg-type]

    publish("a", 1, H[:4])
    proc = start(tmp_path, port, postgres_db_url, redis_url, prefix, interval)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
            wait_until(lambda: serving(ch), proc, tmp_path)
            wait_until(lambda: matches(stub) == {"a": 4}, proc, tmp_path)
            if interval:
                time.sleep(interval * 3)  # let a checkpoint cover seq 1
            publish("a", 2, H[4:7])
            publish("b", 1, H[:9])
            wait_until(lambda: matches(stub) == {"a": 7, "b": 9}, proc, tmp_path)
            stub.MountSegment(
                kvmeta_pb2.MountSegmentRequest(
                    deployment="dep",
                    segment=kvmeta_pb2.Segment(
                        name="s",
                        instance_id="a",
                        tier=common_pb2.TIER_CPU,
                        capacity_bytes=1 << 20,
                        transfer_address="127.0.0.1:1",
                    ),
                )
            )
            stub.PutStart(kvmeta_pb2.PutStartRequest(deployment="dep", key="obj", size=4096))
            stub.PutEnd(kvmeta_pb2.PutEndRequest(deployment="dep", key="obj"))
            wait_until(lambda: rd.xpending(kvs, "kvmeta")["pending"] == 0, proc, tmp_path)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        plain = postgres_db_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(plain) as conn:
            row = conn.execute("SELECT count(*) FROM kvmeta.index_checkpoints").fetchone()
        assert (row is not None and row[0] > 0) == bool(interval)
        proc = start(tmp_path, port, postgres_db_url, redis_url, prefix, interval)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
            wait_until(lambda: serving(ch), proc, tmp_path)
            # served only after the checkpoint load and stream replay finished
            assert matches(stub) == {"a": 7, "b": 9}
            ex = stub.Exist(kvmeta_pb2.ExistRequest(deployment="dep", keys=["obj"]), timeout=5)
            assert list(ex.exists) == [True]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        rd.close()
