"""``tideserve sim --deployment SPEC.yaml``: a deployment spec as a simulated fleet (table),
the specs the simulator refuses, and ``tideserve recommend``'s spec replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.common.planner.spec import parse_spec
from services.sim.cli import main as sim_main
from services.sim.config import SimConfig, SimConfigError
from services.sim.deployment import from_spec
from services.sim.search import Candidate, Family, Slo, spec_of


def role(name: str, kind: str, n: int, lo: int = 0, hi: int = 0) -> dict[str, Any]:
    return {"name": name, "role": kind, "replicas": n, "min_replicas": lo,
            "max_replicas": max(hi, n)}  # fmt: skip


def spec(*roles: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "d", "roles": list(roles), **extra}


INTERACTIVE = {"name": "interactive", "priority": 10, "ttft_ms": 500, "tpot_ms": 40,
               "percentile": 99}  # fmt: skip
BATCH = {"name": "batch", "priority": 1, "ttft_ms": 9000, "tpot_ms": 200}


@pytest.mark.parametrize(
    ("doc", "autoscale", "want"),
    [
        (spec(role("w", "worker", 3)), False, {"engines": 3, "prefill": 0, "decode": 0}),
        (spec(role("p", "prefill", 2), role("dd", "decode", 5)), False,
         {"prefill": 2, "decode": 5}),
        (spec(role("w", "worker", 2), role("kv", "kvcache", 1)), False,
         {"engines": 2, "memory_tier_mib": 1024}),
        (spec(role("w", "worker", 2),
              {**role("kv", "kvcache", 2), "args": ["--kvcache-mib", "4096",
                                                    "--kvcache-disk-mib=8192"]}), False,
         {"engines": 2, "memory_tier_mib": 2 * (4096 + 8192)}),
        (spec(role("w", "worker", 2)), False, {"memory_tier_mib": None}),
        (spec(role("w", "worker", 4), scheduler_profile="cache_aware",
              perf_profile="h200x8-llama3.1-70b", kv_block_size=32), False,
         {"profile": "cache_aware", "engine_profile": "h200x8-llama3.1-70b", "block_size": 32}),
        (spec(role("w", "worker", 1), slo_classes=[BATCH, INTERACTIVE]), False,
         {"slo_ttft_ms": 500, "slo_tpot_ms": 40}),
        (spec(role("w", "worker", 0, 0, 6), slo_classes=[INTERACTIVE]), True,
         {"engines": 1, "autoscale": (1, 6, 500, 40, 99)}),
        (spec(role("p", "prefill", 2, 2, 8), role("dd", "decode", 3, 1, 12)), True,
         {"prefill": 2, "decode": 3, "autoscale": (1, 12, 2000, 100, 90)}),
        (spec(role("w", "worker", 2, 1, 4), planner={"policy": "reactive",
                                                     "max_utilization": 0.7}), True,
         {"planner": {"policy": "reactive", "max_utilization": 0.7}}),
        (spec({**role("w", "worker", 2), "args": ["--profile", "test", "--max-batch", "64",
                                                  "--kv-blocks=4096"]}), False,
         {"max_batch": 64, "kv_blocks": 4096, "max_batched_tokens": 8192}),
        (spec({**role("p", "prefill", 1), "args": ["--max-batched-tokens", "2048"]},
              {**role("dd", "decode", 1), "args": ["--max-batched-tokens", "2048"]}), False,
         {"max_batched_tokens": 2048, "max_batch": 256}),
    ],
    ids=["workers", "pd", "kvcache-is-the-tier", "kvcache-dram-and-disk", "no-kvcache-no-tier",
         "profiles-and-blocks", "top-priority-slo",
         "autoscaled-from-zero", "autoscaled-pd", "planner-settings", "engine-args",
         "pd-engine-args"],
)  # fmt: skip
def test_a_spec_becomes_the_fleet_it_describes(
    doc: dict[str, Any], autoscale: bool, want: dict[str, Any]
) -> None:
    cfg = from_spec(parse_spec(doc), SimConfig(), autoscale=autoscale).validate()
    for key, value in want.items():
        if key == "autoscale":
            a = cfg.autoscale
            assert a is not None
            assert (a.min_replicas, a.max_replicas, a.ttft_ms, a.tpot_ms, a.percentile) == value
        elif key == "planner":
            assert cfg.autoscale is not None and dict(cfg.autoscale.planner) == value
            pc = cfg.autoscale.planner_config()
            assert (pc.policy, pc.max_utilization) == ("reactive", 0.7)
        else:
            assert getattr(cfg, key) == value, key
    if not autoscale:
        assert cfg.autoscale is None


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (spec(role("w", "worker", 1), role("p", "prefill", 1), role("dd", "decode", 1)),
         "both worker and prefill/decode roles"),
        (spec(role("p", "prefill", 2)), "needs worker roles, or prefill and decode roles"),
        (spec(role("kv", "kvcache", 1)), "needs worker roles"),
        (spec(role("w", "worker", 0, 0, 4)), "a role has 0 replicas"),
        (spec({**role("p", "prefill", 1), "args": ["--max-batch", "64"]},
              {**role("dd", "decode", 1), "args": ["--max-batch", "128"]}),
         "one engine configuration"),
        (spec({**role("w", "worker", 1), "args": ["--kv-blocks", "lots"]}), "takes an integer"),
    ],
    ids=["mixed-layouts", "prefill-only", "no-engines", "zero-without-autoscale",
         "roles-disagree", "not-an-integer"],
)  # fmt: skip
def test_a_spec_the_simulator_cannot_run_is_refused(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SimConfigError, match=message):
        from_spec(parse_spec(doc), SimConfig(), autoscale=False)


def trace_file(tmp_path: Path) -> Path:
    lines = [
        json.dumps({"timestamp": i * 200, "input_length": 900, "output_length": 8,
                    "hash_ids": [i // 2, 100 + i]})
        for i in range(16)
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_recommends_spec_replays_and_the_command_line_overrides_its_profile(tmp_path: Path) -> None:
    cand = Candidate(Family("pd", "cache_aware", 0.5), prefill=2, decode=3)
    written = spec_of(cand, name="rec", model="m", perf_profile="h200-llama3.1-8b",
                      slo=Slo(800.0, 60.0))  # fmt: skip
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(written))
    out = tmp_path / "o.json"
    base = ["--trace", str(trace_file(tmp_path)), "--deployment", str(path), "--kv-blocks", "2048"]
    assert sim_main([*base, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    c = doc["config"]
    assert (c["prefill"], c["decode"], c["profile"]) == (2, 3, "cache_aware")
    assert (c["slo_ttft_ms"], c["slo_tpot_ms"]) == (800.0, 60.0) and doc["completed"] == 16
    assert sim_main([*base, "--profile", "round_robin", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["profile"] == "round_robin"


@pytest.mark.parametrize(
    ("extra", "text", "message"),
    [
        (["--engines", "2"], None, "not allowed with"),
        (["--decode", "2"], None, "--decode goes with --prefill, not with --deployment"),
        ([], "name: d\nroles: []\n", "deployment"),
        ([], "{not yaml", "not valid YAML"),
    ],
    ids=["with-engines", "with-decode", "no-roles", "bad-yaml"],
)  # fmt: skip
def test_the_cli_refuses_a_bad_deployment_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    text: str | None,
    message: str,
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(text or yaml.safe_dump(spec(role("w", "worker", 2))))
    out = tmp_path / "o.json"
    argv = ["--trace", str(trace_file(tmp_path)), "--deployment", str(path), *extra,
            "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        sim_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_recommends_engine_settings_come_back_from_its_spec() -> None:
    cand = Candidate(Family("aggregated", "default"), engines=3, settings=(("max_batch", 64),))
    written = spec_of(cand, name="rec", model="m", perf_profile="h200-llama3.1-8b",
                      slo=Slo(800.0, 60.0), engine_args=("--profile", "h200-llama3.1-8b"),
                      settings={"max_batch": 256, "max_batched_tokens": 4096, "kv_blocks": 8192})  # fmt: skip
    cfg = from_spec(parse_spec(written), SimConfig(), autoscale=False).validate()
    got = (cfg.engines, cfg.max_batch, cfg.max_batched_tokens, cfg.kv_blocks)
    assert got == (3, 64, 4096, 8192)


@pytest.mark.parametrize(
    ("cli_mib", "want_mib"),
    [(None, 65536), (0, 0)],
    ids=["from-the-spec", "command-line-wins"],
)
def test_recommends_tier_comes_back_from_its_spec(cli_mib: int | None, want_mib: int) -> None:
    cand = Candidate(Family("aggregated", "default"), engines=3, settings=(("tier_mib", 65536),))
    written = spec_of(cand, name="rec", model="m", perf_profile="h200-llama3.1-8b",
                      slo=Slo(800.0, 60.0), settings={"tier_mib": 4096})  # fmt: skip
    worker, kvcache = parse_spec(written).roles
    assert kvcache.role == "kvcache" and "--kvcache-tier" in worker.args
    cfg = from_spec(parse_spec(written), SimConfig(memory_tier_mib=cli_mib), autoscale=False)
    assert cfg.validate().memory_tier_mib == want_mib
    # 65536 MiB of 128 KiB-per-token KV in 64-token blocks
    assert cfg.tier_blocks == want_mib * (1 << 20) // (131072 * 64)
