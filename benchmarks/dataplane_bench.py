"""Data-plane throughput: our wrapper (services/common/dataplane) against Mooncake's own
``transfer_engine_bench`` and a minimal loop over the raw Transfer Engine Python API, with a
plain memcpy as the ceiling. TCP over loopback, reads (what a decode instance does).

Layout: kvmeta's metadata endpoint (``python -m services.kvmeta.metadata_http``) and one
target process (``transfer_engine_bench --mode=target``, a registered DRAM buffer of
``--buffer-mib``) for every initiator. Initiators, one at a time, for ``--duration`` seconds
each, interleaved over ``--rounds`` rounds (median and best reported; the machine is
shared, and the best run is the one least disturbed by other processes):

* ``native``: ``transfer_engine_bench --mode=initiator --threads=1`` (the wheel ships it);
* ``raw``: ``TransferEngine.batch_transfer_sync_read`` in a Python loop, no wrapper;
* ``wrapper``: ``DataPlane.read`` awaited in a loop on an asyncio event loop (the call runs
  on the wrapper's worker thread); also the largest event-loop stall seen meanwhile;
* ``memcpy``: ``ctypes.memmove`` of the same pattern between two local buffers.

Patterns: ``64MiB`` (one 64 MiB transfer per batch) and ``128KiBx128`` (batches of 128
blocks of 128 KiB). All initiators read the same remote offsets pattern (block ``k`` of the
run at ``(k * block) mod (buffer - block)``). Throughput in GB/s (1e9 bytes).

    .venv/bin/python benchmarks/dataplane_bench.py --duration 3 --rounds 3 --out /tmp/dp.json
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import mmap
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._dataplane import start_metadata
from benchmarks._harness import (
    ProcGroup,
    command_line,
    emit_json,
    free_port,
    http_get,
    machine,
)
from services.common.dataplane.settings import DataPlaneSettings
from services.common.dataplane.transfer import Arena, DataPlane, load_transfer_engine

MiB = 1 << 20
TICK_S = 0.01  # the stall probe's period (a 1 ms probe on 2 busy cores slows the transfer)
PATTERNS = {"64MiB": (64 * MiB, 1), "128KiBx128": (128 * 1024, 128)}


def native_bench() -> str | None:
    """Path of the wheel's ``transfer_engine_bench`` binary (None if it does not ship one)."""
    import mooncake

    path = Path(mooncake.__file__).with_name("transfer_engine_bench")
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    return shutil.which("transfer_engine_bench")


def offsets(batch_index: int, block: int, batch: int, buffer: int) -> list[int]:
    span = buffer - block
    return [((batch_index * batch + j) * block) % span if span else 0 for j in range(batch)]


def wait_segment(meta: str, name: str, group: ProcGroup, timeout_s: float = 60.0) -> int:
    """Base address of segment ``name``'s first buffer, once kvmeta has it."""
    key = urllib.parse.quote(f"mooncake/ram/{name}", safe="")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        group.check()
        status, body = http_get(f"{meta}?key={key}")
        if status == 200:
            desc = json.loads(body)
            if desc.get("buffers"):
                return int(desc["buffers"][0]["addr"])
        time.sleep(0.1)
    raise RuntimeError(f"segment {name} never appeared in kvmeta")


def start_processes(
    group: ProcGroup, binary: str | None, buffer: int, env: dict[str, str]
) -> tuple[str, str, int]:
    """kvmeta's metadata endpoint and the target; (metadata URL, target segment, its base)."""
    meta = start_metadata(group)
    if binary is None:
        raise RuntimeError("the wheel ships no transfer_engine_bench (see README section)")
    target = f"127.0.0.1:{free_port()}"
    group.start(
        "target",
        [
            binary, "--mode=target", "--protocol=tcp", f"--metadata_server={meta}",
            f"--local_server_name={target}", f"--buffer_size={buffer}",
        ],
        env=env,
    )  # fmt: skip
    return meta, target, wait_segment(meta, target, group)


def run_native(
    binary: str, meta: str, target: str, block: int, batch: int, buffer: int, duration: int
) -> dict[str, Any]:
    cmd = [
        binary,
        "--mode=initiator",
        "--protocol=tcp",
        f"--metadata_server={meta}",
        f"--local_server_name=127.0.0.1:{free_port()}",
        f"--segment_id={target}",
        f"--buffer_size={buffer}",
        f"--block_size={block}",
        f"--batch_size={batch}",
        "--threads=1",
        f"--duration={duration}",
        "--operation=read",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120)
    m = re.search(r"duration ([\d.]+), batch count (\d+)", done.stderr + done.stdout)
    if done.returncode != 0 or m is None:
        raise RuntimeError(
            f"transfer_engine_bench failed ({done.returncode}): {done.stderr[-800:]}"
        )
    secs, batches = float(m.group(1)), int(m.group(2))
    return {"gbps": batches * batch * block / secs / 1e9, "batches": batches, "seconds": secs}


def timed_loop(step: Callable[[int], None], duration: float, nbytes: int) -> dict[str, Any]:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        step(n)
        n += 1
    secs = time.perf_counter() - t0
    return {"gbps": n * nbytes / secs / 1e9, "batches": n, "seconds": round(secs, 3)}


