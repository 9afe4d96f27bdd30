"""The scheduling cycle: plugin protocols, profiles and the scheduler that runs them.

A cycle, for one request over one immutable :class:`EndpointSnapshot`:

1. Eligibility (built in, not configurable): drop endpoints that are unhealthy, draining,
   circuit-open or in ``request.exclude``.
2. The profile's :class:`Preparer` plugins run over the decode-side candidates (and, for
   P/D, the prefill-side ones) and record per-instance estimates in the :class:`CycleContext`
   (cached tokens, predicted TTFT) that later plugins read.
3. Filters run in declared order. A filter may return :class:`Shed` to refuse the request.
4. Scorers each return a score in [0, 1] per candidate; the framework clamps, multiplies by
   the profile's weight and sums. Scorers never see weights.
5. The picker chooses one candidate from the scored list.
6. P/D: if the profile names a ``prefill_profile`` and the snapshot has prefill-role
   endpoints, the profile's :class:`Decider` (default: always) decides from the decode pick
   whether to disaggregate; if so the prefill profile runs over prefill-role endpoints.
   When decode instances cannot compute a prompt (``decode_can_prefill=False``), a
   decode-role pick is always disaggregated (a profile without a ``prefill_profile`` runs
   itself over the prefill endpoints); with no eligible prefill endpoint only worker
   endpoints are candidates, and without any the answer is :class:`NoEndpoint`. A
   :class:`PricingDecider` then sees the prefill pick too and may keep the turn local.
7. Every :class:`PostPick` plugin that took part sees the final :class:`Pick`.

Everything is deterministic given the inputs, ``now`` and the injected ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

from services.common.routing.types import (
    Choice,
    Decision,
    EndpointSnapshot,
    EndpointView,
    NoEndpoint,
    Pick,
    RequestView,
    Shed,
)


@dataclass(slots=True)
class CycleContext:
    """Per-cycle scratch state shared by the plugins of one cycle (never across cycles).

    ``cached_tokens[iid]`` is the best estimate of the request's prompt tokens already cached
    on an instance (tier-weighted), or on their way there; preparers only ever raise it (max
    of estimates). ``unfinished_tokens[iid]`` is the part of it that only requests still
    prefilling there carry: it is where the prefix will be (placement, affinity), but not
    cached yet, so a request starting now computes it again (:meth:`ready_cached`).
    ``predicted_ttft_ms[iid]`` is filled by cost plugins, and ``prefill_ms_by_cached`` with
    the part no wait is in: the request's own prefill time by its ready cached token count
    (:meth:`own_prefill_ms`).
    """

    now: float
    rng: random.Random
    cached_tokens: dict[str, int] = field(default_factory=dict)
    unfinished_tokens: dict[str, int] = field(default_factory=dict)
    predicted_ttft_ms: dict[str, float] = field(default_factory=dict)
    prefill_ms_by_cached: dict[int, float] = field(default_factory=dict)

    def ready_cached(self, instance_id: str, prompt_tokens: int) -> int:
        """The prompt tokens cached on ``instance_id`` now, in [0, prompt_tokens]: the
        estimate without what is still being prefilled there."""
        cached = self.cached_tokens.get(instance_id, 0) - self.unfinished_tokens.get(instance_id, 0)
        return min(max(cached, 0), prompt_tokens)

    def own_prefill_ms(self, instance_id: str, prompt_tokens: int) -> float | None:
        """The request's own prefill on ``instance_id`` (its ready cache counted, no queue
        wait), None when no cost plugin predicted it."""
        return self.prefill_ms_by_cached.get(self.ready_cached(instance_id, prompt_tokens))

    def note_cached(self, instance_id: str, tokens: int) -> None:
        if tokens > self.cached_tokens.get(instance_id, 0):
            self.cached_tokens[instance_id] = tokens


@runtime_checkable
class Plugin(Protocol):
    """Every plugin has the unique instance name it was declared with in the config."""

    name: str


@runtime_checkable
class Preparer(Plugin, Protocol):
    def prepare(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> None:
        """Record estimates in ``ctx``; must not raise for any well-formed input."""


@runtime_checkable
class Filter(Plugin, Protocol):
    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView] | Shed:
        """Return a subset of ``candidates`` (order kept), possibly empty, or :class:`Shed`."""


@runtime_checkable
class Scorer(Plugin, Protocol):
    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        """Score per instance id in [0, 1]; higher is better. Missing ids score 0;
        values outside [0, 1] are clamped and NaN counts as 0."""


@runtime_checkable
class VectorScorer(Scorer, Protocol):
    """Optional fast path of a :class:`Scorer`: the framework calls ``score_list`` instead
    of ``score`` when a scorer has it. Same contract, as a list aligned with ``candidates``
    (one value per candidate; clamped and NaN-zeroed like ``score``'s)."""

    def score_list(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]: ...


def by_instance(candidates: Sequence[EndpointView], values: Sequence[float]) -> dict[str, float]:
    """``score_list`` output as ``score``'s mapping: the way a :class:`VectorScorer` defines
    ``score`` from its list."""
    return dict(zip((e.instance_id for e in candidates), values, strict=True))


@dataclass(frozen=True, slots=True)
class Scored:
    endpoint: EndpointView
    total: float
    detail: tuple[tuple[str, float, float], ...]


@runtime_checkable
class Picker(Plugin, Protocol):
    def pick(self, ctx: CycleContext, request: RequestView, scored: Sequence[Scored]) -> Scored:
        """Choose one of ``scored`` (never empty; ordered by instance id)."""


@runtime_checkable
class Decider(Plugin, Protocol):
    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: Choice) -> bool:
        """Whether to run a separate prefill, given the decode-side choice."""


