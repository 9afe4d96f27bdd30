"""Deployment spec validation and proto round trip (pure)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from services.autoscaler.seam import role_target
from services.autoscaler.translate import spec_from_proto, spec_to_proto
from services.common.planner.config import PlannerConfig, for_deployment
from services.common.planner.spec import SpecError, load_spec_file, parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def _pd() -> dict[str, Any]:
    return {
        "name": "chat",
        "model": "llama",
        "roles": [
            {
                "name": "prefill",
                "role": "prefill",
                "replicas": 2,
                "min_replicas": 1,
                "max_replicas": 8,
            },
            {
                "name": "decode",
                "role": "decode",
                "replicas": 2,
                "min_replicas": 1,
                "max_replicas": 8,
                "dependencies": ["prefill"],
            },
        ],
        "coordination": {
            "min_pd_ratio": 0.25,
            "max_pd_ratio": 4,
            "scale_together": ["prefill", "decode"],
        },
        "slo_classes": [{"name": "interactive", "ttft_ms": 1000, "tpot_ms": 50}],
        "budget": {"max_replicas": 12},
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_pd())
    node: Any = data
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return data


BAD = [
    ("min-over-max", _with("roles.0.min_replicas", 9), "roles[0]: min_replicas (9) > max_replicas"),
    ("replicas-outside", _with("roles.1.replicas", 0), "roles[1]: replicas (0) outside"),
    ("unknown-role-kind", _with("roles.0.role", "router"), "roles[0].role"),
    ("unknown-engine", _with("roles.0.engine", "trt"), "roles[0].engine"),
    ("negative-ttft", _with("slo_classes.0.ttft_ms", -1), "slo_classes[0].ttft_ms"),
    ("negative-tpot", _with("slo_classes.0.tpot_ms", -5), "slo_classes[0].tpot_ms"),
    ("bad-percentile", _with("slo_classes.0.percentile", 120), "slo_classes[0].percentile"),
    (
        "ratio-min-over-max",
        _with("coordination.min_pd_ratio", 5),
        "coordination.min_pd_ratio: 5.0 > max_pd_ratio",
    ),
    (
        "ratio-unreachable-high",
        _with("coordination.min_pd_ratio", 3.5)
        | {"roles": [_pd()["roles"][0] | {"max_replicas": 2}, _pd()["roles"][1]]},
        "coordination.min_pd_ratio: 3.5 unreachable",
    ),
    (
        "ratio-unreachable-low",
        _with("coordination", {"max_pd_ratio": 0.1}),
        "coordination.max_pd_ratio: 0.1 unreachable",
    ),
    (
        "unknown-dependency",
        _with("roles.1.dependencies", ["router"]),
        "roles[1].dependencies: unknown role 'router'",
    ),
    ("dependency-cycle", _with("roles.0.dependencies", ["decode"]), "roles.dependencies: cycle"),
    (
        "unknown-scale-together",
        _with("coordination.scale_together", ["prefill", "x"]),
        "coordination.scale_together: unknown role 'x'",
    ),
    ("duplicate-role", _with("roles.1.name", "prefill"), "roles: duplicate role names"),
    ("bad-name", _with("name", "Chat_1"), "name: 'Chat_1' is not a DNS label"),
    ("unknown-profile", _with("perf_profile", "a100"), "perf_profile: unknown profile"),
    ("budget-below-min", _with("budget", {"max_replicas": 1}), "budget.max_replicas: 1 <"),
    ("unknown-field", _with("replica", 3), "replica: Extra inputs are not permitted"),
    ("no-roles", _with("roles", []), "roles: Tuple should have at least 1 item"),
    ("bad-restart-policy", _with("roles.0.restart_policy", "sometimes"), "roles[0].restart_policy"),
    (
        "port-out-of-range",
        _with("roles.0.ports", [30001, 70000]),
        "roles[0].ports[1]: Input should be less than or equal to 65535",
    ),
    ("port-repeated", _with("roles.0.ports", [30001, 30001]), "ports [30001, 30001] repeat"),
    ("planner-policy", _with("planner", {"policy": "psychic"}), "planner.policy"),
    ("planner-utilization", _with("planner", {"max_utilization": 1.5}), "planner.max_utilization"),
    ("planner-unknown", _with("planner", {"interval_s": 5}), "planner.interval_s: Extra inputs"),
    (
        "port-of-two-roles",
        {**_pd(), "roles": [r | {"ports": [30001]} for r in _pd()["roles"]]},
        "roles[1].ports: 30001 is also a port of role 'prefill'",
    ),
]


@pytest.mark.parametrize(
    ("data", "needle"), [(d, n) for _, d, n in BAD], ids=[i for i, _, _ in BAD]
)
def test_bad_specs_are_refused_naming_the_field(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert needle in str(info.value)


def test_a_good_spec_round_trips_through_protobuf() -> None:
    spec = parse_spec(_pd())
    assert spec_from_proto(spec_to_proto(spec)) == spec


@pytest.mark.parametrize(
    ("planner", "overrides"),
    [
        ({}, {}),
        ({"policy": "reactive"}, {"policy": "reactive"}),
        (
            {"predictor": "constant", "max_utilization": 0.7, "decode_headroom": 0.8},
            {"predictor": "constant", "max_utilization": 0.7, "decode_headroom": 0.8},
        ),
        ({"stream_interval": 16}, {"stream_interval": 16}),
    ],
    ids=["none", "policy", "sla-settings", "engines-stream-interval"],
)
def test_planner_settings_round_trip_and_override_the_autoscalers(
    planner: dict[str, Any], overrides: dict[str, Any]
) -> None:
    spec = parse_spec(_with("planner", planner))
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert spec.planner.overrides() == overrides
    base = PlannerConfig(max_utilization=0.9, hysteresis=0.2)
    cfg = for_deployment(base, spec.planner.overrides())
    assert cfg.hysteresis == 0.2  # what the spec leaves is the autoscaler's
    for key, value in {"max_utilization": 0.9, **overrides}.items():
        assert getattr(cfg, key) == value
    assert (cfg is base) == (not overrides)


def test_restart_policy_and_ports_round_trip_and_default() -> None:
    data = _with("roles.0.ports", [30001, 30002])
    data["roles"][1]["restart_policy"] = "never"
    spec = parse_spec(data)
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert (spec.roles[0].restart_policy, spec.roles[0].ports) == ("always", (30001, 30002))
    assert (spec.roles[1].restart_policy, spec.roles[1].ports) == ("never", ())
    msg = spec_to_proto(spec)
    msg.roles[0].restart_policy = ""  # an older client: the default
    assert spec_from_proto(msg).roles[0].restart_policy == "always"


def test_sidecars_round_trip_and_reach_the_drivers_target() -> None:
    data = _with("roles.0.sidecars", ["tideserve kv-bridge --instance-id {instance_id}"])
    spec = parse_spec(data)
    assert spec_from_proto(spec_to_proto(spec)) == spec
    target = role_target(spec.name, spec.roles[0], 1)
    assert target.sidecars == (("tideserve", "kv-bridge", "--instance-id", "{instance_id}"),)
    assert role_target(spec.name, spec.roles[1], 1).sidecars == ()


@pytest.mark.parametrize(
    ("seconds", "expected"), [(600.0, 600.0), (0.0, 120.0)], ids=["set", "default"]
)
def test_startup_timeout_round_trips_and_reaches_the_drivers_target(
    seconds: float, expected: float
) -> None:
    spec = parse_spec(_with("roles.0.startup_timeout_s", seconds))
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert role_target(spec.name, spec.roles[0], 1).startup_timeout_s == expected


def test_a_bad_protobuf_spec_is_refused_like_yaml() -> None:
    msg = spec_to_proto(parse_spec(_pd()))
    msg.roles[0].min_replicas = 9
    with pytest.raises(SpecError, match=r"roles\[0\]: min_replicas \(9\)"):
        spec_from_proto(msg)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_specs_are_valid(path: Path) -> None:
    spec = load_spec_file(path.read_text())
    assert spec.name


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} >= {"aggregated.yaml", "pd.yaml"}
