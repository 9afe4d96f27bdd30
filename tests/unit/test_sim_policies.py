"""``tideserve sim --autoscale-policy``: the autoscaler's policies side by side
(services/sim/policies.py) and their command line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from services.common.bench.stats import RequestResult
from services.sim.autoscale import AutoscaleConfig
from services.sim.cli import main as sim_main
from services.sim.config import SimConfig, SimConfigError
from services.sim.policies import (
    parse_policies,
    policy_config,
    policy_table,
    replica_seconds,
    slo_windows,
    with_ratios,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [("sla,reactive,static", ["sla", "reactive", "static"]), (" static , sla", ["static", "sla"])],
    ids=["all", "spaces"],
)
def test_policies_parse(text: str, want: list[str]) -> None:
    assert parse_policies(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [("planner", "takes a comma list"), ("", "takes a comma list"), ("sla,sla", "twice")],
    ids=["unknown", "empty", "repeated"],
)
def test_bad_policies_are_refused(text: str, message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        parse_policies(text)


AUTO = AutoscaleConfig(max_replicas=6, planner=(("predictor", "constant"),))


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        ("static", None),
        ("sla", {"policy": "sla", "predictor": "constant"}),
        ("reactive", {"policy": "reactive", "predictor": "constant"}),
    ],
    ids=["static-is-unscaled", "sla", "reactive"],
)
def test_policy_config(policy: str, want: dict[str, str] | None) -> None:
    cfg = policy_config(SimConfig(engines=2), policy, AUTO).validate()
    if want is None:
        assert cfg.autoscale is None
    else:
        assert cfg.autoscale is not None and dict(cfg.autoscale.planner) == want
        pc = cfg.autoscale.planner_config()
        assert (pc.policy, pc.predictor, pc.interval_s) == (policy, "constant", AUTO.tick_s)


@pytest.mark.parametrize(
    ("planner", "message"),
    [((("predictor", "psychic"),), "planner settings"), ((("no_such", 1),), "planner settings")],
    ids=["bad-value", "unknown-setting"],
)
def test_bad_planner_settings_are_refused(
    planner: tuple[tuple[str, Any], ...], message: str
) -> None:
    with pytest.raises(SimConfigError, match=message):
        SimConfig(autoscale=AutoscaleConfig(planner=planner)).validate()


def _r(
    sent_s: float, ttft_ms: float | None, tpot_ms: float | None, ok: bool = True
) -> RequestResult:
    return RequestResult(
        index=0, target="w", scheduled_s=sent_s, sent_s=sent_s, input_length=10,
        output_length=4, error=None if ok else "boom",
        ttft_s=None if ttft_ms is None else ttft_ms / 1e3,
        tpot_s=None if tpot_ms is None else tpot_ms / 1e3,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("results", "span_s", "want"),
    [
        ([_r(1, 100, 10), _r(61, 100, 10)], 120, (2, 2, 0, 0)),
        ([_r(1, 900, 10), _r(61, 100, 90)], 120, (2, 0, 1, 1)),
        ([_r(1, 100, 10, ok=False)], 60, (1, 0, 1, 1)),
        ([_r(1, 100, 10, ok=False), _r(2, 100, 10, ok=False)], 60, (1, 0, 1, 1)),
        ([_r(1, 100, 10)], 180, (3, 3, 0, 0)),  # windows without requests are met
        ([_r(1, 100, None)], 60, (1, 1, 0, 0)),  # one-token answers have no TPOT
    ],
    ids=[
        "all-met",
        "ttft-and-tpot-missed",
        "failed-misses-both",
        "two-failed-miss-both",
        "empty-windows-met",
        "no-tpot",
    ],
)
def test_slo_windows(
    results: list[RequestResult], span_s: float, want: tuple[int, int, int, int]
) -> None:
    w = slo_windows(results, window_s=60, span_s=span_s, ttft_ms=300, tpot_ms=25, pct=90)
    assert (w["windows"], w["met"], w["ttft_missed"], w["tpot_missed"]) == want
    assert len(w["missed"]) == w["windows"] - w["met"]
    assert all(0 <= i < w["windows"] for i in w["missed"])


def _row(t: float, w: int = 0, p: int = 0, d: int = 0) -> dict[str, Any]:
    return {"t_s": t, "replicas_worker": w, "replicas_prefill": p, "replicas_decode": d}


@pytest.mark.parametrize(
    ("rows", "want"),
    [([], 0.0), ([_row(0, w=2)], 120.0), ([_row(0, p=1, d=1), _row(60, p=3, d=1)], 360.0)],
    ids=["empty", "one-row", "pd-growing"],
)
def test_replica_seconds(rows: list[dict[str, Any]], want: float) -> None:
    assert math.isclose(replica_seconds(rows, 60.0), want)


def test_ratios_are_to_static_and_absent_without_it() -> None:
    rows = [{"policy": "sla", "replica_s": 50.0}, {"policy": "static", "replica_s": 100.0}]
    assert [r["replica_s_vs_static"] for r in with_ratios(rows)] == [0.5, 1.0]
    assert with_ratios(rows[:1])[0]["replica_s_vs_static"] is None


def _trace(tmp_path: Path) -> Path:
    lines = [
        json.dumps({"timestamp": i * 150, "input_length": 1000, "output_length": 12,
                    "hash_ids": [i % 5, 100 + i]})
        for i in range(120)
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_cli_runs_each_policy_on_a_fresh_fleet_deterministically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--trace", str(_trace(tmp_path)), "--engines", "2", "--max-replicas", "4",
            "--startup-s", "5", "--slo-ttft-ms", "500", "--slo-tpot-ms", "50",
            "--autoscale-policy", "sla,reactive,static", "--slo-window-s", "10"]  # fmt: skip
    docs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        assert sim_main([*argv, "--out", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    rows = docs[0]["comparison"]
    assert [r["policy"] for r in rows] == ["sla", "reactive", "static"]
    static = rows[2]
    assert static["replica_s_vs_static"] == 1.0 and static["peak_replicas"] == 2
    assert docs[0]["policies"]["static"]["sim"]["autoscale"] is None
    assert docs[0]["policies"]["reactive"]["sim"]["autoscale"] is not None
    assert all(r["slo_windows"] == rows[0]["slo_windows"] for r in rows)

    def strip(doc: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in doc["comparison"]]

    assert strip(docs[0]) == strip(docs[1])
    assert policy_table(rows).splitlines()[0].startswith("policy")
    assert "static" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--autoscale-policy", "sla", "--planner", "predictor"], "NAME=VALUE"),
        (["--autoscale-policy", "sla", "--planner", "predictor=psychic"], "planner settings"),
        (["--autoscale-policy", "sla,static", "--profile", "default,cache_aware"], "one --profile"),
        (["--autoscale-policy", "sla", "--slo-window-s", "0"], "slo-window-s"),
    ],
    ids=["malformed-setting", "bad-setting", "two-profiles", "zero-window"],
)
def test_the_cli_refuses_bad_policy_runs_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    out = tmp_path / "o.json"
    argv = ["--trace", str(_trace(tmp_path)), "--engines", "2", "--out", str(out), *extra]
    with pytest.raises(SystemExit) as exc:
        sim_main(argv)
    assert exc.value.code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
