"""The workload of `pick_rate.py` and the KV data fed to the scheduler under test: trace
prompts as block hashes, the static endpoints, where each request's chain is stored, and
the kvmeta process / embedded Redis stream / live publisher that carry those placements."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _harness import ProcGroup, free_port

DEPLOYMENT = "default"


def workload(trace: str, n: int, block_size: int) -> list[tuple[int, tuple[int, ...]]]:
    """(prompt_tokens, block hashes) of the first ``n`` trace requests."""
    from services.common.tokens import block_hashes

    out: list[tuple[int, tuple[int, ...]]] = []
    with open(trace, encoding="utf-8") as f:
        for line in f:
            if len(out) >= n:
                break
            row = json.loads(line)
            ids: list[int] = []
            for h in row["hash_ids"]:
                base = (int(h) * 7919) % 100_000_000
                ids.extend((base + j) & 0xFFFFFFFF for j in range(512))
            ids = ids[: int(row["input_length"])]
            out.append((len(ids), tuple(block_hashes(ids, block_size))))
    return out


def instance_ids(n: int) -> list[tuple[str, str]]:
    """(instance_id, url) of the static endpoints (never contacted with the gateway off)."""
    return [(f"127.0.0.1:{20000 + i}", f"http://127.0.0.1:{20000 + i}") for i in range(n)]


def placements(n_requests: int, n_endpoints: int) -> list[list[int]]:
    """Endpoint indexes holding request i's chain: i % N, and every 7th also on the next."""
    return [
        [i % n_endpoints] + ([(i + 1) % n_endpoints] if i % 7 == 0 else [])
        for i in range(n_requests)
    ]


def _stored_batches(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]]
                    ) -> list[tuple[str, int, tuple[int, ...]]]:  # fmt: skip
    """(instance, seq, chain) of the seed batches: request i on instance i % N, every 7th
    also on the next one; seqs contiguous per instance from 1."""
    ids = [iid for iid, _ in instance_ids(args.endpoints)]
    seqs = dict.fromkeys(ids, 0)
    out = []
    for (_, hashes), where in zip(work, placements(len(work), len(ids)), strict=True):
        for k in where:
            seqs[ids[k]] += 1
            out.append((ids[k], seqs[ids[k]], hashes))
    return out


def _wait_grpc(port: int, group: ProcGroup, timeout_s: float = 60.0) -> None:
    import grpc

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            try:
                grpc.channel_ready_future(ch).result(timeout=1.0)
                return
            except grpc.FutureTimeoutError:
                pass
    raise RuntimeError(f"gRPC server on port {port} not ready after {timeout_s:g}s")


def start_kvmeta(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
                 group: ProcGroup, log_dir: Path) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """A kvmeta process (no Redis, no Postgres) fed the workload's chains through
    IngestEvents, as the 64 engines would report them. Returns (port, ingest summary)."""
    import grpc
    from tideserve.v1 import common_pb2, events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

    cfg = log_dir / "kvmeta.yaml"
    cfg.write_text(json.dumps({"kvmeta": {"metadata_http_port": 0}}), encoding="utf-8")
    port = free_port()
    group.start("kvmeta", [sys.executable, "-m", "services.kvmeta", "--config", str(cfg),
                           "--grpc-port", str(port), "--metrics-port", "0",
                           "--log-level", "WARNING"])  # fmt: skip
    _wait_grpc(port, group)
    ids = [iid for iid, _ in instance_ids(args.endpoints)]
    seqs = dict.fromkeys(ids, 0)
    batches = []
    for (_, hashes), where in zip(work, placements(len(work), len(ids)), strict=True):
        for k in where:
            iid = ids[k]
            seqs[iid] += 1
            ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                    tier=common_pb2.TIER_GPU, block_hashes=list(hashes),
                                    token_count=len(hashes) * args.block_size)  # fmt: skip
            batches.append(events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid,
                                                   epoch=1, seq=seqs[iid], events=[ev],
                                                   block_size=args.block_size))  # fmt: skip
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
        resp = stub.IngestEvents(iter(batches), timeout=120)
        listed = stub.ListIndexedInstances(
            kvmeta_pb2.ListIndexedInstancesRequest(deployment=DEPLOYMENT), timeout=10
        )
    return port, {"batches_applied": resp.batches_applied,
                  "instances_indexed": len(listed.instances)}  # fmt: skip


def start_redis_fed(args: argparse.Namespace, work: list[tuple[int, tuple[int, ...]]],
                    log_dir: Path) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """An embedded Redis holding the workload's chains as KVEventBatch entries on
    ``ts:kv:default``, as the 64 engines would have published them. Returns (server, info)."""
    import redis
    from tideserve.v1 import common_pb2, events_pb2

    from services.common.embedded import start_redis
    from services.common.streams import encode_entry, stream_name

    server = start_redis(Path(tempfile.mkdtemp(prefix="redis-", dir=log_dir)), 0)
    client = redis.Redis.from_url(server.url)
    stream = stream_name("ts", "kv", DEPLOYMENT)
    pipe = client.pipeline(transaction=False)
    batches = _stored_batches(args, work)
    for iid, seq, hashes in batches:
        ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                tier=common_pb2.TIER_GPU, block_hashes=list(hashes),
                                token_count=len(hashes) * args.block_size)  # fmt: skip
        b = events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid, epoch=1, seq=seq,
                                    events=[ev], block_size=args.block_size)  # fmt: skip
        pipe.xadd(stream, encode_entry(b))  # type: ignore[arg-type]
    pipe.execute()
    client.close()
    return server, {"batches_published": len(batches), "stream": stream}


class _LivePublisher:
    """Publishes ``rate`` more KVEventBatch entries per second on the KV stream from a
    thread of this (bench) process: re-stored workload chains with the next seqs of their
    instances, so the scheduler's replica applies them in full."""

    def __init__(self, url: str, args: argparse.Namespace,
                 work: list[tuple[int, tuple[int, ...]]], rate: float) -> None:  # fmt: skip
        self.url, self.rate, self.published = url, rate, 0
        self.batches = _stored_batches(args, work)
        self.seqs: dict[str, int] = {}
        for iid, seq, _ in self.batches:
            self.seqs[iid] = max(self.seqs.get(iid, 0), seq)
        self.block_size = args.block_size
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-publisher")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import redis
        from tideserve.v1 import common_pb2, events_pb2

        from services.common.streams import encode_entry, stream_name

        client = redis.Redis.from_url(self.url)
        stream = stream_name("ts", "kv", DEPLOYMENT)
        t0, k = time.monotonic(), 0
        try:
            while not self._stop.is_set():
                due = int((time.monotonic() - t0) * self.rate) - self.published
                if due <= 0:
                    self._stop.wait(0.01)
                    continue
                pipe = client.pipeline(transaction=False)
                for _ in range(min(due, 200)):
                    iid, _, hashes = self.batches[k % len(self.batches)]
                    k += 1
                    self.seqs[iid] += 1
                    ev = events_pb2.KVEvent(kind=events_pb2.KVEvent.KIND_BLOCK_STORED,
                                            tier=common_pb2.TIER_GPU, block_hashes=list(hashes))  # fmt: skip
                    b = events_pb2.KVEventBatch(deployment=DEPLOYMENT, instance_id=iid, epoch=1,
                                                seq=self.seqs[iid], events=[ev],
                                                block_size=self.block_size)  # fmt: skip
                    pipe.xadd(stream, encode_entry(b), maxlen=100_000, approximate=True)  # type: ignore[arg-type]
                    self.published += 1
                pipe.execute()
        finally:
            client.close()
