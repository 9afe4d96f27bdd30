"""Summarise engine step traces: what the engines carried, live or simulated, side by side.

The live engines write them with ``--step-trace`` (``routing_compare.py --step-traces``), the
virtual-time simulator with ``routing_sim.py --step-traces DIR``; the format is
:mod:`services.common.engine_core.steptrace`'s. Files are grouped by the name before ``-engine-<i>``
(the router's tag in ``routing_compare.py``, the profile in ``routing_sim.py``).

Per group, and per engine:

* ``requests``, ``prefill_tokens`` (computed), ``cached_share`` (of the prompts);
* ``busy_ms`` (modelled ms in steps), ``mean_decode_batch`` (decodes per step that had any),
  ``mean_decode_context`` (tokens each decode reads), ``mixed_share`` (share of the
  decode steps' time in steps that also carried prefill chunks: what stretches TPOT);
* ``token_step_ms``: the step time a decoded token waited, averaged over tokens;
* ``engine_ttft_ms`` / ``engine_tpot_ms``: per request, first output - submit, and
  (done - first) / (tokens - 1), means over requests (the engine's view: no HTTP, no
  16-token first chunk);
* ``late_share``: shell overhead, the ms steps started after the previous one's planned end,
  over ``busy_ms`` (0 in the simulator); ``handler_ms``: the live handlers' time to submit.

    .venv/bin/python benchmarks/step_trace_summary.py /tmp/live/st1201/*.steps.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from _harness import emit_json

_NAME = re.compile(r"^(?P<group>.+)-engine-(?P<i>\d+)\.steps\.jsonl$")


def read_traces(files: list[str]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Step-trace files -> group -> engine index -> its events, in order. ValueError for a
    file not named ``<group>-engine-<i>.steps.jsonl``."""
    groups: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(dict)
    for f in files:
        m = _NAME.match(Path(f).name)
        if m is None:
            raise ValueError(f"{f}: not <group>-engine-<i>.steps.jsonl")
        with open(f, encoding="utf-8") as fh:
            groups[m["group"]][int(m["i"])] = [json.loads(line) for line in fh if line.strip()]
    return groups


def summarise(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine's trace (its decoded JSON lines, in order) -> figures."""
    submit: dict[str, dict[str, Any]] = {}
    first: dict[str, dict[str, Any]] = {}
    ttft: list[float] = []
    tpot: list[float] = []
    prompt = cached = pf = steps = dec_steps = dec = ctx = 0
    busy = dec_ms = mixed_ms = tok_ms = late = 0.0
    handler: list[float] = []
    for e in lines:
        ev = e["ev"]
        if ev == "step":
            steps += 1
            busy += e["d"]
            pf += e["pf"]
            late += e["late"]
            if e["dec"]:
                dec_steps += 1
                dec += e["dec"]
                ctx += e["ctx"]
                dec_ms += e["d"]
                tok_ms += e["dec"] * e["d"]
                if e["pf"]:
                    mixed_ms += e["d"]
        elif ev == "submit":
            submit[e["rid"]] = e
            prompt += e["prompt"]
            handler.append(e["handler_ms"])
        elif ev == "first":
            first[e["rid"]] = e
            cached += e["cached"]
            if e["rid"] in submit:
                ttft.append(e["t"] - submit[e["rid"]]["t"])
        elif ev == "done":
            f = first.get(e["rid"])
            if f is not None and e["tokens"] > 1:
                tpot.append((e["t"] - f["t"]) / (e["tokens"] - 1))

    def mean(xs: list[float]) -> float | None:
        return round(statistics.fmean(xs), 1) if xs else None

    return {
        "requests": len(submit),
        "prefill_tokens": pf,
        "cached_share": round(cached / prompt, 3) if prompt else None,
        "steps": steps,
        "busy_ms": round(busy),
        "mean_decode_batch": round(dec / dec_steps, 2) if dec_steps else None,
        "mean_decode_context": round(ctx / dec) if dec else None,
        "mixed_share": round(mixed_ms / dec_ms, 3) if dec_ms else None,
        "token_step_ms": round(tok_ms / dec, 1) if dec else None,
        "engine_ttft_ms": mean(ttft),
        "engine_tpot_ms": mean(tpot),
        "late_share": round(late / busy, 4) if busy else None,
        "handler_ms": {"mean": mean(handler), "max": round(max(handler), 1) if handler else None},
        "_tpot": tpot,
        "_ttft": ttft,
    }


def group_summary(engines: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over a fleet's engines (request-weighted means where per request)."""
    tpot = [x for e in engines for x in e["_tpot"]]
    ttft = [x for e in engines for x in e["_ttft"]]
    busy = sum(e["busy_ms"] for e in engines)
    return {
        "requests_per_engine": [e["requests"] for e in engines],
        "busy_ms_per_engine": [e["busy_ms"] for e in engines],
        "prefill_tokens": sum(e["prefill_tokens"] for e in engines),
        "engine_ttft_ms": round(statistics.fmean(ttft), 1) if ttft else None,
        "engine_tpot_ms": round(statistics.fmean(tpot), 1) if tpot else None,
        "engine_tpot_p90_ms": round(sorted(tpot)[int(0.9 * (len(tpot) - 1))], 1) if tpot else None,
        "late_share": round(sum(e["late_share"] * e["busy_ms"] for e in engines) / busy, 4)
        if busy
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", help="*.steps.jsonl (live or simulated)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    try:
        groups = read_traces(a.files)
    except ValueError as err:
        p.error(str(err))
    out: dict[str, Any] = {}
    for g, by_i in sorted(groups.items()):
        engines = [summarise(by_i[i]) for i in sorted(by_i)]
        out[g] = {
            "fleet": group_summary(engines),
            "engines": [{k: v for k, v in e.items() if not k.startswith("_")} for e in engines],
        }
    emit_json(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
