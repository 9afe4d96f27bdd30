"""Session affinity across active-active gateway replicas, with and without shared state.

Several gateway replicas serve one address; a client's consecutive turns reach whichever
replica the kernel hands the connection to. A replica knows where a session's prefix sits
only from its own picks and, with ``share_state``, from the other replicas' routed
prefixes, which arrive a little later (``--share-delay-ms``). This measures, in virtual
time over the real pure cores (:class:`services.common.scheduling.GatewayCore`, the active-active
rules of :mod:`services.common.scheduling.shared_state`), how often a session's turn lands on
the instance that served its previous turn (``affinity``) and the share of prompt tokens
found in that instance's cache (``hit_ratio``), for:

* ``share``: off (replicas never hear of each other's picks or load) or on;
* ``home``: the default profile as shipped, with its ``session-home`` scorer (rendezvous
  hashing of the session over the candidates, the same on every replica), or without it.

Model: ``--sessions`` sessions start at random in the first ``--ramp-s`` seconds; each
has ``--turns`` turns, a first prompt of ``--first-tokens`` unique tokens, then the
previous prompt + the answer + ``--new-tokens`` new tokens; a turn is served at once by its
engine in prefill(uncached) + answer tokens x ``--tpot-ms`` (perf profile ``test``), the
next turn follows ``--think-s`` later, each turn to a uniformly random replica. Engines
keep every block they computed (an infinite cache): misses here are routing's alone.
In-flight load crosses replicas by heartbeat (``--heartbeat-s``) when sharing is on.

    .venv/bin/python benchmarks/replica_affinity.py --seeds 5

Prints JSON: per mode the mean, min and max over seeds of affinity and hit ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from services.common.perfmodel import get_profile  # noqa: E402
from services.common.routing.types import Pick, RequestView  # noqa: E402
from services.common.scheduling import EndpointSpec, GatewayCore, build_core  # noqa: E402
from services.common.scheduling.shared_state import (  # noqa: E402
    apply_routed,
    approx_plugins,
    heartbeat,
    merge_in_flight,
    routed_entry,
    routed_plugins,
)
from services.common.tokens import block_hashes  # noqa: E402

BLOCK = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--first-tokens", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--answer-tokens", type=int, default=128)
    p.add_argument("--tpot-ms", type=float, default=20.0)
    p.add_argument("--think-s", type=float, default=0.2)
    p.add_argument("--ramp-s", type=float, default=10.0)
    p.add_argument("--share-delay-ms", type=float, default=5.0)
    p.add_argument("--heartbeat-s", type=float, default=0.5)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument(
        "--home-weight", type=float, default=None, help="session-home weight (default: as shipped)"
    )
    return p.parse_args(argv)


def _core(engines: int, seed: int, home: bool, home_weight: float | None = None) -> GatewayCore:
    core = build_core(
        [EndpointSpec(f"e{i}", f"http://e{i}") for i in range(engines)],
        perf_profile="test",
        block_size=BLOCK,
        seed=seed,
    )
    prof = core.scheduler.profiles["default"]
    if not home:
        kept = tuple(s for s in prof.scorers if s[0].name != "home")
        core.scheduler.profiles["default"] = dataclasses.replace(prof, scorers=kept)
    elif home_weight is not None:
        w = tuple((s, home_weight if s.name == "home" else x) for s, x in prof.scorers)
        core.scheduler.profiles["default"] = dataclasses.replace(prof, scorers=w)
    return core


def run(a: argparse.Namespace, seed: int, share: bool, home: bool) -> dict[str, float]:
    rng = random.Random(seed)
    perf = get_profile("test")
    reps = [_core(a.engines, seed, home, a.home_weight) for _ in range(a.replicas)]
    plugins = [approx_plugins(c.scheduler) for c in reps]
    cache: dict[str, set[int]] = {f"e{i}": set() for i in range(a.engines)}
    ev: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(ev, (t, seq, kind, payload))
        seq += 1

    prompts: dict[int, list[int]] = {}
    last_engine: dict[int, str] = {}
    turns_done = {s: 0 for s in range(a.sessions)}
    kept = moved = hit = total = 0
    next_tok = 1
    for s in range(a.sessions):
        push(rng.uniform(0, a.ramp_s), "turn", s)
    if share:
        push(0.0, "beat", None)
    while ev:
        now, _, kind, p = heapq.heappop(ev)
        if kind == "beat":
            beats = [
                heartbeat(
                    c.fleet.own_in_flight(),
                    deployment="d",
                    replica_id=str(i),
                    ts_ms=int(now * 1000),
                )
                for i, c in enumerate(reps)
            ]
            for i, c in enumerate(reps):
                c.fleet.set_remote_in_flight(
                    merge_in_flight(
                        beats,
                        replica_id=str(i),
                        now_ms=int(now * 1000),
                        ttl_ms=int(a.heartbeat_s * 3000),
                    )
                )
            if any(turns_done[s] < a.turns for s in turns_done):
                push(now + a.heartbeat_s, "beat", None)
            continue
        if kind == "apply":
            i, entry = p
            apply_routed(
                plugins[i],
                entry,
                replica_id=str(i),
                now=now,
                wall_ms=int(now * 1000),
                max_age_s=600,
            )
            continue
        if kind == "done":
            r, rid = p
            reps[r].release(rid)
            continue
        s = p
        grow = a.first_tokens if s not in prompts else a.answer_tokens + a.new_tokens
        prompts.setdefault(s, []).extend(range(next_tok, next_tok + grow))
        next_tok += grow
        toks = prompts[s]
        hashes = tuple(block_hashes(toks, BLOCK))
        r = rng.randrange(a.replicas)
        rid = f"s{s}t{turns_done[s]}"
        view = RequestView(
            rid, len(toks), hashes, BLOCK, a.answer_tokens, session_id=f"sess-{seed}-{s}"
        )
        d = reps[r].pick(view, now, rid)
        assert isinstance(d, Pick), d
        iid = d.decode.endpoint.instance_id
        if s in last_engine:
            kept += last_engine[s] == iid
            moved += last_engine[s] != iid
        last_engine[s] = iid
        held = cache[iid]
        cached_blocks = next((k for k, h in enumerate(hashes) if h not in held), len(hashes))
        hit += cached_blocks * BLOCK
        total += len(toks)
        held.update(hashes)
        reps[r].first_token(rid)
        dur = perf.prefill_ms(len(toks) - cached_blocks * BLOCK, cached_blocks * BLOCK) / 1000
        dur += a.answer_tokens * a.tpot_ms / 1000
        push(now + dur, "done", (r, rid))
        if share:
            entry = routed_entry(
                view,
                d,
                routed_plugins(reps[r].scheduler, d),
                deployment="d",
                replica_id=str(r),
                ts_ms=int(now * 1000),
            )
            if entry is not None:
                for j in range(a.replicas):
                    if j != r:
                        push(now + a.share_delay_ms / 1000, "apply", (j, entry))
        turns_done[s] += 1
        if turns_done[s] < a.turns:
            push(now + dur + a.think_s, "turn", s)
    return {"affinity": kept / max(1, kept + moved), "hit_ratio": hit / max(1, total)}


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out: dict[str, Any] = {"tool": "replica_affinity (virtual time)", "args": vars(a), "modes": {}}
    for share in (False, True):
        for home in (False, True):
            runs = [run(a, seed, share, home) for seed in range(a.seeds)]
            mode = f"share_{'on' if share else 'off'}/home_{'on' if home else 'off'}"
            out["modes"][mode] = {
                k: {
                    "mean": round(statistics.fmean(r[k] for r in runs), 4),
                    "min": round(min(r[k] for r in runs), 4),
                    "max": round(max(r[k] for r in runs), 4),
                }
                for k in ("affinity", "hit_ratio")
            }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
