"""Synthetic request records for the telemetry benchmarks, shaped like the gateway's: two
deployments, three SLO classes, four tenants, 20% disaggregated, agent sessions with tool
calls, three plugin scores each, bimodal prompt lengths, lognormal latencies."""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tideserve.v1 import events_pb2

from services.common.embedded import start_postgres, start_redis

DEPLOYMENTS = ("llama", "qwen")
CLASSES = ("interactive", "agent", "batch")
TENANTS = ("acme", "beta", "gamma", "delta")
OK = events_pb2.REQUEST_OUTCOME_OK


def records(
    n: int, now_ms: int, span_ms: int, seed: int = 1, prefix: str = "r"
) -> list[events_pb2.RequestRecord]:
    """``n`` valid records finishing over ``[now - span, now)`` in finish order, as a gateway
    writes them to the stream."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        finish = now_ms - span_ms + (i * span_ms) // n
        prompt = rng.choice((300, 6000)) + rng.randrange(500)
        cached = rng.randrange(prompt)
        ttft = rng.lognormvariate(5.0, 0.8)
        tokens = rng.randrange(2, 600)
        tpot = rng.lognormvariate(3.0, 0.4)
        e2e = ttft + tpot * tokens
        rec = events_pb2.RequestRecord(
            request_id=f"{prefix}-{seed}-{i}",
            trace_id=f"{rng.getrandbits(128):032x}",
            deployment=rng.choice(DEPLOYMENTS),
            model="m",
            tenant=rng.choice(TENANTS),
            slo_class=rng.choice(CLASSES),
            session_id=f"s{rng.randrange(n // 8 + 1)}",
            profile="default",
            decode_instance=f"engine-{rng.randrange(8)}",
            prompt_tokens=prompt,
            completion_tokens=tokens,
            predicted_cached_tokens=max(0, cached + rng.randrange(-64, 64)),
            cached_tokens=cached,
            predicted_ttft_ms=ttft * 0.9,
            queue_ms=rng.expovariate(0.2),
            ttft_ms=ttft,
            tpot_ms=tpot,
            e2e_ms=e2e,
            outcome=OK if rng.random() > 0.02 else events_pb2.REQUEST_OUTCOME_SHED,
            http_status=200,
            arrival_ms=finish - int(e2e),
            finish_ms=finish,
            disaggregated=rng.random() < 0.2,
            replica_id="gw-a",
            source="http",
            kv_transfer_ms=rng.uniform(1, 20),
        )
        for plugin in ("prefix", "load", "predicted_ttft"):
            rec.scores.add(plugin=plugin, score=rng.random(), weight=1.0)
        if rng.random() < 0.3:
            rec.tool_calls.add(id="c1", name="search", argument_bytes=rng.randrange(400))
        out.append(rec)
    return out


@dataclass
class Infra:
    postgres_url: str
    redis_url: str
    redis_pid: int = 0  # the embedded Redis server's (0: an external one)


@contextlib.contextmanager
def infra(postgres_url: str | None, redis_url: str | None) -> Iterator[Infra]:
    """The given URLs, or an embedded Postgres and Redis in a temporary directory (stopped
    and removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="ts-telemetry-bench-") as tmp:
        pg = start_postgres(Path(tmp) / "pg") if not postgres_url else None
        rd = start_redis(Path(tmp) / "redis", 0) if not redis_url else None
        try:
            yield Infra(
                postgres_url or pg.url,  # type: ignore[union-attr]
                redis_url or rd.url,  # type: ignore[union-attr]
                rd.pid if rd is not None else 0,
            )
        finally:
            if rd is not None:
                rd.stop()
            if pg is not None:
                pg.stop()
