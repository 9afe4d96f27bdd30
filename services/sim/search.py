"""Searching deployments in simulation for the cheapest one that meets the SLOs (pure).

``tideserve recommend`` (:mod:`services.sim.recommend`) is the shell: it runs the
simulations this module asks for and writes what it decides. Nothing here does I/O; a run
is a callback, so the tests drive the search with made-up outcomes.

- A **family** is a layout and a routing profile: aggregated workers, or prefill and decode
  instances at a fixed P:D ratio. A **candidate** is a family at a size (its instances:
  the cost, in GPUs, when one engine is one GPU).
- :func:`judge` reads a simulated run's bench-shaped summary against the SLOs: at the SLO's
  percentile TTFT and TPOT are within their targets, no request failed, and at least
  ``min_attainment`` of the requests met both targets. A request longer than the model's
  context (:data:`BEYOND_CONTEXT`) fails on every deployment of that model, so it is counted
  apart (``Outcome.extra["beyond_context"]``), not against a candidate.
- :func:`smallest_passing` finds a family's smallest size that passes by bisection over
  ``[lo, hi]``, assuming more instances never serve the same traffic worse; it also
  returns every outcome it saw, so the table of what was tried is complete.
- :func:`refine` then varies the engine settings (batch limits, KV blocks per engine: the
  :data:`SETTINGS`; with agent memory also the KV-cache tier's size, :data:`TIER`) around
  the winner, one setting at a time (coordinate descent): every other value of a setting
  at one instance fewer, taking the best that passes and trying its values at one fewer
  again, until none passes; so a setting is changed only when it saves an instance, and a
  setting costs at most values x (instances saved + 1) runs.
  :func:`smallest_tier` then tries the smaller tiers at the winner's size.
- :func:`recommend` picks the cheapest passing candidate over all families (ties: higher
  attainment, then lower TTFT at the percentile, then fewer changed settings) and says for
  every other candidate why it lost.
- :func:`spec_of` is the deployment spec for ``tideserve apply -f``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "TIER",
    "Candidate",
    "Family",
    "Outcome",
    "Slo",
    "families",
    "judge",
    "recommend",
    "refine",
    "smallest_passing",
    "smallest_tier",
    "spec_of",
]

Layout = Literal["aggregated", "pd"]
PERCENTILES = (50, 90, 99)

SETTINGS: dict[str, str] = {
    "max_batch": "--max-batch",
    "max_batched_tokens": "--max-batched-tokens",
    "kv_blocks": "--kv-blocks",
}
"""The engine settings :func:`refine` varies, with the ``tideserve engine`` flag that sets
each (the spec's role ``args``): running sequences, tokens per step (the prefill chunk), and
KV blocks per engine (the cache each engine holds)."""

TIER = "tier_mib"
"""The KV-cache tier's size in MiB, a setting :func:`refine` varies like the engines' when the
search models agent memory: in the spec, a ``kvcache`` role of that size (``--kvcache-mib``)
and the engines' flags that offload to it (0: no tier)."""

TIER_ENGINE_ARGS = ("--kvcache-tier", "--kvcache-policy", "offload_on_evict")
"""The engine flags that store evicted KV blocks on the tier and look it up again."""

Settings = tuple[tuple[str, int], ...]

BEYOND_CONTEXT = "exceeds the context limit"
"""What an engine's refusal of a request longer than the model's context says."""


@dataclass(frozen=True, slots=True)
class Slo:
    """What a deployment must meet: TTFT and TPOT targets at a percentile of the requests
    (50, 90 or 99, the percentiles a summary has), and a share of requests meeting both."""

    ttft_ms: float
    tpot_ms: float
    percentile: int = 90
    min_attainment: float = 0.0

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.tpot_ms > 0):
            raise ValueError("the TTFT and TPOT targets must be > 0")
        if self.percentile not in PERCENTILES:
            raise ValueError(f"the percentile must be one of {PERCENTILES}, got {self.percentile}")
        if not 0.0 <= self.min_attainment <= 1.0:
            raise ValueError(f"the attainment must be in [0, 1], got {self.min_attainment}")


