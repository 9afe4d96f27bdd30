"""Predicted tool time: how long a turn that ended in tool calls keeps its session away (pure).

An observation is (the tool names the turn ended in, the agent, the gap from that turn's end
to the next turn's arrival). The predictor keeps, per (agent, tool) and per tool across
agents, a bounded-memory distribution of gaps and answers a percentile of the predicted gap
with its confidence (the number of observations behind it).

Fallback order of :meth:`ToolTimePredictor.predict`, the first confident level wins:

1. every tool of the turn has ``min_samples`` observations for this agent;
2. every tool has ``min_samples`` observations across agents;
3. the session's own recent gaps (``session_min_samples`` of them);
4. every gap observed by this predictor (``min_samples``);
5. ``default_gap_s`` (zero samples).

Priors (:meth:`ToolTimePredictor.set_priors`): distributions learned elsewhere (telemetry's,
from the request records), each a percentile grid of gap seconds and the number of gaps
behind it. At levels 1, 2 and 4, a tool whose own distribution is not yet confident answers
from its prior when the prior has ``min_samples`` gaps; the level's source is then prefixed
``prior_`` (``prior_agent_tool``, ``prior_tool``, ``prior_global``), and a turn whose tools mix
own and prior distributions counts as ``prior_``. A confident own distribution always wins
over a prior at the same level; the levels keep their order (a prior for the tool beats the
session's own history and every gap seen, as the tool's own distribution would). A prior
answers a percentile by linear interpolation between the grid's two neighbouring points;
outside the grid it answers the nearest end (below the lowest percentile the lowest value,
above the highest the highest value: it does not extrapolate, so a percentile above the grid
is underestimated). Priors replace each other whole; they are never mixed into the sketches.

A turn that called several tools waits for the slowest of them: its prediction is the largest
of its tools' percentiles, and its confidence the smallest of their counts. A gap observed
after such a turn counts for each of its tools. A turn that ended in an answer, not a tool
call, is the tool :data:`NO_TOOL` (the time a person takes to reply).

Memory: each distribution is two DDSketch sketches (relative error ``relative_accuracy``,
at most ``bin_limit`` bins each), the one being filled and the previous one; when the current
one holds ``rotate_after`` observations it becomes the previous and a new one starts, so a
distribution follows drift and never remembers more than ``2 * rotate_after`` observations.
At most ``max_keys`` distributions are kept, the least recently observed dropped first.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from ddsketch import LogCollapsingLowestDenseDDSketch

__all__ = [
    "ALL_TOOLS",
    "NO_TOOL",
    "GapEstimate",
    "GapQuantiles",
    "GapSketch",
    "PriorGrid",
    "ToolTimePredictor",
    "nearest_rank",
]

NO_TOOL = ""
"""The tool name of a turn that ended in an answer (the agent waits on a person)."""

ALL_TOOLS = "*"
"""The tool name :meth:`ToolTimePredictor.quantiles` gives the distribution of every gap."""

_ANY_AGENT = "\x00any"
_ALL = "\x00all"


@dataclass(frozen=True, slots=True)
class GapEstimate:
    """A predicted gap in seconds at a percentile, and what it rests on."""

    seconds: float
    samples: int
    source: str  # "agent_tool" | "tool" | "session" | "global" | "default", or "prior_" +
    # "agent_tool" | "tool" | "global" (module doc)


@dataclass(frozen=True, slots=True)
class GapQuantiles:
    """One distribution's percentiles: ``agent`` "" across agents, ``tool`` :data:`NO_TOOL`
    for turns that ended in an answer and :data:`ALL_TOOLS` for every gap."""

    agent: str
    tool: str
    samples: int
    seconds: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class PriorGrid:
    """A distribution learned elsewhere: ``seconds[i]`` is its ``percentiles[i]`` percentile,
    from ``samples`` gaps. Percentiles strictly increasing in (0, 1]; seconds are made
    non-decreasing (a running maximum) and at least 0."""

    samples: int
    percentiles: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, percentiles: Sequence[float], samples: int, seconds: Sequence[float]) -> PriorGrid:
        """ValueError for an empty or unordered grid, a length mismatch or a non-finite value."""
        qs = tuple(float(q) for q in percentiles)
        if not qs or any(not 0.0 < q <= 1.0 for q in qs):
            raise ValueError(f"prior percentiles must be in (0, 1], got {list(qs)}")
        if any(b <= a for a, b in pairwise(qs)):
            raise ValueError(f"prior percentiles must increase, got {list(qs)}")
        if len(seconds) != len(qs):
            raise ValueError(f"{len(seconds)} prior values for {len(qs)} percentiles")
        if any(not math.isfinite(v) for v in seconds):
            raise ValueError("prior values must be finite")
        out: list[float] = []
        for v in seconds:
            out.append(max(0.0, v, out[-1] if out else 0.0))
        return cls(max(0, samples), qs, tuple(out))

    def at(self, q: float) -> float:
        """The ``q`` percentile: interpolated inside the grid, the nearest end outside it."""
        qs, vs = self.percentiles, self.seconds
        if q <= qs[0]:
            return vs[0]
        if q >= qs[-1]:
            return vs[-1]
        i = bisect.bisect_left(qs, q)  # qs[i - 1] < q <= qs[i]
        lo, hi = qs[i - 1], qs[i]
        return vs[i - 1] + (vs[i] - vs[i - 1]) * (q - lo) / (hi - lo)


class GapSketch:
    """A gap distribution: two rotating DDSketch generations (module doc)."""

    def __init__(self, relative_accuracy: float, bin_limit: int, rotate_after: int) -> None:
        self._acc, self._bins, self._rotate = relative_accuracy, bin_limit, rotate_after
        self._cur = self._new()
        self._prev: LogCollapsingLowestDenseDDSketch | None = None

    def _new(self) -> LogCollapsingLowestDenseDDSketch:
        return LogCollapsingLowestDenseDDSketch(relative_accuracy=self._acc, bin_limit=self._bins)

    def add(self, gap_s: float) -> None:
        if self._cur.count >= self._rotate:
            self._prev, self._cur = self._cur, self._new()
        self._cur.add(gap_s)

    @property
    def count(self) -> int:
        prev = self._prev.count if self._prev is not None else 0.0
        return int(self._cur.count + prev)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of both generations; None when empty."""
        if self._prev is None:
            v = self._cur.get_quantile_value(q)
        else:
            both = self._new()
            both.merge(self._prev)
            both.merge(self._cur)
            v = both.get_quantile_value(q)
        return None if v is None else max(0.0, float(v))


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0..1) of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class ToolTimePredictor:
    """Learns gap distributions per (agent, tool) and per tool; predicts with fallbacks."""

    def __init__(
        self,
        *,
        min_samples: int = 20,
        session_min_samples: int = 3,
        default_gap_s: float = 30.0,
        relative_accuracy: float = 0.02,
        bin_limit: int = 512,
        rotate_after: int = 2000,
        max_keys: int = 4096,
    ) -> None:
        if min_samples < 1 or session_min_samples < 1:
            raise ValueError("min_samples and session_min_samples must be >= 1")
        if not 0.0 < relative_accuracy < 1.0 or bin_limit < 16 or rotate_after < 1:
            raise ValueError("relative_accuracy in (0, 1), bin_limit >= 16, rotate_after >= 1")
        if max_keys < 2 or default_gap_s < 0.0:
            raise ValueError("max_keys >= 2 and default_gap_s >= 0")
        self.min_samples = min_samples
        self.session_min_samples = session_min_samples
        self.default_gap_s = default_gap_s
        self._args = (relative_accuracy, bin_limit, rotate_after)
        self.max_keys = max_keys
        self._sketches: OrderedDict[tuple[str, str], GapSketch] = OrderedDict()
        self._priors: dict[tuple[str, str], PriorGrid] = {}

    def __len__(self) -> int:
        """Distributions held (bounded by ``max_keys``)."""
        return len(self._sketches)

    @property
    def priors(self) -> int:
        """Prior distributions installed."""
        return len(self._priors)

    def set_priors(self, percentiles: Sequence[float], rows: Iterable[GapQuantiles]) -> None:
        """Replace the priors with ``rows`` (each row's ``seconds`` at ``percentiles``; agent
        "" is across agents, tool :data:`ALL_TOOLS` with agent "" every gap). Validates every
        row first (ValueError, :meth:`PriorGrid.of`): on an error the old priors stay."""
        new: dict[tuple[str, str], PriorGrid] = {}
        for r in rows:
            grid = PriorGrid.of(percentiles, r.samples, r.seconds)
            if r.tool == ALL_TOOLS and not r.agent:
                new[(_ALL, _ALL)] = grid
            else:
                new[(r.agent or _ANY_AGENT, r.tool)] = grid
        self._priors = new

    def observe(self, tools: Iterable[str], agent: str, gap_s: float) -> None:
        """One gap after a turn that ended in ``tools`` (empty: in an answer). A negative,
        NaN or infinite gap is ignored (clock skew between writers is not a sample)."""
        if not math.isfinite(gap_s) or gap_s < 0.0:
            return
        names = sorted(set(tools)) or [NO_TOOL]
        keys = [(_ALL, _ALL)]
        for t in names:
            keys.append((_ANY_AGENT, t))
            if agent:
                keys.append((agent, t))
        for k in keys:
            self._sketch(k).add(gap_s)

    def _sketch(self, key: tuple[str, str]) -> GapSketch:
        sk = self._sketches.get(key)
        if sk is None:
            sk = self._sketches[key] = GapSketch(*self._args)
            while len(self._sketches) > self.max_keys:
                old = next(iter(self._sketches))
                if old == (_ALL, _ALL):  # the global distribution is never dropped
                    self._sketches.move_to_end(old)
                    old = next(iter(self._sketches))
                del self._sketches[old]
        else:
            self._sketches.move_to_end(key)
        return sk

    def quantiles(self, qs: Sequence[float], min_samples: int = 0) -> list[GapQuantiles]:
        """Every distribution held with at least ``min_samples`` (and one) gaps, at the
        percentiles ``qs`` (each in (0, 1]), sorted by agent then tool."""
        if any(not 0.0 < q <= 1.0 for q in qs):
            raise ValueError(f"percentiles must be in (0, 1], got {list(qs)}")
        rows = []
        for (agent, tool), sk in self._sketches.items():
            if sk.count < max(1, min_samples):
                continue
            seconds = tuple(sk.quantile(q) or 0.0 for q in qs)
            if (agent, tool) == (_ALL, _ALL):
                rows.append(GapQuantiles("", ALL_TOOLS, sk.count, seconds))
            else:
                who = "" if agent == _ANY_AGENT else agent
                rows.append(GapQuantiles(who, tool, sk.count, seconds))
        return sorted(rows, key=lambda r: (r.agent, r.tool))

    def _confident(self, key: tuple[str, str], q: float) -> tuple[float, int, bool] | None:
        """(seconds, samples, from a prior) of one distribution: the own sketch when it is
        confident, else the prior when it is, else None."""
        sk = self._sketches.get(key)
        if sk is not None and sk.count >= self.min_samples:
            v = sk.quantile(q)
            if v is not None:
                return v, sk.count, False
        prior = self._priors.get(key)
        if prior is not None and prior.samples >= self.min_samples:
            return prior.at(q), prior.samples, True
        return None

    def _level(self, agent: str, tools: Sequence[str], q: float) -> GapEstimate | None:
        """The slowest tool's percentile when every tool is confident at this level."""
        worst: float | None = None
        fewest: int | None = None
        prior = False
        for t in tools:
            got = self._confident((agent, t), q)
            if got is None:
                return None
            v, n, from_prior = got
            worst = v if worst is None else max(worst, v)
            fewest = n if fewest is None else min(fewest, n)
            prior = prior or from_prior
        if worst is None or fewest is None:
            return None
        source = "tool" if agent == _ANY_AGENT else "agent_tool"
        return GapEstimate(worst, fewest, "prior_" + source if prior else source)

    def predict(
        self, tools: Iterable[str], agent: str, q: float, session_gaps: Sequence[float] = ()
    ) -> GapEstimate:
        """The ``q`` percentile (0..1) of the gap after a turn ending in ``tools`` (module
        doc: fallback order); ``session_gaps`` are the session's own recent gaps."""
        if not 0.0 < q <= 1.0:
            raise ValueError(f"percentile must be in (0, 1], got {q}")
        names = sorted(set(tools)) or [NO_TOOL]
        for who in ([agent] if agent else []) + [_ANY_AGENT]:
            est = self._level(who, names, q)
            if est is not None:
                return est
        own = [g for g in session_gaps if math.isfinite(g) and g >= 0.0]
        if len(own) >= self.session_min_samples:
            return GapEstimate(nearest_rank(own, q), len(own), "session")
        glob = self._confident((_ALL, _ALL), q)
        if glob is not None:
            v, n, from_prior = glob
            return GapEstimate(v, n, "prior_global" if from_prior else "global")
        return GapEstimate(self.default_gap_s, 0, "default")
