"""Virtual-time fleet for ``autoscaler_eval.py``: a tide of requests against P/D replicas.

Not the planner's model (the benchmark would be circular): ground truth here is a
request-level queue. Each virtual second, Poisson arrivals at the tide's rate, each with
(input, output) lengths drawn from a shared trace; prefill is a pooled queue over the ready
prefill replicas (a request waits for the work ahead divided by the replicas, then takes its
own ``prefill_ms`` from ``services.common.perfmodel``); decode runs every window's requests
at the batch where Little's law and ``decode_step_ms`` agree (a fixed point; TPOT at p90 is
the step at the batch's p90 under Poisson fluctuation, and a batch whose KV does not fit the
replica counts as a miss). Instances start ``startup_s`` after they are asked for and cost
replica-time from then; removals take starting instances first.
"""

from __future__ import annotations

import csv
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from services.common.perfmodel import PerfProfile

ROLES = ("prefill", "decode")


def load_tide(path: Path) -> list[float]:
    with path.open() as f:
        return [float(row["rate_rps"]) for row in csv.DictReader(f)]


def load_lengths(path: Path, limit: int = 20_000) -> list[tuple[int, int]]:
    with path.open() as f:
        rows = [
            (int(r["ContextTokens"]), max(1, int(r["GeneratedTokens"]))) for r in csv.DictReader(f)
        ]
    return rows[:limit]


@dataclass(frozen=True)
class Tide:
    """The trace's 10-minute rates compressed so one day lasts ``day_s`` virtual seconds."""

    rates: Sequence[float]
    day_s: float
    scale: float
    shift_rows: int = 0  # anti-phase: 72 rows = 12 h

    @property
    def row_s(self) -> float:
        return self.day_s / 144.0

    @property
    def duration_s(self) -> float:
        return len(self.rates) * self.row_s

    def rate(self, t: float) -> float:
        x = t / self.row_s
        i = int(x)
        a = self.rates[(i + self.shift_rows) % len(self.rates)]
        b = self.rates[(i + 1 + self.shift_rows) % len(self.rates)]
        return (a + (b - a) * (x - i)) * self.scale

    def peak(self) -> float:
        return max(self.rates) * self.scale


@dataclass
class Fleet:
    """Instances per role as (ready_at) times; a removal takes the newest first."""

    startup_s: float
    ready_at: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    replica_s: float = 0.0
    actions: int = 0
    started: int = 0

    def set_targets(self, now: float, targets: Mapping[str, int]) -> None:
        changed = False
        for role, n in targets.items():
            have = self.ready_at[role]
            if n > len(have):
                self.started += n - len(have)
                have.extend([now + self.startup_s] * (n - len(have)))
                changed = True
            elif n < len(have):
                have.sort()
                del have[n:]
                changed = True
        self.actions += changed

    def ready(self, role: str, now: float) -> int:
        return sum(1 for t in self.ready_at[role] if t <= now)

    def starting(self, role: str, now: float) -> int:
        return sum(1 for t in self.ready_at[role] if t > now)

    def tick_cost(self, dt: float) -> None:
        self.replica_s += dt * sum(len(v) for v in self.ready_at.values())


@dataclass(frozen=True)
class Window:
    requests: int
    rate_rps: float
    input_tokens: float
    output_tokens: float
    ttft_p: Mapping[int, float]
    tpot_p: Mapping[int, float]
    backlog: float  # requests waiting for prefill now
    decode_fits: bool


@dataclass
class Second:
    ttfts: list[float]
    n_in: int
    n_out: int
    decode_replicas: int