@dataclass(frozen=True, slots=True)
class Family:
    """A layout and routing profile; ``prefill_share``: P/D only, the prefill instances'
    share of the total (rounded, at least one of each role)."""

    layout: Layout
    profile: str
    prefill_share: float = 0.0

    def at(self, instances: int, settings: Settings = ()) -> Candidate:
        """This family with ``instances`` in all (and engine ``settings`` changed)."""
        if self.layout == "aggregated":
            return Candidate(self, engines=instances, settings=settings)
        prefill = min(instances - 1, max(1, round(instances * self.prefill_share)))
        return Candidate(self, prefill=prefill, decode=instances - prefill, settings=settings)

    @property
    def smallest(self) -> int:
        return 1 if self.layout == "aggregated" else 2

    @property
    def label(self) -> str:
        if self.layout == "aggregated":
            return f"aggregated, {self.profile}"
        return f"P/D {self.prefill_share:.2f} prefill, {self.profile}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment to simulate: ``engines`` aggregated workers, or ``prefill`` +
    ``decode`` instances; ``settings``: the engine settings (:data:`SETTINGS`) changed from
    the search's base, sorted by name."""

    family: Family
    engines: int = 0
    prefill: int = 0
    decode: int = 0
    settings: Settings = ()

    @property
    def instances(self) -> int:
        return self.engines or self.prefill + self.decode

    @property
    def label(self) -> str:
        fleet = f"{self.engines} workers" if self.engines else f"{self.prefill}P+{self.decode}D"
        changed = "".join(f", {k}={v}" for k, v in self.settings)
        return f"{fleet}, {self.family.profile}{changed}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A candidate's simulated run against the SLOs: the figures at the SLO's percentile,
    the share of requests meeting both targets, the failures, and the verdict."""

    candidate: Candidate
    ttft_ms: float
    tpot_ms: float
    attainment: float
    failed: int
    passes: bool
    why: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def families(
    layouts: Iterable[Layout], profiles: Iterable[str], prefill_shares: Sequence[float]
) -> list[Family]:
    """Every (layout, profile) family; P/D once per prefill share."""
    out: list[Family] = []
    for profile in profiles:
        for layout in layouts:
            if layout == "aggregated":
                out.append(Family("aggregated", profile))
            else:
                out += [Family("pd", profile, s) for s in prefill_shares]
    return out


def _quantile(summary: Mapping[str, Any], key: str, percentile: int) -> float:
    v = (summary.get(key) or {}).get(f"p{percentile}")
    return float(v) if isinstance(v, int | float) else float("inf")


def judge(candidate: Candidate, summary: Mapping[str, Any], slo: Slo) -> Outcome:
    """``candidate``'s run (a bench-shaped summary) against ``slo``."""
    p = slo.percentile
    ttft, tpot = _quantile(summary, "ttft_ms", p), _quantile(summary, "tpot_ms", p)
    attainment = float(summary.get("slo_attainment") or 0.0)
    errors = summary.get("errors") or {}
    beyond = sum(int(n) for m, n in errors.items() if BEYOND_CONTEXT in str(m))
    failed = int(summary.get("failed") or 0) - beyond
    misses = []
    if failed:
        misses.append(f"{failed} requests failed")
    if ttft > slo.ttft_ms:
        misses.append(f"TTFT p{p} {ttft:.0f} ms > {slo.ttft_ms:g}")
    if tpot > slo.tpot_ms:
        misses.append(f"TPOT p{p} {tpot:.1f} ms > {slo.tpot_ms:g}")
    if attainment < slo.min_attainment:
        misses.append(f"attainment {attainment:.3f} < {slo.min_attainment:g}")
    extra: dict[str, Any] = {"beyond_context": beyond} if beyond else {}
    return Outcome(candidate, ttft, tpot, attainment, failed, not misses, "; ".join(misses), extra)


def smallest_passing(
    family: Family, lo: int, hi: int, run: Callable[[Candidate], Outcome]
) -> tuple[Outcome | None, list[Outcome]]:
    """The outcome of ``family``'s smallest size in ``[lo, hi]`` that passes (None: not even
    ``hi`` does), and every outcome seen, by bisection (``hi`` first: a family that fails at
    its largest size costs one run)."""
    lo = max(lo, family.smallest)
    seen: list[Outcome] = []
    if lo > hi:
        return None, seen
    best = run(family.at(hi))
    seen.append(best)
    if not best.passes:
        return None, seen
    top = hi  # passes
    while lo < top:
        mid = (lo + top) // 2
        got = run(family.at(mid))
        seen.append(got)
        if got.passes:
            top, best = mid, got
        else:
            lo = mid + 1
    return best, seen


def _ranker(tier_base: int = 0) -> Callable[[Outcome], tuple[int, int, float, float, int, str]]:
    """Cheapest first: fewer instances, then a smaller tier (``tier_base``: the tier of a
    candidate that does not change it), then higher attainment, lower TTFT, fewer changes."""

    def rank(o: Outcome) -> tuple[int, int, float, float, int, str]:
        c = o.candidate
        tier = dict(c.settings).get(TIER, tier_base)
        return (c.instances, tier, -o.attainment, o.ttft_ms, len(c.settings), c.label)

    return rank


def _with(settings: Settings, name: str, value: int, default: int) -> Settings:
    """``settings`` with ``name`` at ``value`` (left out at its ``default``), sorted."""
    kept = {k: v for k, v in settings if k != name}
    if value != default:
        kept[name] = value
    return tuple(sorted(kept.items()))


def refine(
    best: Outcome,
    axes: Sequence[tuple[str, Sequence[int]]],
    defaults: Mapping[str, int],
    run: Callable[[Candidate], Outcome],
) -> tuple[Outcome, list[Outcome]]:
    """``best`` with engine settings that let fewer instances pass (see the module
    docstring): (the new best, every outcome seen). ``axes``: each setting's values to try;
    ``defaults``: each setting's value in the base."""
    seen: list[Outcome] = []
    cur = best
    for name, values in axes:
        moved = False  # this setting changed: its value now is worth one fewer too
        while cur.candidate.instances > cur.candidate.family.smallest:
            c = cur.candidate
            now = dict(c.settings).get(name, defaults[name])
            tried = [
                run(c.family.at(c.instances - 1, _with(c.settings, name, v, defaults[name])))
                for v in dict.fromkeys(values)
                if v != now or moved
            ]
            seen += tried
            passing = [o for o in tried if o.passes]
            if not passing:
                break
            cur, moved = min(passing, key=_ranker(defaults.get(TIER, 0))), True
    return cur, seen


