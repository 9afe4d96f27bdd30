"""P/D with real KV bytes, end to end at the engines: the share of TTFT spent moving KV.

A prefill and a decode ``tideserve engine`` process, both with ``--kv-data-plane`` (Mooncake
Transfer Engine, TCP on loopback; kvmeta's metadata endpoint as
``python -m services.kvmeta.metadata_http``), real time (``--speedup 1``). The first
``--requests`` requests of the Mooncake conversation trace (prompts from the trace's
``hash_ids`` as ``tideserve bench`` builds them, ``--max-tokens`` each) are sent one at a
time in SGLang's P/D form, as the gateway sends them: the same body with
``bootstrap_host/port/room`` to both, the decode streamed. Measured per request: TTFT (send
→ first streamed token from the decode), the decode's ``usage.kv_transfer_ms`` (wall time
of the verified pull) and whether it recomputed instead. No gateway in the path: this is the
engines' share, not the gateway's. With ``--gateway``, the requests go through ``tideserve
gateway`` (``--prefill URL BOOTSTRAP_PORT --decode URL``, its default P/D decision: these
prompts are long enough to be disaggregated) as plain streamed completions; the gateway adds
the bootstrap fields and passes the decode's usage through, so TTFT includes its routing.

The bytes are the profile's KV divided by ``--kv-bytes-scale``; the simulator still models
the full-size hand-off over the profile's link, and the decode waits ``max(modelled, real
pull)`` (services/common/dataplane/README.md).

    .venv/bin/python benchmarks/dataplane_pd.py --requests 40 --out /tmp/dp_pd.json
    .venv/bin/python benchmarks/dataplane_pd.py --requests 40 --gateway --out /tmp/dp_pd_gw.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._dataplane import pct, start_metadata, streamed
from benchmarks._harness import (
    MOONCAKE_CONVERSATION,
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    machine,
    tideserve,
    wait_http,
)
from services.common.bench.prompts import PromptSynthesizer
from services.common.bench.traces import load_trace


def start(group: ProcGroup, args: argparse.Namespace) -> tuple[str, str, int]:
    """Metadata server, prefill, decode; (prefill URL, decode URL, bootstrap port)."""
    meta = start_metadata(group)
    common = [
        "--profile", args.profile, "--speedup", "1", "--kv-data-plane",
        "--te-metadata-url", meta, "--kv-bytes-scale", str(args.kv_bytes_scale),
        "--log-level", "WARNING",
    ]  # fmt: skip
    pport, dport, boot = free_port(), free_port(), free_port()
    group.start(
        "prefill",
        tideserve("engine", "--port", str(pport), "--role", "prefill", "--bootstrap-port",
                  str(boot), *common),
    )  # fmt: skip
    group.start("decode", tideserve("engine", "--port", str(dport), "--role", "decode", *common))
    purl, durl = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{dport}"
    for url in (purl, durl):
        wait_http(url + "/health", group, timeout_s=120)
    return purl, durl, boot


def start_gateway(group: ProcGroup, purl: str, durl: str, boot: int) -> str:
    """``tideserve gateway`` in front of the pair; its URL once it answers /v1/models."""
    port = free_port()
    group.start(
        "gateway",
        tideserve("gateway", "--host", "127.0.0.1", "--port", str(port), "--prefill", purl,
                  str(boot), "--decode", durl, "--log-level", "WARNING"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/v1/models", group, timeout_s=120)
    return url


async def one(
    http: aiohttp.ClientSession, purl: str, durl: str, body: dict[str, Any]
) -> dict[str, Any]:
    out: tuple[float, dict[str, Any]] = (0.0, {})

    async def decode() -> None:
        nonlocal out
        out = await streamed(http, durl, body)

    async def prefill() -> None:
        async with http.post(purl + "/v1/completions", json=body) as r:
            r.raise_for_status()
            await r.read()

    await asyncio.gather(decode(), prefill())
    return _row(*out)


def _row(ttft_ms: float, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "ttft_ms": ttft_ms,
        "kv_transfer_ms": float(usage.get("kv_transfer_ms", 0.0)),
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_trace(args.trace)
    reqs = trace.requests[: args.requests]
    prompts = PromptSynthesizer()
    group = ProcGroup(Path(tempfile.mkdtemp(prefix="dataplane_pd_")))
    rows: list[dict[str, Any]] = []
    try:
        purl, durl, boot = start(group, args)
        gateway = start_gateway(group, purl, durl, boot) if args.gateway else None
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for i, r in enumerate(reqs):
                body: dict[str, Any] = {"prompt": prompts.prompt(r), "max_tokens": args.max_tokens}
                if gateway is not None:  # the gateway needs the model; asks for the usage
                    body.update(model="tideserve-sim", stream_options={"include_usage": True})
                    rows.append(_row(*await streamed(http, gateway, body)))
                    continue
                body.update(
                    bootstrap_host="127.0.0.1", bootstrap_port=boot, bootstrap_room=1000 + i
                )
                rows.append(await one(http, purl, durl, body))
    finally:
        group.stop()
    ttft = [r["ttft_ms"] for r in rows]
    pulled = [r for r in rows if r["kv_transfer_ms"] > 0]
    kv = [r["kv_transfer_ms"] for r in pulled]
    return {
        "benchmark": "dataplane_pd",
        "command": command_line(),
        "machine": machine(),
        "profile": args.profile,
        "kv_bytes_scale": args.kv_bytes_scale,
        "path": "client -> tideserve gateway -> engines" if args.gateway else "client -> engines",
        "requests": len(rows),
        "pulled": len(pulled),
        "recomputed": len(rows) - len(pulled),
        "prompt_tokens_mean": round(statistics.mean(r["prompt_tokens"] for r in rows), 1),
        "ttft_ms": {
            "mean": round(statistics.mean(ttft), 2),
            "p50": round(pct(ttft, 0.5), 2),
            "p90": round(pct(ttft, 0.9), 2),
        },
        "kv_transfer_ms": {
            "mean": round(statistics.mean(kv), 3) if kv else None,
            "p90": round(pct(kv, 0.9), 3) if kv else None,
        },
        "kv_share_of_ttft": round(sum(kv) / sum(r["ttft_ms"] for r in pulled), 4) if kv else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=str(MOONCAKE_CONVERSATION))
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--profile", default="h200-llama3.1-8b")
    p.add_argument("--kv-bytes-scale", type=int, default=256)
    p.add_argument("--gateway", action="store_true", help="send through tideserve gateway")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    emit_json(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