def run_raw(
    engine: Any, base: int, target: str, tbase: int, block: int, batch: int, buffer: int, d: float
) -> dict[str, Any]:
    def step(i: int) -> None:
        offs = offsets(i, block, batch, buffer)
        rc = engine.batch_transfer_sync_read(
            target, [base + o for o in offs], [tbase + o for o in offs], [block] * batch
        )
        if rc != 0:
            raise RuntimeError(f"raw batch_transfer_sync_read returned {rc}")

    return timed_loop(step, d, block * batch)


async def run_wrapper(
    dp: DataPlane, arena: Arena, target: str, tbase: int, block: int, batch: int, buffer: int,
    d: float,
) -> dict[str, Any]:  # fmt: skip
    lag = 0.0
    stop = asyncio.Event()

    async def ticker() -> None:  # how long the event loop was kept from running
        nonlocal lag
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lag = max(lag, time.perf_counter() - t - TICK_S)

    tick = asyncio.create_task(ticker())
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < d:
        offs = offsets(n, block, batch, buffer)
        await dp.read(
            target, [arena.base + o for o in offs], [tbase + o for o in offs], [block] * batch
        )
        n += 1
    secs = time.perf_counter() - t0
    stop.set()
    await tick
    return {
        "gbps": n * batch * block / secs / 1e9,
        "batches": n,
        "seconds": round(secs, 3),
        "max_event_loop_stall_ms": round(lag * 1000, 2),
    }


def run_memcpy(block: int, batch: int, buffer: int, d: float) -> dict[str, Any]:
    src, dst = mmap.mmap(-1, buffer), mmap.mmap(-1, buffer)
    src.write(os.urandom(MiB) * (buffer // MiB))
    s = ctypes.addressof(ctypes.c_char.from_buffer(src))
    t = ctypes.addressof(ctypes.c_char.from_buffer(dst))

    def step(i: int) -> None:
        for o in offsets(i, block, batch, buffer):
            ctypes.memmove(t + o, s + o, block)

    return timed_loop(step, d, block * batch)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "gbps": round(statistics.median(r["gbps"] for r in runs), 3),
        "best_gbps": round(max(r["gbps"] for r in runs), 3),  # least disturbed by neighbours
    }
    out["runs_gbps"] = [round(r["gbps"], 3) for r in runs]
    if "max_event_loop_stall_ms" in runs[0]:
        out["max_event_loop_stall_ms"] = max(r["max_event_loop_stall_ms"] for r in runs)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    buffer = args.buffer_mib * MiB
    binary = native_bench()
    env = {"MC_TCP_BIND_ADDRESS": "127.0.0.1"}
    os.environ.update(env)
    te_cls = load_transfer_engine()
    log_dir = Path(tempfile.mkdtemp(prefix="dataplane_bench_"))
    group = ProcGroup(log_dir)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {p: {} for p in PATTERNS}
    try:
        meta, target, tbase = start_processes(group, binary, buffer, env)
        assert binary is not None

        raw = te_cls()
        if raw.initialize(f"127.0.0.1:{free_port()}", meta, "tcp", "") != 0:
            raise RuntimeError("raw TransferEngine.initialize failed")
        raw_arena = Arena(buffer)
        if raw.register_memory(raw_arena.base, buffer) != 0:
            raise RuntimeError("raw register_memory failed")
        dp = DataPlane(DataPlaneSettings(f"127.0.0.1:{free_port()}", meta, transfer_timeout_s=60))
        await dp.start()
        arena = Arena(buffer)
        await dp.register(arena)
        try:
            for _ in range(args.rounds):
                for name, (block, batch) in PATTERNS.items():
                    r = results[name]
                    r.setdefault("native", []).append(
                        await asyncio.to_thread(
                            run_native, binary, meta, target, block, batch, buffer, args.duration
                        )
                    )
                    r.setdefault("raw", []).append(
                        await asyncio.to_thread(
                            run_raw, raw, raw_arena.base, target, tbase, block, batch, buffer,
                            args.duration,
                        )
                    )  # fmt: skip
                    r.setdefault("wrapper", []).append(
                        await run_wrapper(
                            dp, arena, target, tbase, block, batch, buffer, args.duration
                        )
                    )
                    r.setdefault("memcpy", []).append(
                        run_memcpy(block, batch, buffer, min(args.duration, 1.0))
                    )
        finally:
            await dp.close()
            raw.unregister_memory(raw_arena.base)
            del raw
    finally:
        group.stop()
    out: dict[str, Any] = {
        "benchmark": "dataplane",
        "command": command_line(),
        "machine": machine(),
        "transport": "tcp over loopback, reads, 1 submitting thread",
        "reference": "transfer_engine_bench (from the mooncake-transfer-engine-non-cuda wheel)",
        "duration_s": args.duration,
        "rounds": args.rounds,
        "patterns": {},
    }
    for name, r in results.items():
        summary = {k: median_of(v) for k, v in r.items()}
        summary["wrapper_vs_native"] = round(
            summary["wrapper"]["gbps"] / summary["native"]["gbps"], 3
        )
        summary["wrapper_vs_raw"] = round(summary["wrapper"]["gbps"] / summary["raw"]["gbps"], 3)
        summary["best_wrapper_vs_native"] = round(
            summary["wrapper"]["best_gbps"] / summary["native"]["best_gbps"], 3
        )
        summary["native_vs_memcpy"] = round(
            summary["native"]["gbps"] / summary["memcpy"]["gbps"], 3
        )
        out["patterns"][name] = summary
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per initiator run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--buffer-mib", type=int, default=256, help="registered buffer size")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args()
    emit_json(asyncio.run(main_async(args)), args.out)


if __name__ == "__main__":
    main()
