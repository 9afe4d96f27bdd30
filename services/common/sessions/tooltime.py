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

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddsketch import LogCollapsingLowestDenseDDSketch

__all__ = [
    "ALL_TOOLS",
    "NO_TOOL",
    "GapEstimate",
    "GapQuantiles",
    "GapSketch",
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
    source: str  # "agent_tool" | "tool" | "session" | "global" | "default"


@dataclass(frozen=True, slots=True)
class GapQuantiles:
    """One distribution's percentiles: ``agent`` "" across agents, ``tool`` :data:`NO_TOOL`
    for turns that ended in an answer and :data:`ALL_TOOLS` for every gap."""

    agent: str
    tool: str
    samples: int
    seconds: tuple[float, ...]


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

    def __len__(self) -> int:
        """Distributions held (bounded by ``max_keys``)."""
        return len(self._sketches)

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

    def _level(self, agent: str, tools: Sequence[str], q: float) -> GapEstimate | None:
        """The slowest tool's percentile when every tool is confident at this level."""
        worst: float | None = None
        fewest: int | None = None
        for t in tools:
            sk = self._sketches.get((agent, t))
            v = sk.quantile(q) if sk is not None and sk.count >= self.min_samples else None
            if sk is None or v is None:
                return None
            worst = v if worst is None else max(worst, v)
            fewest = sk.count if fewest is None else min(fewest, sk.count)
        if worst is None or fewest is None:
            return None
        return GapEstimate(worst, fewest, "tool" if agent == _ANY_AGENT else "agent_tool")

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
        glob = self._sketches.get((_ALL, _ALL))
        if glob is not None and glob.count >= self.min_samples:
            v = glob.quantile(q)
            if v is not None:
                return GapEstimate(v, glob.count, "global")
        return GapEstimate(self.default_gap_s, 0, "default")
