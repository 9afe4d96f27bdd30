"""Decode instances that cannot compute a prompt (``decode_can_prefill=False``, e.g. SGLang
decode servers in disaggregation mode): the pd-decider and the scheduling cycle never keep
a request on such an instance alone; with no prefill endpoint the cycle answers NoEndpoint
(or uses a worker endpoint). The same tables with the capability show today's behaviour."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from services.common.routing.config import load_config, load_default
from services.common.routing.framework import CycleContext, Profile, Scheduler
from services.common.routing.registry import REGISTRY
from services.common.routing.types import (
    Choice,
    EndpointSnapshot,
    EndpointView,
    NoEndpoint,
    Pick,
    RequestView,
    Shed,
)
from services.scheduler.settings import SchedulerSettings
from tests.unit._routing_helpers import ENV, ctx, ep, req


def decider(can: bool, **params: Any) -> Any:
    spec = REGISTRY["pd-decider"]
    env = replace(ENV, decode_can_prefill=can)
    return spec.factory("pd", spec.params.model_validate(params), env)


# (role, prompt tokens, cached on the decode instance, busy prefill pool) -> disaggregate?
# Load rule on; LinearModel: 10,000 tokens/s; a busy pool has 20,000 tokens (2 s) queued.
CASES = [
    ("decode", 4000, 0, False),
    ("decode", 4000, 0, True),
    ("decode", 1000, 600, False),
    ("decode", 100, 0, False),
    ("worker", 5000, 0, False),
]
IDS = ["long-idle-pool", "long-busy-pool", "mostly-cached", "short", "worker"]


@pytest.mark.parametrize(
    ("can", "case", "expected"),
    [(True, c, e) for c, e in zip(CASES, [True, False, False, False, False], strict=True)]
    + [(False, c, e) for c, e in zip(CASES, [True, True, True, True, False], strict=True)],
    ids=[f"can-prefill-{i}" for i in IDS] + [f"cannot-prefill-{i}" for i in IDS],
)
def test_pd_decider_by_capability(
    can: bool, case: tuple[str, int, int, bool], expected: bool
) -> None:
    role, prompt, cached, busy = case
    d = decider(can, threshold_tokens=512, load_rule=True)
    if busy:
        p = Pick(Choice(ep("d"), 0.0), Choice(ep("p0", role="prefill"), 0.0), "x")
        d.on_pick(0.0, req("bg", prompt_tokens=20_000), p)
    c = ctx()
    c.cached_tokens["d"] = cached
    c.predicted_ttft_ms["d"] = 0.1 * (prompt - cached)  # idle decode instance
    choice = Choice(ep("d", role=role), 0.0)
    assert d.disaggregate(c, req(prompt_tokens=prompt), choice) is expected


class Never:
    name = "never"

    def disaggregate(self, ctx: CycleContext, request: RequestView, decode: object) -> bool:
        return False


class Only:
    """Scores 1 for the named instances, 0 otherwise."""

    def __init__(self, *ids: str) -> None:
        self.name = "only"
        self.ids = set(ids)

    def score(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Mapping[str, float]:
        return {e.instance_id: float(e.instance_id in self.ids) for e in candidates}


class DropAll:
    name = "drop-all"

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView] | Shed:
        return []


P1, P2 = ep("p1", role="prefill"), ep("p2", role="prefill")
D1, W1 = ep("d1", role="decode"), ep("w1", role="worker")
PD = EndpointSnapshot([P1, P2, D1])
NO_PREFILL = EndpointSnapshot([D1])
PREFILL_DOWN = EndpointSnapshot([replace(P1, healthy=False), D1])
MIXED_NO_PREFILL = EndpointSnapshot([D1, W1])


def sched(can: bool, *, prefill_filtered: bool = False, own_prefill: bool = True) -> Scheduler:
    """Profile ``d`` never wants to disaggregate (its decider says no); its prefill side
    prefers p2. ``own_prefill=False``: ``d`` names no prefill profile."""
    d = Profile(
        "d",
        scorers=((Only("d1"), 1.0),),
        decider=Never(),
        prefill_profile="p" if own_prefill else None,
    )
    p = Profile(
        "p",
        filters=(DropAll(),) if prefill_filtered else (),
        scorers=((Only("p2"), 1.0),),
    )
    return Scheduler({"d": d, "p": p}, "d", random.Random(0), decode_can_prefill=can)


CANNOT = "decode endpoints cannot compute prompts (decode_can_prefill=false)"

# (capability, snapshot, scheduler options, excluded) -> (decode, prefill), or the reason
# of a NoEndpoint answer
TABLE: list[tuple[bool, EndpointSnapshot, dict[str, bool], frozenset[str], Any]] = [
    (True, PD, {}, frozenset(), ("d1", None)),
    (False, PD, {}, frozenset(), ("d1", "p2")),
    (False, PD, {"own_prefill": False}, frozenset(), ("d1", "p1")),  # d's scorer: a tie
    (True, PD, {"own_prefill": False}, frozenset(), ("d1", None)),
    (True, NO_PREFILL, {}, frozenset(), ("d1", None)),
    (False, NO_PREFILL, {}, frozenset(), CANNOT),
    (False, PREFILL_DOWN, {}, frozenset(), CANNOT),
    (False, PD, {}, frozenset({"p1", "p2"}), CANNOT),
    (False, PD, {}, frozenset({"p2"}), ("d1", "p1")),
    (False, MIXED_NO_PREFILL, {}, frozenset(), ("w1", None)),
    (True, PD, {"prefill_filtered": True}, frozenset(), ("d1", None)),
    (False, PD, {"prefill_filtered": True}, frozenset(), "filter 'drop-all' left no endpoint"),
]


@pytest.mark.parametrize(
    ("can", "snapshot", "opts", "exclude", "expected"),
    TABLE,
    ids=[
        "can-decider-keeps-local",
        "cannot-always-splits",
        "cannot-profile-without-prefill-side-runs-itself",
        "can-profile-without-prefill-side-stays-local",
        "can-no-prefill-endpoint-decode-only",
        "cannot-no-prefill-endpoint",
        "cannot-prefill-unhealthy",
        "cannot-prefill-all-excluded",
        "cannot-one-prefill-excluded",
        "cannot-no-prefill-uses-worker",
        "can-prefill-filtered-decode-only",
        "cannot-prefill-filtered",
    ],
)
def test_cycle_by_capability(
    can: bool,
    snapshot: EndpointSnapshot,
    opts: dict[str, bool],
    exclude: frozenset[str],
    expected: Any,
) -> None:
    d = sched(can, **opts).schedule(req(exclude=exclude), snapshot, now=0.0)
    if isinstance(expected, str):
        assert isinstance(d, NoEndpoint) and expected in d.reason
        return
    assert isinstance(d, Pick)
    got = (d.decode.endpoint.instance_id, d.prefill.endpoint.instance_id if d.prefill else None)
    assert got == expected


@pytest.mark.parametrize("can", [True, False], ids=["can", "cannot"])
def test_config_carries_the_capability_to_the_scheduler_and_decider(can: bool) -> None:
    s = load_config(
        {
            "plugins": [
                {"name": "pd", "type": "pd-decider"},
                {"name": "rr", "type": "round-robin"},
            ],
            "profiles": {
                "d": {"plugins": ["rr", "pd"], "prefill_profile": "p"},
                "p": {"plugins": ["rr"]},
            },
            "default_profile": "d",
        },
        env=replace(ENV, decode_can_prefill=can),
    )
    assert s.decode_can_prefill is can
    assert s.profiles["d"].decider is not None
    short = s.schedule(req(prompt_tokens=10), PD, now=0.0)
    assert isinstance(short, Pick) and short.disaggregated is not can


@pytest.mark.parametrize(
    ("protocol", "setting", "expected"),
    [
        ("sglang", None, False),
        ("vllm", None, True),
        ("sglang", True, True),
        ("vllm", False, False),
    ],
    ids=["sglang-default", "vllm-default", "sglang-override", "vllm-override"],
)
def test_settings_derive_the_capability_from_the_protocol(
    protocol: str, setting: bool | None, expected: bool
) -> None:
    s = SchedulerSettings(pd_protocol=protocol, decode_can_prefill=setting)  # type: ignore[arg-type]
    assert s.decode_computes_prompts() is expected


# (uncached suffix on the decode instance, the prefill pick's predicted TTFT in ms,
# requests running / waiting on the decode instance) -> disaggregate? With the shipped
# default profile's decider, where decode engines can compute prompts: a suffix under 512
# tokens stays local; a longer one is priced. The decode instance's predicted TTFT is its
# own prefill (0.1 ms per token: 4 s for 40,000), plus 0.02 x running x that prefill.
DEFAULT_CASES = [
    (300, 0.0, 0, 0, False),
    (511, 0.0, 0, 0, False),
    (512, 0.0, 0, 0, True),  # priced: the idle prefill pick holds the prompt
    (40_000, 3000.0, 0, 0, True),
    (40_000, 5000.0, 0, 0, False),
    (40_000, 5000.0, 0, 1, True),  # backlogged decode instance
    (40_000, 4500.0, 10, 0, True),  # 4 s + 0.02 * 10 * 4 s = 4.8 s locally
    (40_000, 5000.0, 10, 0, False),
]


@pytest.mark.parametrize(
    ("uncached", "prefill_ms", "running", "waiting", "expected"),
    DEFAULT_CASES,
    ids=[
        "short",
        "under-threshold",
        "at-threshold",
        "long-prefill-faster",
        "long-local-faster",
        "long-decode-backlogged",
        "long-decodes-stalled",
        "long-decodes-stalled-local-still-faster",
    ],
)
def test_default_profile_prices_long_suffixes(
    uncached: int, prefill_ms: float, running: int, waiting: int, expected: bool
) -> None:
    s = load_default(env=replace(ENV, decode_can_prefill=True), rng=random.Random(0))
    d = s.profiles[s.default_profile].decider
    assert d is not None
    c = ctx()
    c.cached_tokens["d"] = 60_000
    c.predicted_ttft_ms.update({"d": 0.1 * uncached, "p0": prefill_ms})
    choice = Choice(ep("d", role="decode", running=running, waiting=waiting), 0.0)
    r = req(prompt_tokens=60_000 + uncached)
    wants = d.disaggregate(c, r, choice)
    if wants:
        wants = d.confirm(c, r, choice, Choice(ep("p0", role="prefill"), 0.0))  # type: ignore[attr-defined]
    assert wants is expected