@runtime_checkable
class PricingDecider(Decider, Protocol):
    """A decider that also sees the prefill side's pick before the turn is disaggregated:
    when ``disaggregate`` says yes (and the decode instance could compute the prompt), the
    prefill profile runs and ``confirm`` decides with both picks' estimates in the context;
    no means the decode pick computes the prompt itself."""

    def confirm(
        self, ctx: CycleContext, request: RequestView, decode: Choice, prefill: Choice
    ) -> bool: ...


@runtime_checkable
class PostPick(Plugin, Protocol):
    def on_pick(self, now: float, request: RequestView, pick: Pick) -> None:
        """Observe the final decision (update indexes). Idempotence is not required."""


@runtime_checkable
class Settle(Plugin, Protocol):
    def on_settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """A post-pick hook learns how its pick ended: ``ok`` once the instance answered
        (first byte) or the caller reported it, not ok when it failed before any byte
        (undo what ``on_pick`` recorded). Called at most once per pick; must not raise."""


@runtime_checkable
class SessionEnd(Plugin, Protocol):
    def end_session(self, session_id: str) -> bool:
        """The session ended (its final turn was answered): drop what is kept for it.
        True when something was dropped; must not raise."""


class MaxScorePicker:
    """Highest total score; ties go to the lowest instance id, or to a uniformly random one
    among the tied when ``random_ties`` (using the cycle's injected RNG)."""

    def __init__(self, name: str = "max-score", random_ties: bool = False) -> None:
        self.name = name
        self.random_ties = random_ties

    def pick(self, ctx: CycleContext, request: RequestView, scored: Sequence[Scored]) -> Scored:
        best = max(s.total for s in scored)
        tied = [s for s in scored if s.total >= best - 1e-12]
        if self.random_ties and len(tied) > 1:
            return tied[ctx.rng.randrange(len(tied))]
        return tied[0]


@dataclass(frozen=True)
class Profile:
    """A named pipeline. ``scorers`` pairs each scorer with its weight (> 0)."""

    name: str
    preparers: tuple[Preparer, ...] = ()
    filters: tuple[Filter, ...] = ()
    scorers: tuple[tuple[Scorer, float], ...] = ()
    picker: Picker = field(default_factory=MaxScorePicker)
    decider: Decider | None = None
    prefill_profile: str | None = None
    post_pick: tuple[PostPick, ...] = ()
    description: str = ""


def _clamp(x: float) -> float:
    if math.isnan(x):
        return 0.0
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


ScoreFn = Callable[[CycleContext, RequestView, Sequence[EndpointView]], list[float]]


