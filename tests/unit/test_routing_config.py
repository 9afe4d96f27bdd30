"""Config loading: named plugin instances, profiles with weights, clear errors."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.common.routing.config import ConfigError, load_config, load_default
from services.common.routing.types import EndpointSnapshot, Pick
from tests.unit._routing_helpers import ENV, ep, req


def cfg(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "default_profile": "main",
        "plugins": [
            {"name": "load", "type": "least-load"},
            {"name": "rr", "type": "round-robin"},
            {"name": "pd", "type": "pd-decider", "params": {"threshold_tokens": 8}},
        ],
        "profiles": {"main": {"plugins": [{"ref": "load", "weight": 2}]}},
    }
    base.update(over)
    return base


def test_valid_config_builds_profiles() -> None:
    s = load_config(cfg(), env=ENV)
    prof = s.profiles["main"]
    assert [(sc.name, w) for sc, w in prof.scorers] == [("load", 2.0)]
    assert prof.picker.name == "max-score"


BAD: list[tuple[dict[str, Any], str]] = [
    (cfg(plugins=[{"name": "x", "type": "nope"}]), "unknown type 'nope'"),
    (
        cfg(plugins=[{"name": "x", "type": "least-load"}, {"name": "x", "type": "round-robin"}]),
        "duplicate plugin name 'x'",
    ),
    (cfg(plugins=[{"name": "x", "type": "least-load", "params": {"bogus": 1}}]), "bogus"),
    (
        cfg(plugins=[{"name": "x", "type": "least-load", "params": {"waiting": -1}}]),
        "plugin 'x' (least-load): bad params: waiting",
    ),
    (cfg(plugins=[{"type": "least-load"}]), "'name' must be a non-empty string"),
    (cfg(plugins=[{"name": "x", "type": "least-load", "extra": 1}]), "unknown key"),
    (cfg(profiles={"main": {"plugins": ["ghost"]}}), "undefined plugin 'ghost'"),
    (cfg(profiles={"main": {"plugins": [{"ref": "load", "weight": 0}]}}), "must be a number > 0"),
    (cfg(profiles={"main": {"plugins": [{"ref": "load", "weight": "x"}]}}), "must be a number > 0"),
    (cfg(profiles={"main": {"plugins": [{"ref": "rr", "weight": 1}]}}), "not a scorer"),
    (cfg(profiles={"main": {"plugins": ["load", "load"]}}), "referenced twice"),
    (cfg(profiles={"main": {"plugins": []}}), "non-empty list"),
    (cfg(profiles={"main": {"plugins": ["load"], "typo": 1}}), "unknown key"),
    (cfg(profiles={}), "at least one profile"),
    (cfg(default_profile="other"), "default_profile 'other'"),
    (
        cfg(profiles={"main": {"plugins": ["load"], "prefill_profile": "gone"}}),
        "prefill_profile 'gone' is not defined",
    ),
    (
        {
            "plugins": [
                {"name": "a", "type": "round-robin"},
                {"name": "b", "type": "power-of-two"},
            ],
            "profiles": {"default": {"plugins": ["a", "b"]}},
        },
        "more than one picker",
    ),
    (
        {
            "plugins": [
                {"name": "length", "type": "length-bucket", "params": {"boundaries": [10, 5]}}
            ],
            "profiles": {"default": {"plugins": ["length"]}},
        },
        "strictly ascending",
    ),
    (
        {
            "plugins": [
                {"name": "k", "type": "precise-prefix", "params": {"tier_weights": {"gpu": 2}}}
            ],
            "profiles": {"default": {"plugins": ["k"]}},
        },
        "must be in [0, 1]",
    ),
    ({"plugins": [], "profiles": {"default": {"plugins": ["x"]}}, "zzz": 1}, "unknown key"),
]


@pytest.mark.parametrize(
    ("raw", "message"),
    BAD,
    ids=[
        "unknown-type",
        "duplicate-name",
        "unknown-param",
        "bad-param-value",
        "missing-name",
        "unknown-plugin-key",
        "undefined-ref",
        "zero-weight",
        "non-numeric-weight",
        "weight-on-picker",
        "ref-twice",
        "empty-profile",
        "unknown-profile-key",
        "no-profiles",
        "bad-default",
        "undefined-prefill-profile",
        "two-pickers",
        "bad-buckets",
        "tier-weight-range",
        "unknown-top-level-key",
    ],
)
def test_bad_configs_are_refused_with_a_clear_message(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(raw, env=ENV)
    assert message in str(info.value)


def test_yaml_syntax_error_is_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config("plugins: [unclosed", env=ENV)


@pytest.mark.parametrize(
    "profile",
    [
        "default",
        "default-prefill",
        "agent",
        "slo",
        "round_robin",
        "least_load",
        "power_of_two",
        "cache_aware",
        "decode-tpot",
        "decode-tpot-spread",
    ],
)
def test_shipped_profiles_load_and_pick(profile: str) -> None:
    s = load_default(env=ENV, rng=random.Random(0))
    snap = EndpointSnapshot([ep("w1"), ep("w2", waiting=3)])
    d = s.schedule(req(block_hashes=(1, 2, 3, 4)), snap, now=0.0, profile=profile)
    assert isinstance(d, Pick)


def test_shipped_profiles_with_real_perf_model() -> None:
    s = load_default()
    assert s.default_profile == "default"
    d = s.schedule(req(prompt_tokens=1000), EndpointSnapshot([ep("w1")]), now=0.0)
    assert isinstance(d, Pick) and d.predicted_ttft_ms > 0