class Sim:
    """Drives one deployment's fleet through a tide, second by second."""

    def __init__(
        self,
        tide: Tide,
        lengths: Sequence[tuple[int, int]],
        perf: PerfProfile,
        startup_s: float,
        seed: int,
    ) -> None:
        self.tide = tide
        self.lengths = lengths
        self.perf = perf
        self.fleet = Fleet(startup_s)
        self.rng = random.Random(seed)
        self.backlog_ms = 0.0
        self.recent: deque[Second] = deque(maxlen=600)
        self._prefill_ms: dict[int, float] = {}

    def prefill_ms(self, n: int) -> float:
        v = self._prefill_ms.get(n)
        if v is None:
            v = self._prefill_ms[n] = self.perf.prefill_ms(n)
        return v

    def _poisson(self, lam: float) -> int:
        if lam > 50:  # normal approximation (fast, adequate at these rates)
            return max(0, round(self.rng.gauss(lam, math.sqrt(lam))))
        threshold, k, p = math.exp(-lam), 0, 1.0
        while True:
            p *= self.rng.random()
            if p <= threshold:
                return k
            k += 1

    def step(self, t: float) -> None:
        """Advance one virtual second starting at ``t``."""
        n = self._poisson(self.tide.rate(t))
        replicas = self.fleet.ready("prefill", t)
        offsets = sorted(self.rng.random() for _ in range(n))
        ttfts: list[float] = []
        n_in = n_out = 0
        last = 0.0
        for u in offsets:
            self.backlog_ms = max(0.0, self.backlog_ms - replicas * 1000.0 * (u - last))
            last = u
            inp, out = self.lengths[self.rng.randrange(len(self.lengths))]
            s = self.prefill_ms(inp)
            wait = self.backlog_ms / replicas if replicas else 1e9
            ttfts.append(wait + s)
            self.backlog_ms += s
            n_in += inp
            n_out += out
        self.backlog_ms = max(0.0, self.backlog_ms - replicas * 1000.0 * (1.0 - last))
        self.recent.append(Second(ttfts, n_in, n_out, self.fleet.ready("decode", t)))
        self.fleet.tick_cost(1.0)

    def window(self, seconds: int) -> Window:
        recent = list(self.recent)[-seconds:]
        ttfts = [x for s in recent for x in s.ttfts]
        count = len(ttfts)
        span = max(1, len(recent))
        mean_in = sum(s.n_in for s in recent) / count if count else 0.0
        mean_out = sum(s.n_out for s in recent) / count if count else 0.0
        ttft_p = (
            dict(zip((50, 90, 99), np.percentile(ttfts, [50, 90, 99]).tolist(), strict=True))
            if ttfts
            else {}
        )
        decode = sum(s.decode_replicas for s in recent) / span
        tpot, fits = self._tpot(count / span, mean_in, mean_out, decode)
        s_mean = self.prefill_ms(max(1, round(mean_in))) if count else 1.0
        return Window(
            requests=count,
            rate_rps=count / span,
            input_tokens=mean_in,
            output_tokens=mean_out,
            ttft_p=ttft_p,
            tpot_p=tpot,
            backlog=self.backlog_ms / max(s_mean, 1e-9),
            decode_fits=fits,
        )

    def _tpot(
        self, rate: float, mean_in: float, mean_out: float, replicas: float
    ) -> tuple[dict[int, float], bool]:
        if rate <= 0:
            return {}, True
        if replicas <= 0:
            return {50: 1e9, 90: 1e9, 99: 1e9}, False
        ctx = mean_in + mean_out / 2
        b = 1.0
        for _ in range(60):  # fixed point b = rate * out * step(b) / 1000 / replicas
            step = self.perf.decode_step_ms(max(1, round(b)), max(1, round(b * ctx)))
            nb = rate * mean_out * step / 1000.0 / replicas
            if nb > 1e5:
                return {50: 1e9, 90: 1e9, 99: 1e9}, False
            if abs(nb - b) < 0.01:
                b = nb
                break
            b = nb
        out: dict[int, float] = {}
        fits = True
        for p, z in ((50, 0.0), (90, 1.2816), (99, 2.3263)):
            bp = max(1, round(b + z * math.sqrt(b)))
            if bp * ctx > self.perf.kv_capacity_tokens:
                fits = False
            out[p] = self.perf.decode_step_ms(bp, round(bp * ctx))
        return out, fits


Policy = Callable[[float, Sim], Mapping[str, int]]


@dataclass
class Result:
    windows: int = 0
    met: int = 0
    ttft_missed: int = 0
    tpot_missed: int = 0
    peak_replicas: int = 0
    replica_series: list[int] = field(default_factory=list)
    # (virtual s, request rate, ready replicas per role) every tick, for --plot
    timeline: list[tuple[float, float, dict[str, int]]] = field(default_factory=list)

    @property
    def attainment(self) -> float:
        return self.met / self.windows if self.windows else 1.0


def score_window(
    w: Window, ttft_ms: float, tpot_ms: float, percentile: int, result: Result
) -> None:
    """One SLO window: met when both targets hold at ``percentile`` (or nothing arrived)."""
    result.windows += 1
    ttft_ok = not w.ttft_p or w.ttft_p[percentile] <= ttft_ms
    tpot_ok = not w.tpot_p or (w.tpot_p[percentile] <= tpot_ms and w.decode_fits)
    result.ttft_missed += not ttft_ok
    result.tpot_missed += not tpot_ok
    result.met += ttft_ok and tpot_ok
