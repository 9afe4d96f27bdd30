"""CPU cost per request of the gateway integrations' pure parts (single process, no I/O).

- ``build_record_us``: one RequestRecord from a streamed request's trace (usage parsed from
  an 8 KiB SSE tail, plugin scores copied) — paid once per request, after it finished.
- ``routed_entry_us``: the RoutedPrefix a pick publishes (active-active), per pick.
- ``apply_routed_us``: applying another replica's RoutedPrefix to the local approximate
  prefix index (the same ``on_pick`` as a local pick), per remote pick.

Prompts of ``--tokens`` tokens (block size 64), 8 endpoints, the shipped default profile.

    .venv/bin/python benchmarks/gateway_integrations_cost.py --tokens 8192

Prints JSON; every figure is measured in this run (median of ``--repeats`` timeit runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit

from services.common.routing.types import Pick, RequestView
from services.common.scheduling import EndpointSpec, build_core
from services.common.scheduling.shared_state import (
    apply_routed,
    approx_plugins,
    routed_entry,
    routed_plugins,
)
from services.common.tokens import block_hashes
from services.scheduler.core.records import RequestContext, build_record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    core = build_core(
        [EndpointSpec(f"e{i}", f"http://e{i}") for i in range(8)],
        perf_profile="test",
        block_size=64,
    )
    view = RequestView(
        "r", args.tokens, tuple(block_hashes(list(range(args.tokens)), 64)), block_size=64
    )
    pick = core.pick(view, 1.0, "p")
    assert isinstance(pick, Pick)
    trace = RequestContext("r", "a" * 32, 1.0, 1000.0, pick=pick, streamed=True)
    trace.parsed_at, trace.admitted_at, trace.first_byte = 1.0, 1.0, 1.1
    chunk = b'data: {"id":"x","choices":[{"delta":{"content":"tok"}}]}\n\n'
    usage = {"prompt_tokens": args.tokens, "completion_tokens": 200}
    trace.tail += chunk * 200
    trace.tail += b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    del trace.tail[:-8192]
    entry = routed_entry(
        view, pick, routed_plugins(core.scheduler, pick), deployment="d", replica_id="A", ts_ms=1
    )
    assert entry is not None
    plugins = approx_plugins(core.scheduler)

    def us(fn: object) -> float:
        runs = timeit.repeat(fn, number=args.number, repeat=args.repeats)  # type: ignore[arg-type]
        return round(statistics.median(runs) / args.number * 1e6, 2)

    out = {
        "benchmark": "gateway_integrations_cost",
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "prompt_tokens": args.tokens,
        "block_hashes": len(view.block_hashes),
        "build_record_us": us(
            lambda: build_record(trace, status=200, finish=2.0, finish_wall=1001.0, deployment="d")
        ),
        "routed_entry_us": us(
            lambda: routed_entry(
                view,
                pick,
                routed_plugins(core.scheduler, pick),
                deployment="d",
                replica_id="A",
                ts_ms=1,
            )
        ),
        "apply_routed_us": us(
            lambda: apply_routed(
                plugins, entry, replica_id="B", now=2.0, wall_ms=2, max_age_s=600.0
            )
        ),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
