"""The simulator's outputs for a fixed set of inputs, to show a speed change changed no result.

Writes, per case, the summary ``tideserve sim`` reports without its wall-clock fields, plus the
run's event count and a SHA-256 of every request's (index, instance, first token, last token,
cached tokens, error), as ``DIR/<case>.json``; with ``--against OLD_DIR`` it then says per
case whether the two files are byte-identical (exit status 1 when one is not).

    .venv/bin/python benchmarks/sim_outputs.py --out /tmp/after --against /tmp/before

Cases: 8 and 1,000 instances, aggregated and P/D, the Mooncake conversation trace and the
agentic ``weka_agentic_dev.jsonl`` trace, two gateway replicas (``--cases`` picks some).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.common.bench.traces import load_trace  # noqa: E402
from services.sim import SimConfig, simulate  # noqa: E402

TRACES = Path("/work/shared/traces")
MOON, WEKA = "mooncake_conversation_trace.jsonl", "weka_agentic_dev.jsonl"
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "agg8_moon": (MOON, {"engines": 8, "max_requests": 3000, "rate_scale": 2.5}),
    "agg1000_moon": (MOON, {"engines": 1000, "max_requests": 4000, "rate_scale": 312.5}),
    "pd8_moon": (MOON, {"prefill": 4, "decode": 4, "max_requests": 2000, "rate_scale": 2.0}),
    "agg8_weka": (WEKA, {"engines": 8, "max_requests": 1500, "rate_scale": 1.0}),
    "agg1000_weka": (WEKA, {"engines": 1000, "max_requests": 3000, "rate_scale": 100.0}),
    "pd1000_moon": (
        MOON, {"prefill": 500, "decode": 500, "max_requests": 2000, "rate_scale": 200.0}
    ),
    "agg8_moon_2gw": (
        MOON, {"engines": 8, "max_requests": 2000, "rate_scale": 2.5, "gateways": 2}
    ),
}  # fmt: skip


def outputs(traces: Path, name: str) -> str:
    """Case ``name``'s outputs as the JSON text written."""
    trace_file, kw = CASES[name]
    doc, run = simulate(SimConfig(**kw), load_trace(str(traces / trace_file)))
    doc.pop("wall", None)
    reqs = [(r.index, r.target, r.first, r.last, r.cached, r.error) for r in run.requests]
    doc["_requests_sha"] = hashlib.sha256(json.dumps(reqs).encode()).hexdigest()
    doc["_events"] = run.events
    return json.dumps(doc, sort_keys=True, indent=1, default=str)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="directory for <case>.json")
    p.add_argument("--against", default=None, help="directory of earlier outputs to compare")
    p.add_argument("--cases", default=",".join(CASES), help="comma list of cases")
    p.add_argument("--traces", default=str(TRACES), help="directory of the trace files")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for name in a.cases.split(","):
        text = outputs(Path(a.traces), name)
        (out / f"{name}.json").write_text(text)
        verdict = "written"
        if a.against:
            old = Path(a.against) / f"{name}.json"
            same = old.exists() and old.read_text() == text
            differ += not same
            verdict = "identical" if same else "DIFFERENT"
        print(f"{name}: {verdict}", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