def smallest_tier(
    best: Outcome, values: Sequence[int], base: int, run: Callable[[Candidate], Outcome]
) -> tuple[Outcome, list[Outcome]]:
    """``best`` with the smallest tier below its own, of ``values`` and the ``base``, that
    still passes at its size (a smaller tier costs less; the instances stay): (the new
    best, every outcome seen)."""
    c = best.candidate
    now = dict(c.settings).get(TIER, base)
    seen: list[Outcome] = []
    for v in sorted({*values, base}):
        if v >= now:
            break
        got = run(c.family.at(c.instances, _with(c.settings, TIER, v, base)))
        seen.append(got)
        if got.passes:
            return got, seen
    return best, seen


def recommend(
    outcomes: Sequence[Outcome], tier_base: int = 0
) -> tuple[Outcome | None, list[tuple[Outcome, str]]]:
    """The cheapest passing outcome (None: none passes) and every outcome with why it is
    not the recommendation ("" for the recommendation itself), cheapest first
    (``tier_base``: the tier of the candidates that do not change it)."""
    _rank = _ranker(tier_base)
    passing = sorted((o for o in outcomes if o.passes), key=_rank)
    best = passing[0] if passing else None
    table: list[tuple[Outcome, str]] = []
    for o in sorted(outcomes, key=_rank):
        if o is best:
            why = ""
        elif not o.passes:
            why = f"misses: {o.why}"
        else:
            assert best is not None
            if o.candidate.instances > best.candidate.instances:
                why = f"passes, but {o.candidate.instances} instances > {best.candidate.instances}"
            elif _rank(o)[1] > _rank(best)[1]:
                why = "passes, but with a larger tier"
            else:
                why = "passes at the same cost with lower attainment, higher TTFT or more changes"
        table.append((o, why))
    return best, table


def spec_of(
    candidate: Candidate,
    *,
    name: str,
    model: str,
    perf_profile: str,
    slo: Slo,
    engine_args: Sequence[str] = (),
    max_replicas: int | None = None,
    settings: Mapping[str, int] | None = None,
    planner: Mapping[str, Any] | None = None,
    keep_min: bool = False,
) -> dict[str, Any]:
    """A deployment spec (``tideserve apply -f``) that runs ``candidate`` with simulated
    engines: its replicas as each role's start, room to scale to ``max_replicas`` (default:
    twice the start), and the SLO as the ``interactive`` class the planner holds it to.
    The engine settings (``settings``, the base's, with the candidate's changes over them)
    are the engines' flags in each role's ``args``; a :data:`TIER` above 0 is one
    ``kvcache`` instance of that size, which the engines offload to; ``planner``: the
    spec's ``planner`` section; ``keep_min``: each role's minimum is its start (the planner
    never scales below the recommended fleet)."""
    every = {**(settings or {}), **dict(candidate.settings)}
    engine_args = [*engine_args]
    for setting, flag in SETTINGS.items():
        if setting in every:
            engine_args += [flag, str(every[setting])]
    tier = every.get(TIER, 0)
    if tier:
        engine_args += TIER_ENGINE_ARGS

    def role(rname: str, kind: str, n: int, **extra: Any) -> dict[str, Any]:
        top = max(n, max_replicas if max_replicas is not None else 2 * n)
        return {
            "name": rname,
            "role": kind,
            "replicas": n,
            "min_replicas": n if keep_min else 1,
            "max_replicas": top,
            "engine": "sim",
            "args": list(engine_args),
            **extra,
        }

    if candidate.engines:
        roles = [role("worker", "worker", candidate.engines)]
    else:
        roles = [
            role("prefill", "prefill", candidate.prefill),
            role("decode", "decode", candidate.decode, dependencies=["prefill"]),
        ]
    if tier:
        roles.append({
            "name": "kvcache", "role": "kvcache", "replicas": 1, "min_replicas": 1,
            "max_replicas": 1, "engine": "sim", "args": ["--kvcache-mib", str(tier)],
        })  # fmt: skip
    spec: dict[str, Any] = {
        "name": name,
        "model": model,
        "perf_profile": perf_profile,
        "scheduler_profile": candidate.family.profile,
        "roles": roles,
        "slo_classes": [
            {
                "name": "interactive",
                "priority": 10,
                "ttft_ms": slo.ttft_ms,
                "tpot_ms": slo.tpot_ms,
                "percentile": slo.percentile,
            }
        ],
    }
    if not candidate.engines:
        spec["pd_protocol"] = "sglang"
    if planner:
        spec["planner"] = dict(planner)
    return spec
