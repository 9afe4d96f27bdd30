"""The arguments of ``tideserve sim`` (:func:`add_arguments`) and its examples (:data:`EXAMPLES`);
the shell that runs them is :mod:`services.sim.cli`."""

from __future__ import annotations

import argparse
from typing import Any

from services.common.bench.traces import FORMATS
from services.common.perfmodel import DEFAULT_PROFILE
from services.sim.compare import BASELINES

__all__ = ["EXAMPLES", "add_arguments"]

EXAMPLES = """\
examples:
  # 2,000 Mooncake requests on 8 aggregated engines, the shipped routing profile
  tideserve sim --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --max-requests 2000 --engines 8 --out sim.json --timeline sim.csv

  # P/D (3 prefill, 5 decode), twice the recorded rate, cache-aware routing, 2 gateways
  tideserve sim --trace ../shared/traces/weka_agentic_dev.jsonl --prefill 3 --decode 5 \\
      --rate-scale 2 --profile cache_aware --gateways 2 --seed 1 --out pd.json

  # routing profiles side by side (each on a fresh fleet), a table on stdout
  tideserve sim --trace ../shared/traces/mooncake_conversation_trace.jsonl \\
      --max-requests 400 --rate-scale 2.5 --slo-ttft-ms 2000 --slo-tpot-ms 100 \\
      --profile default,cache_aware,round_robin,least_load --out compare.json

  # two days of the ServeGen tide, a day in 1,200 s, agentic requests, P/D autoscaled
  tideserve sim --rate-curve ../shared/traces/servegen_language_m-large_rate.csv \\
      --lengths ../shared/traces/weka_agentic_dev.jsonl --speedup 72 --rate-scale 0.01 \\
      --max-requests 20000 --prefill 2 --decode 6 --autoscale --out tide.json

  # the autoscaling policies side by side on one day of the tide (SLO windows, replica-s)
  tideserve sim --rate-curve ../shared/traces/servegen_language_m-large_rate.csv \\
      --lengths ../shared/traces/azure2023_conv.csv --curve-days 1 --speedup 72 \\
      --rate-scale 0.25 --prefill 8 --decode 3 --autoscale-policy sla,reactive,static \\
      --max-replicas 32 --startup-s 10 --slo-ttft-ms 300 --slo-tpot-ms 25 --seed 1 \\
      --out tide.json

  # start from one worker and let the SLA planner scale it (new instances serve after 30 s)
  tideserve sim --trace trace.jsonl --engines 1 --autoscale --max-replicas 12 \\
      --slo-ttft-ms 2000 --slo-tpot-ms 100 --out auto.json --timeline auto.csv

The JSON has the keys of `tideserve bench`'s summary (figures in modelled time) plus "sim"
(routing diagnostics, requests per instance) and "wall" (what the run cost).
"""