def _as_list(scorer: Scorer) -> ScoreFn:
    """``scorer``'s scores as a list aligned with the candidates (missing ids score 0)."""
    vec = getattr(scorer, "score_list", None)
    if callable(vec):
        return cast(ScoreFn, vec)

    def listed(
        ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> list[float]:
        scores = scorer.score(ctx, request, candidates)
        if not scores:  # e.g. a session scorer for a request without a session
            return [0.0] * len(candidates)
        get = scores.get
        return [get(e.instance_id, 0.0) for e in candidates]

    return listed


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a profile's cycle needs, resolved once (no per-cycle protocol checks)."""

    scorers: tuple[tuple[str, float, ScoreFn], ...]
    # (random_ties) when the picker is the built-in max-score picker (picked over the
    # totals directly, without building a Scored per candidate); None otherwise.
    max_score_ties: bool | None
    settle: tuple[Settle, ...]


def _plan(prof: Profile) -> _Plan:
    picker = prof.picker
    fast = isinstance(picker, MaxScorePicker) and type(picker).pick is MaxScorePicker.pick
    return _Plan(
        scorers=tuple((s.name, w, _as_list(s)) for s, w in prof.scorers),
        max_score_ties=picker.random_ties if fast and isinstance(picker, MaxScorePicker) else None,
        settle=tuple(h for h in prof.post_pick if isinstance(h, Settle)),
    )


class Scheduler:
    """Runs scheduling cycles over named profiles. Plugins may keep state across cycles
    (indexes, counters); the scheduler itself keeps only the RNG."""

    def __init__(
        self,
        profiles: Mapping[str, Profile],
        default_profile: str,
        rng: random.Random,
        *,
        decode_can_prefill: bool = True,
    ) -> None:
        """``decode_can_prefill``: see :class:`~services.common.routing.registry.PluginEnv`
        and step 6 of the module docstring."""
        if default_profile not in profiles:
            raise ValueError(f"default profile {default_profile!r} is not defined")
        self.profiles = dict(profiles)
        self.default_profile = default_profile
        self.rng = rng
        self.decode_can_prefill = decode_can_prefill
        self._plans: dict[int, tuple[Profile, _Plan]] = {}

    def _plan_of(self, prof: Profile) -> _Plan:
        hit = self._plans.get(id(prof))
        if hit is None or hit[0] is not prof:
            hit = self._plans[id(prof)] = (prof, _plan(prof))
        return hit[1]

    def schedule(
        self,
        request: RequestView,
        snapshot: EndpointSnapshot,
        now: float,
        profile: str = "",
    ) -> Decision:
        """Decide where ``request`` goes. Raises ``KeyError`` for an unknown profile name."""
        prof = self.profiles[profile or self.default_profile]
        ctx = CycleContext(now=now, rng=self.rng)
        n_eligible, decode_pool, prefill_pool = snapshot.pools()
        must_split = not self.decode_can_prefill
        prefill_prof = self.profiles[prof.prefill_profile] if prof.prefill_profile else None
        if prefill_prof is None and must_split:
            prefill_prof = prof
        if not prefill_prof:
            prefill_pool = ()
        excl = request.exclude
        if excl:
            n_eligible -= sum(1 for e in snapshot if e.eligible and e.instance_id in excl)
            decode_pool = tuple(e for e in decode_pool if e.instance_id not in excl)
            prefill_pool = tuple(e for e in prefill_pool if e.instance_id not in excl)
        if must_split and not prefill_pool:
            decode_pool = tuple(e for e in decode_pool if e.role == "worker")
            if not decode_pool:
                return NoEndpoint(
                    f"no eligible prefill endpoint among {len(snapshot)} "
                    f"({len(snapshot) - n_eligible} unhealthy, draining, open or excluded), "
                    "and decode endpoints cannot compute prompts (decode_can_prefill=false)"
                )
        if not decode_pool:
            return NoEndpoint(
                f"no eligible decode/worker endpoint among {len(snapshot)} "
                f"({len(snapshot) - n_eligible} unhealthy, draining, open or excluded)"
            )
        decode = self._run(prof, ctx, request, decode_pool)
        if not isinstance(decode, Choice):
            return decode
        prefill: Choice | None = None
        used = [prof]
        if prefill_prof is not None and prefill_pool:
            if must_split and decode.endpoint.role == "decode":
                wants = True
            elif prof.decider:
                wants = prof.decider.disaggregate(ctx, request, decode)
            else:
                wants = True
            if wants:
                own = ctx.prefill_ms_by_cached  # the decode side's (a local turn's)
                p = self._run(prefill_prof, ctx, request, prefill_pool)
                if isinstance(p, Choice) and self._declined(prof, ctx, request, decode, p):
                    ctx.prefill_ms_by_cached = own
                elif isinstance(p, Choice):
                    prefill = p
                    if prefill_prof is not prof:
                        used.append(prefill_prof)
                elif must_split and decode.endpoint.role == "decode":
                    return p  # the decode instance cannot compute the prompt alone
                # Otherwise no prefill endpoint passed the filters: decode-only.
        target = prefill.endpoint.instance_id if prefill else decode.endpoint.instance_id
        decision = Pick(
            decode=decode,
            prefill=prefill,
            profile=prof.name,
            predicted_cached_tokens=ctx.ready_cached(target, request.prompt_tokens),
            predicted_ttft_ms=ctx.predicted_ttft_ms.get(target, 0.0),
            predicted_prefill_ms=ctx.own_prefill_ms(target, request.prompt_tokens) or 0.0,
        )
        if len(used) == 1:
            for hook in prof.post_pick:
                hook.on_pick(now, request, decision)
            return decision
        seen: set[int] = set()
        for p_ in used:
            for hook in p_.post_pick:
                if id(hook) not in seen:
                    seen.add(id(hook))
                    hook.on_pick(now, request, decision)
        return decision

    def _declined(
        self, prof: Profile, ctx: CycleContext, request: RequestView, decode: Choice, p: Choice
    ) -> bool:
        """A pricing decider turned the prefill pick down (the decode instance computes)."""
        d = prof.decider
        if not isinstance(d, PricingDecider):
            return False
        if not self.decode_can_prefill and decode.endpoint.role == "decode":
            return False
        return not d.confirm(ctx, request, decode, p)

    def settle(self, request: RequestView, pick: Pick, ok: bool) -> None:
        """Tell the post-pick hooks of the profiles that made ``pick`` how it ended (see
        :class:`Settle`). Unknown profiles are ignored."""
        prof = self.profiles.get(pick.profile)
        if prof is None:
            return
        hooks = self._plan_of(prof).settle
        if pick.prefill is not None and prof.prefill_profile in self.profiles:
            extra = self._plan_of(self.profiles[prof.prefill_profile]).settle
            if extra:
                hooks = hooks + extra
        seen: set[int] = set()
        for hook in hooks:
            if id(hook) not in seen:
                seen.add(id(hook))
                hook.on_settle(request, pick, ok)

    def end_session(self, session_id: str) -> int:
        """Tell every plugin keeping per-session state (:class:`SessionEnd`) that the session
        ended; how many dropped something."""
        seen: set[int] = set()
        dropped = 0
        for prof in self.profiles.values():
            for plugin in (*prof.post_pick, *(s for s, _ in prof.scorers)):
                if id(plugin) in seen or not isinstance(plugin, SessionEnd):
                    continue
                seen.add(id(plugin))
                dropped += plugin.end_session(session_id)
        return dropped

    def _run(
        self,
        prof: Profile,
        ctx: CycleContext,
        request: RequestView,
        pool: Sequence[EndpointView],
    ) -> Choice | Shed | NoEndpoint:
        for prep in prof.preparers:
            prep.prepare(ctx, request, pool)
        cands: Sequence[EndpointView] = pool
        for flt in prof.filters:
            out = flt.filter(ctx, request, cands)
            if isinstance(out, Shed):
                return out
            cands = out
            if not cands:
                return NoEndpoint(f"profile {prof.name!r}: filter {flt.name!r} left no endpoint")
        plan = self._plan_of(prof)
        n = len(cands)
        totals: list[float] | None = None
        columns: list[list[float]] = []
        for _name, weight, fn in plan.scorers:
            col = fn(ctx, request, cands)
            if len(col) != n:
                raise ValueError(f"scorer {_name!r} returned {len(col)} scores for {n} candidates")
            total = sum(col)
            top = max(col, default=0.0)
            if total != total or min(col, default=0.0) < 0.0 or top > 1.0:
                col = [s if 0.0 <= s <= 1.0 else _clamp(float(s)) for s in col]
            elif top == 0.0 and totals is not None and weight * 0.0 == 0.0:
                # every score 0: t + weight * 0.0 is t (no total is -0.0: they start at 0.0 +)
                columns.append(col)
                continue
            columns.append(col)
            # the first column starts the totals (the same sums as from zeros)
            if totals is None:
                totals = [0.0 + weight * s for s in col]
            else:
                totals = [t + weight * s for t, s in zip(totals, col, strict=True)]
        if totals is None:
            totals = [0.0] * n
        ties = plan.max_score_ties
        if ties is not None:
            if n == 1:
                i = 0
            else:
                cut = max(totals) - 1e-12
                if ties:
                    tied = [i for i, t in enumerate(totals) if t >= cut]
                    i = tied[ctx.rng.randrange(len(tied))] if len(tied) > 1 else tied[0]
                else:
                    i = next(i for i, t in enumerate(totals) if t >= cut)
            detail = tuple(
                [(name, col[i], w) for (name, w, _), col in zip(plan.scorers, columns, strict=True)]
            )
            return Choice(endpoint=cands[i], score=totals[i], scores=detail)
        scored = [
            Scored(
                e,
                totals[i],
                tuple(
                    (name, col[i], w)
                    for (name, w, _), col in zip(plan.scorers, columns, strict=True)
                ),
            )
            for i, e in enumerate(cands)
        ]
        chosen = prof.picker.pick(ctx, request, scored)
        return Choice(endpoint=chosen.endpoint, score=chosen.total, scores=chosen.detail)
