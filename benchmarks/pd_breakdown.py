"""Where a P/D fleet's time to first token goes, per request, in the simulator.

A DIAGNOSTIC TOOL over ``tideserve sim`` (:mod:`services.sim`): it runs one configuration
and splits each disaggregated request's TTFT into

* ``held``: waiting in the gateway's dispatch order;
* ``p_queue``: submitted to the prefill engine, not admitted yet (its queue);
* ``p_compute``: admitted until its prefill ended (chunks shared with other prompts);
* ``d_room``: the prefill ended, the decode engine had no KV room for it yet;
* ``xfer``: the modelled KV transfer;
* ``d_first``: the KV arrived until the first streamed chunk (16 tokens of decode).

Per decode engine (``decode_engines``): the turns handed to it, their mean ``d_room``, and
how many waited for room while another decode engine had room for them when their prefill
ended (its KV not held by running requests, at least the turn's context and output).

It also counts the tokens per turn: the prompt, what the prefill engine had cached, what
was transferred, and what the decode engine already held of the prompt when it admitted
the hand-off (``d_resident``; without ``--decode-keeps-kv`` the whole prompt moves anyway). Requests that ran on a
decode engine alone (``--decode-can-prefill``) are counted apart.

    .venv/bin/python benchmarks/pd_breakdown.py --trace ../shared/traces/weka_agentic_dev.jsonl \
        --offset 1200 --max-requests 600 --rate-scale 0.5 --prefill 4 --decode 4

The engine cores are observed by wrapping their admission (the script's own shim; the
cores are unchanged), so the run's decisions are those of ``tideserve sim``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.engine_core.core import EngineCore, EngineRole
from services.common.engine_core.core_types import _Seq
from services.sim.cli import config, workload
from services.sim.cli_args import add_arguments
from services.sim.compare import BASELINES, profile_config
from services.sim.fleet import Instance
from services.sim.records import SimRequest
from services.sim.results import summary
from services.sim.run import Simulation

PHASES = ("held", "p_queue", "p_compute", "d_room", "xfer", "d_first")


class Observed(Simulation):
    """The simulation, with per-request times noted at dispatch, admission and hand-off."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.t: dict[str, dict[str, float]] = {}
        self.decode_of: dict[str, str] = {}  # rid -> its decode engine
        self.room_elsewhere: dict[str, bool] = {}  # another decode engine had room at hand-off
        for inst in self.engines:
            self._watch(inst.core, inst.core.config.role)

    def _watch(self, core: EngineCore, role: EngineRole) -> None:
        admit = core._admit
        key = "p_admit" if role is EngineRole.PREFILL else "d_admit"

        def wrapped(s: _Seq, now: float) -> bool:
            ok = admit(s, now)
            if ok:
                rec = self.t.setdefault(s.req.rid, {})
                rec.setdefault(key, now)
                if role is EngineRole.DECODE and s.req.kv_transfer_ms is not None:
                    # the hand-off as this engine models it, and what it held of the prompt
                    rec["xfer"] = s.ready_at - now
                    rec["d_resident"] = float(alloc_blocks(core, s) * core.cache.block_size)
            return ok

        core._admit = wrapped  # type: ignore[method-assign]

    def dispatch(self, rids: list[str], now: float) -> int:
        for rid in rids:
            self.t.setdefault(rid, {})["dispatch"] = now
        return super().dispatch(rids, now)

    def hand_off(
        self, inst: Instance, req: SimRequest, prompt_tokens: int, cached: int, now: float
    ) -> None:
        rec = self.t.setdefault(req.rid, {})
        rec["handoff"] = now
        rec["p_cached"] = float(cached)
        rec["prompt"] = float(prompt_tokens)
        assert req.pick is not None
        dec = req.pick.decode.endpoint.instance_id
        self.decode_of[req.rid] = dec
        need = prompt_tokens + req.out
        self.room_elsewhere[req.rid] = any(
            room_tokens(e.core) >= need
            for e in self.engines
            if e.core.config.role is EngineRole.DECODE and e.iid != dec
        )
        super().hand_off(inst, req, prompt_tokens, cached, now)


def room_tokens(core: EngineCore) -> int:
    """KV tokens of ``core`` not held by running requests (idle cached blocks count)."""
    c = core.cache
    return (c.capacity_blocks - c.referenced_blocks) * c.block_size