def _number(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not {'an integer' if kind is int else 'a number'}: {text!r}"
            ) from None

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    num, whole = _number(float), _number(int)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="Mooncake JSONL or Azure CSV trace file")
    src.add_argument("--rate-curve", metavar="FILE.csv",
                     help="arrivals from a rate curve (CSV t_s,rate_rps), the requests "
                     "from --lengths in order")  # fmt: skip
    p.add_argument("--lengths", metavar="TRACE",
                   help="with --rate-curve: the trace whose requests (lengths, prefix ids) "
                   "arrive")  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="auto", help="trace format (default: auto)")
    p.add_argument("--max-requests", type=whole, help="replay N requests (the trace repeats "
                   "with fresh prefix ids when shorter)")  # fmt: skip
    p.add_argument("--offset", type=whole, default=0, help="skip this many requests first")
    p.add_argument("--rate-scale", type=num, default=1.0, help="multiply the request rate")
    p.add_argument("--speedup", type=num, default=1.0,
                   help="time compression of the trace, as the bench's (arrivals / (speedup x "
                   "rate-scale)); of a rate curve, its clock alone (72: a day in 1,200 s, "
                   "rates unchanged); the engines run at modelled speed; the planner's forecast "
                   "bucket and season are divided by it")  # fmt: skip
    fleet = p.add_mutually_exclusive_group()
    fleet.add_argument("--engines", type=whole, help="aggregated engines (default 8)")
    fleet.add_argument("--prefill", type=whole, help="P/D: prefill instances (with --decode)")
    fleet.add_argument("--deployment", metavar="SPEC.yaml",
                       help="the fleet, profiles and SLO of a deployment spec (as `tideserve "
                       "apply -f` takes it; --profile and --engine-profile override its own)")  # fmt: skip
    p.add_argument("--decode", type=whole, help="P/D: decode instances (with --prefill)")
    p.add_argument("--profile",
                   help="routing profile (default: default); a comma list runs each on a fresh "
                   "fleet and compares them")  # fmt: skip
    p.add_argument("--baseline-profiles", default=",".join(BASELINES),
                   help="profiles standing in for another router, run without the gateway's "
                   f"dispatch order (default {','.join(BASELINES)}; '' for none)")  # fmt: skip
    p.add_argument("--profiles-file", help="routing profiles YAML (default: the shipped one)")
    p.add_argument("--engine-profile",
                   help=f"performance profile of the engines (default {DEFAULT_PROFILE})")  # fmt: skip
    p.add_argument("--gateway-perf-profile", default="",
                   help="performance profile the gateways price with (default: the engines', "
                   "an exact model; e.g. the engines at NAME*1.2 and the gateway at NAME)")  # fmt: skip
    p.add_argument("--gateways", type=whole, default=1, help="gateway replicas (default 1)")
    p.add_argument("--no-share-state", dest="share_state", action="store_false",
                   help="gateway replicas do not share routed prefixes and in-flight load "
                   "(default: they do, as `tideserve up` runs them, the other replicas' "
                   "picks arriving 5 ms later and their in-flight counts every 0.5 s)")  # fmt: skip
    p.add_argument("--seed", type=whole, default=0, help="seed of every random choice")
    p.add_argument("--slo-ttft-ms", type=num, help="TTFT SLO for goodput")
    p.add_argument("--slo-tpot-ms", type=num, help="TPOT SLO for goodput")
    p.add_argument("--load-source", choices=("scrape", "stream"), default="scrape",
                   help="the gateway's view of load: /metrics scrapes (default) or the "
                   "engines' load stream")  # fmt: skip
    p.add_argument(
        "--precise",
        action="store_true",
        help="give every pick each engine's resident prefix (a lag-free KV index)",
    )
    p.add_argument(
        "--decode-can-prefill",
        action="store_true",
        help="P/D: decode instances may compute a prompt alone (vLLM-like)",
    )
    p.add_argument(
        "--decode-keeps-kv",
        action="store_true",
        help="P/D: decode instances cache the KV they receive and take only the part of a "
        "prompt they do not hold (default: the whole prompt, nothing cached)",
    )
    p.add_argument("--short-first-tokens", type=whole, default=0,
                   help="engines prefill prompts with at most N tokens left to compute before "
                   "longer ones (default 0: FCFS)")  # fmt: skip
    p.add_argument("--kv-blocks", type=whole, default=16384, help="KV blocks per engine")
    p.add_argument("--max-batch", type=whole, default=256,
                   help="engines: max running sequences (default 256)")  # fmt: skip
    p.add_argument("--max-batched-tokens", type=whole, default=8192,
                   help="engines: tokens per step / prefill chunk (default 8192)")  # fmt: skip
    p.add_argument("--block-size", type=whole, default=64, help="engine and gateway block size")
    p.add_argument("--stream-interval", type=whole, default=16, help="engines' SSE coalescing")
    p.add_argument("--autoscale", action="store_true",
                   help="scale the roles with the autoscaler's SLA planner (targets: the SLOs, "
                   "default 2000 ms TTFT and 100 ms TPOT at p90)")  # fmt: skip
    p.add_argument("--autoscale-policy", metavar="LIST",
                   help="autoscaling policies side by side, each on a fresh fleet started at "
                   "the given size: a comma list of sla (the SLA planner), reactive (the "
                   "KPA-like policy), static (never scaled); prints a table")  # fmt: skip
    p.add_argument("--planner", action="append", default=[], metavar="NAME=VALUE",
                   help="autoscale: a planner setting (as the autoscaler's planner config, "
                   "e.g. predictor=constant, max_utilization=0.7); repeatable")  # fmt: skip
    p.add_argument("--slo-window-s", type=num, default=60.0,
                   help="--autoscale-policy: the SLO is judged per window of this many "
                   "modelled seconds (default 60)")  # fmt: skip
    p.add_argument("--curve-days", type=num,
                   help="with --rate-curve: replay only its first N days (its own time)")  # fmt: skip
    p.add_argument("--max-replicas", type=whole, default=16, help="autoscale: per role")
    p.add_argument("--startup-s", type=num, default=30.0,
                   help="autoscale: seconds from asking for an instance to it serving")  # fmt: skip
    p.add_argument("--agent-memory", choices=("lru", "retention", "prefetch"),
                   help="model agent sessions' KV (sessions = a trace's first hash id): lru "
                   "(today's), retention (protect idle sessions, offload the rest to a tier), "
                   "prefetch (retention + prefetch before the predicted return)")  # fmt: skip
    p.add_argument("--memory-budget-share", type=num, default=0.2,
                   help="agent memory: share of an engine's KV idle sessions may hold")  # fmt: skip
    p.add_argument("--memory-offload", choices=("pressure", "eager"), default="pressure",
                   help="agent memory: idle sessions past the budget stay on the GPU while it "
                   "has room (pressure) or are offloaded at once (eager)")  # fmt: skip
    p.add_argument("--memory-rebalance", action="store_true",
                   help="agent memory (retention, prefetch): move idle sessions off an "
                   "instance holding most of the active sessions' KV (hot spot)")  # fmt: skip
    p.add_argument("--memory-tier-mib", type=whole, default=None,
                   help="agent memory: the KV-cache tier's size in MiB (a kvcache role's "
                   "--kvcache-mib, DRAM plus disk; default: a deployment's kvcache roles, "
                   "else unbounded)")  # fmt: skip
    p.add_argument("--scale-in-at-s", type=num, default=None,
                   help="remove engines at this modelled second (the autoscaler's victim rule, "
                   "drain, then with agent memory migrate their sessions)")  # fmt: skip
    p.add_argument(
        "--scale-in-count", type=whole, default=1, help="engines --scale-in-at-s removes"
    )
    p.add_argument("--fail-at-s", type=num, default=None,
                   help="engines die at this modelled second (no drain; their KV lost): a "
                   "request not yet streaming is retried elsewhere, as the gateway does")  # fmt: skip
    p.add_argument("--fail-count", type=whole, default=1, help="engines --fail-at-s kills")
    p.add_argument("--fail-role", choices=("prefill", "decode"), default=None,
                   help="P/D: the role --fail-at-s kills engines of (default: any)")  # fmt: skip
    p.add_argument("--fail-detect-s", type=num, default=5.0,
                   help="seconds until the gateways' membership drops a dead engine")  # fmt: skip
    p.add_argument("--out", required=True, metavar="FILE.json", help="write the summary here")
    p.add_argument("--timeline", metavar="FILE.csv", help="per-minute timeline CSV")
    p.add_argument("--plot", metavar="FILE.png",
                   help="replicas per role against the request rate, per minute (matplotlib)")  # fmt: skip