def alloc_blocks(core: EngineCore, s: _Seq) -> int:
    """Prompt blocks ``s`` found resident on ``core`` at its admission."""
    alloc = core.cache._seqs.get(s.req.rid)
    return 0 if alloc is None else len(alloc.shared)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def breakdown(sim: Observed, reqs: list[SimRequest]) -> dict[str, Any]:
    """Mean ms per phase (disaggregated requests), tokens per turn, and the rest."""
    pd: list[tuple[SimRequest, dict[str, float]]] = []
    local: list[tuple[SimRequest, dict[str, float]]] = []
    for r in reqs:
        t = sim.t.get(r.rid, {})
        if r.first is None:
            continue
        (pd if "handoff" in t else local).append((r, t))
    phases: dict[str, list[float]] = {k: [] for k in PHASES}
    tokens: dict[str, list[float]] = {
        k: [] for k in ("prompt", "p_cached", "xfer_tokens", "d_resident")
    }
    for r, t in pd:
        d_admit = t.get("d_admit", t["handoff"])
        t.setdefault("xfer", 0.0)
        phases["held"].append(t["dispatch"] - r.arrival)
        phases["p_queue"].append(t["p_admit"] - t["dispatch"])
        phases["p_compute"].append(t["handoff"] - t["p_admit"])
        phases["d_room"].append(d_admit - t["handoff"])
        phases["xfer"].append(t["xfer"])
        assert r.first is not None
        phases["d_first"].append(r.first - d_admit - t["xfer"])
        tokens["prompt"].append(float(r.prompt_tokens))
        for k in ("p_cached", "d_resident"):
            tokens[k].append(t.get(k, 0.0))
        kept = t.get("d_resident", 0.0) if sim.cfg.decode_keeps_kv else 0.0
        tokens["xfer_tokens"].append(t.get("prompt", 0.0) - kept)
    ttft_pd = [r.first - r.arrival for r, _ in pd if r.first is not None]
    waits: dict[str, list[float]] = {}
    for (r, _), room in zip(pd, phases["d_room"], strict=True):
        waits.setdefault(sim.decode_of.get(r.rid, "?"), []).append(room)
    waited = [r.rid for (r, _), room in zip(pd, phases["d_room"], strict=True) if room > 0.0]
    ttft_local = [r.first - r.arrival for r, _ in local if r.first is not None]
    return {
        "disaggregated": len(pd),
        "ttft_ms_disaggregated": round(_mean(ttft_pd), 1),
        "phases_ms": {k: round(_mean(v), 1) for k, v in phases.items()},
        "tokens_per_turn": {k: round(_mean(v)) for k, v in tokens.items()},
        "local": len(local),
        "ttft_ms_local": round(_mean(ttft_local), 1),
        "local_phases_ms": _local_phases(local),
        "decode_engines": {
            k: {"turns": len(v), "d_room_ms": round(_mean(v), 1)} for k, v in sorted(waits.items())
        },
        "waited_for_room": len(waited),
        "waited_with_room_elsewhere": sum(sim.room_elsewhere.get(rid, False) for rid in waited),
    }


def _local_phases(local: list[tuple[SimRequest, dict[str, float]]]) -> dict[str, float]:
    """Mean ms of a request computed where it decodes: held in the gateway, queued in the
    engine, admitted to its first streamed chunk (its prefill and 16 decode steps)."""
    held, queue, run = [], [], []
    for r, t in local:
        if r.first is None or "dispatch" not in t or "d_admit" not in t:
            continue
        held.append(t["dispatch"] - r.arrival)
        queue.append(t["d_admit"] - t["dispatch"])
        run.append(r.first - t["d_admit"])
    return {
        "held": round(_mean(held), 1),
        "queue": round(_mean(queue), 1),
        "prefill_to_first": round(_mean(run), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args([*sys.argv[1:], "--out", "/dev/null"])  # the summary: not written
    cfg, trace, _ = workload(args, config(args))
    cfg = profile_config(cfg, cfg.profile, BASELINES).validate()
    sim = Observed(cfg, trace)
    run = sim.run()
    out = breakdown(sim, run.requests)
    doc = summary(run, wall_s=0.0, cpu_s=0.0)
    out["summary"] = {k: doc[k] for k in ("ttft_ms", "tpot_ms", "cache_hit_ratio", "failed")}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
