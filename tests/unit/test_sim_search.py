"""The configuration search's pure rules (services/sim/search.py) and `tideserve recommend`
on a small slice of a real trace."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli import main as cli_main
from services.common.planner.spec import parse_spec
from services.sim.search import (
    Candidate,
    Family,
    Outcome,
    Slo,
    families,
    judge,
    recommend,
    refine,
    smallest_passing,
    smallest_tier,
    spec_of,
)

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_conversation_head.jsonl"
AGG = Family("aggregated", "default")
PD = Family("pd", "default", 0.25)
SLO = Slo(2000.0, 100.0)
BEYOND = (
    "engine refused: prompt (130932 tokens) plus max_new_tokens (194) exceeds the context limit"
)


def _summary(ttft: float, tpot: float, attain: float = 1.0, failed: int = 0) -> dict[str, Any]:
    return {
        "ttft_ms": {"p50": ttft / 2, "p90": ttft, "p99": ttft * 2},
        "tpot_ms": {"p50": tpot / 2, "p90": tpot, "p99": tpot * 2},
        "slo_attainment": attain,
        "failed": failed,
    }


@pytest.mark.parametrize(
    ("summary", "slo", "passes", "why"),
    [
        (_summary(1500, 50), SLO, True, ""),
        (_summary(2500, 50), SLO, False, "TTFT p90 2500 ms > 2000"),
        (_summary(1500, 120), SLO, False, "TPOT p90 120.0 ms > 100"),
        (_summary(1500, 50, failed=3), SLO, False, "3 requests failed"),
        (_summary(1500, 50, attain=0.8), Slo(2000, 100, 90, 0.9), False, "attainment 0.800 < 0.9"),
        (_summary(1500, 50), Slo(2000, 100, 99), False, "TTFT p99 3000 ms > 2000"),
        ({"failed": 0}, SLO, False, "TTFT p90 inf ms > 2000; TPOT p90 inf ms > 100"),
        (
            {**_summary(1500, 50, failed=3), "errors": {BEYOND: 2, "engine refused: full": 1}},
            SLO,
            False,
            "1 requests failed",
        ),
        ({**_summary(1500, 50, failed=2), "errors": {BEYOND: 2}}, SLO, True, ""),
    ],
    ids=[
        "meets",
        "ttft-miss",
        "tpot-miss",
        "failures",
        "attainment",
        "p99",
        "no-figures",
        "beyond-context-apart",
        "only-beyond-context",
    ],
)
def test_judge(summary: dict[str, Any], slo: Slo, passes: bool, why: str) -> None:
    o = judge(AGG.at(4), summary, slo)
    assert (o.passes, o.why) == (passes, why)


@pytest.mark.parametrize(
    ("family", "instances", "want"),
    [
        (AGG, 5, (5, 0, 0)),
        (PD, 8, (0, 2, 6)),
        (PD, 2, (0, 1, 1)),
        (Family("pd", "default", 0.9), 4, (0, 3, 1)),
        (Family("pd", "default", 0.5), 7, (0, 4, 3)),
    ],
    ids=["aggregated", "quarter-prefill", "smallest-pd", "prefill-heavy-keeps-a-decode", "half"],
)
def test_family_sizes(family: Family, instances: int, want: tuple[int, int, int]) -> None:
    c = family.at(instances)
    assert (c.engines, c.prefill, c.decode) == want and c.instances == instances


def _fake(threshold: int, calls: list[int]) -> Any:
    """A run that passes from ``threshold`` instances up (monotone, as the search assumes)."""

    def run(c: Candidate) -> Outcome:
        calls.append(c.instances)
        ok = c.instances >= threshold
        return Outcome(c, 1000.0 if ok else 5000.0, 10.0, 1.0, 0, ok, "" if ok else "slow")

    return run


@pytest.mark.parametrize(
    ("family", "lo", "hi", "threshold", "want"),
    [
        (AGG, 1, 16, 5, 5),
        (AGG, 1, 16, 1, 1),
        (AGG, 1, 16, 16, 16),
        (AGG, 1, 16, 17, None),
        (PD, 1, 16, 1, 2),
        (AGG, 3, 3, 2, 3),
        (PD, 1, 1, 1, None),
    ],
    ids=["middle", "smallest", "largest", "none", "pd-starts-at-two", "one-size", "empty-range"],
)
def test_smallest_passing_bisects(
    family: Family, lo: int, hi: int, threshold: int, want: int | None
) -> None:
    calls: list[int] = []
    best, seen = smallest_passing(family, lo, hi, _fake(threshold, calls))
    assert (best.candidate.instances if best else None) == want
    assert [o.candidate.instances for o in seen] == calls
    span = hi - max(lo, family.smallest) + 1
    assert len(calls) <= (1 + math.ceil(math.log2(span)) if span > 0 else 0)
    assert calls[:1] == ([hi] if span > 0 else [])  # the largest first: one run to give up


def _o(family: Family, n: int, ok: bool, attain: float = 0.9, ttft: float = 1000.0) -> Outcome:
    return Outcome(family.at(n), ttft, 10.0, attain, 0, ok, "" if ok else "TTFT")


def test_recommend_takes_the_cheapest_and_says_why_each_other_lost() -> None:
    a4, a5, p4, p6 = _o(AGG, 4, False), _o(AGG, 5, True), _o(PD, 4, False), _o(PD, 6, True)
    same = _o(Family("aggregated", "cache_aware"), 5, True, attain=0.8)
    best, table = recommend([p6, a4, a5, p4, same])
    assert best is a5
    assert [(o.candidate.label, why) for o, why in table] == [
        ("1P+3D, default", "misses: TTFT"),
        ("4 workers, default", "misses: TTFT"),
        ("5 workers, default", ""),
        (
            "5 workers, cache_aware",
            "passes at the same cost with lower attainment, higher TTFT or more changes",
        ),
        ("2P+4D, default", "passes, but 6 instances > 5"),
    ]


def test_recommend_with_nothing_passing() -> None:
    best, table = recommend([_o(AGG, 8, False)])
    assert best is None and table[0][1] == "misses: TTFT"


@pytest.mark.parametrize("family", [AGG, PD], ids=["aggregated", "pd"])
def test_spec_is_one_apply_accepts(family: Family) -> None:
    spec = spec_of(
        family.at(6), name="rec", model="m", perf_profile="test", slo=SLO,
        engine_args=("--profile", "test"),
    )  # fmt: skip
    parsed = parse_spec(spec)
    assert sum(r.replicas for r in parsed.roles) == 6
    assert parsed.scheduler_profile == "default" and parsed.slo_classes[0].ttft_ms == 2000.0


def test_families_cross_layouts_profiles_and_shares() -> None:
    got = families(["aggregated", "pd"], ["default", "cache_aware"], [0.25, 0.5])
    assert [f.label for f in got] == [
        "aggregated, default", "P/D 0.25 prefill, default", "P/D 0.50 prefill, default",
        "aggregated, cache_aware", "P/D 0.25 prefill, cache_aware",
        "P/D 0.50 prefill, cache_aware",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("slo", "message"),
    [((0, 100), "targets must be > 0"), ((1, 1, 75), "percentile"), ((1, 1, 90, 2), "attain")],
    ids=["zero-target", "percentile", "attainment"],
)
def test_bad_slo_is_refused(slo: tuple[float, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Slo(*slo)  # type: ignore[arg-type]


def _recommend(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    argv = ["recommend", "--trace", str(TRACE), "--max-requests", "80", "--slo-ttft-ms", "6000",
            "--slo-tpot-ms", "100", "--max-instances", "4", "--layouts", "aggregated",
            "--out", str(out), "--spec-out", str(tmp_path / f"{name}.yaml"), *extra]  # fmt: skip
    code = cli_main(argv)
    return code, json.loads(out.read_text())


def test_recommend_cli_writes_a_deterministic_table_and_an_applicable_spec(
    tmp_path: Path,
) -> None:
    code, doc = _recommend(tmp_path, "a")
    _, again = _recommend(tmp_path, "b")
    assert code == 0 and doc["recommendation"] is not None
    spec = parse_spec(yaml.safe_load((tmp_path / "a.yaml").read_text()))
    assert spec.roles[0].replicas == doc["recommendation"]["instances"]
    assert all(r["passes"] or r["why_not"].startswith("misses") for r in doc["tried"])

    def strip(d: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in ("wall_s", "cpu_s")} for r in d["tried"]]

    assert strip(doc) == strip(again)


def test_recommend_cli_exits_1_when_nothing_meets_the_slos(tmp_path: Path) -> None:
    code, doc = _recommend(tmp_path, "none", "--slo-ttft-ms", "1")
    assert code == 1 and doc["recommendation"] is None and doc["spec"] is None
    assert not (tmp_path / "none.yaml").exists()


def _settings_fake(need: dict[tuple[str, int], int], base: int, calls: list[Candidate]) -> Any:
    """A run that passes from ``base`` instances, or from fewer with the settings in
    ``need`` ((setting, value) -> instances that suffice with it; the smallest of the
    candidate's changed settings counts)."""

    def run(c: Candidate) -> Outcome:
        calls.append(c)
        enough = min([base, *(need.get(s, base) for s in c.settings)])
        ok = c.instances >= enough
        return Outcome(c, 1000.0, 10.0, 0.9, 0, ok, "" if ok else "TTFT")

    return run


DEFAULTS = {"max_batch": 256, "max_batched_tokens": 8192, "kv_blocks": 16384}


@pytest.mark.parametrize(
    ("axes", "need", "want_n", "want_settings", "runs"),
    [
        # no value saves an instance: each other value once, at one fewer
        ([("max_batch", [128, 256, 512])], {}, 6, (), 2),
        # 128 saves two instances: at 5 (128 passes, 512 not), 4 (128 passes), 3 (neither)
        ([("max_batch", [128, 512])], {("max_batch", 128): 4}, 4, (("max_batch", 128),), 6),
        # a value equal to the base's is not a change and not run
        ([("kv_blocks", [16384])], {}, 6, (), 0),
        # settings combine: batch first, then tokens on top of it
        (
            [("max_batch", [128]), ("max_batched_tokens", [4096])],
            {("max_batch", 128): 5, ("max_batched_tokens", 4096): 3},
            3,
            (("max_batch", 128), ("max_batched_tokens", 4096)),
            5,  # batch: at 5 passes, at 4 not; tokens: at 4 and 3 passes, at 2 not
        ),
    ],
    ids=["nothing-helps", "batch-saves-two", "base-value-skipped", "two-settings"],
)
def test_refine_changes_a_setting_only_where_it_saves_an_instance(
    axes: list[tuple[str, list[int]]],
    need: dict[tuple[str, int], int],
    want_n: int,
    want_settings: tuple[tuple[str, int], ...],
    runs: int,
) -> None:
    calls: list[Candidate] = []
    run = _settings_fake(need, 6, calls)
    start = run(AGG.at(6))
    calls.clear()
    best, seen = refine(start, axes, DEFAULTS, run)
    assert best.candidate.instances == want_n and best.candidate.settings == want_settings
    assert len(calls) == runs and [o.candidate for o in seen] == calls


def test_refine_stops_at_the_smallest_fleet() -> None:
    calls: list[Candidate] = []
    run = _settings_fake({("max_batch", 64): 1}, 2, calls)
    best, _ = refine(run(PD.at(2)), [("max_batch", [64])], DEFAULTS, run)
    assert best.candidate.instances == 2 and len(calls) == 1  # P/D has no 1-instance fleet


def test_recommend_prefers_the_base_settings_at_equal_figures() -> None:
    plain = _o(AGG, 4, True)
    changed = Outcome(AGG.at(4, (("max_batch", 128),)), 1000.0, 10.0, 0.9, 0, True)
    best, table = recommend([changed, plain])
    assert best is plain and "more changes" in table[1][1]


@pytest.mark.parametrize(
    ("settings", "changed", "want"),
    [
        (None, (), []),
        (
            {"max_batch": 256, "kv_blocks": 16384},
            (),
            ["--max-batch", "256", "--kv-blocks", "16384"],
        ),
        (
            {"max_batch": 256, "max_batched_tokens": 8192},
            (("max_batch", 64),),
            ["--max-batch", "64", "--max-batched-tokens", "8192"],
        ),
    ],
    ids=["none", "base", "changed-over-base"],
)
def test_spec_carries_the_engine_settings_as_engine_args(
    settings: dict[str, int] | None, changed: tuple[tuple[str, int], ...], want: list[str]
) -> None:
    spec = spec_of(
        AGG.at(3, changed), name="rec", model="m", perf_profile="test", slo=SLO,
        engine_args=("--profile", "test"), settings=settings,
    )  # fmt: skip
    assert list(parse_spec(spec).roles[0].args) == ["--profile", "test", *want]


def test_recommend_cli_runs_the_planner_step_and_skips_it_when_asked(tmp_path: Path) -> None:
    code, doc = _recommend(tmp_path, "p")
    assert code == 0 and doc["planner"]["runs"] == len(doc["planner"]["tried"]) == 5
    assert sum(1 for r in doc["planner"]["tried"] if r["passes"] and not r["why_not"]) <= 1
    spec = parse_spec(yaml.safe_load((tmp_path / "p.yaml").read_text()))
    chosen = doc["planner"]["chosen"]
    assert spec.planner.overrides() == (chosen or {})
    off = ("--try-policy", "", "--try-predictor", "", "--try-max-utilization", "")
    code, doc = _recommend(tmp_path, "q", *off, "--try-max-batch", "", "--try-kv-blocks", "")
    assert code == 0 and "planner" not in doc
    assert all(r["max_batch"] == 256 and r["kv_blocks"] == 16384 for r in doc["tried"])


@pytest.mark.parametrize(
    "extra",
    [("--try-policy", "psychic"), ("--try-max-batch", "lots"), ("--try-kv-blocks", "0")],
    ids=["policy", "batch-not-a-number", "kv-zero"],
)
def test_recommend_cli_refuses_bad_values_to_try(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["recommend", "--trace", str(TRACE), "--slo-ttft-ms", "1", "--slo-tpot-ms", "1",
                  *extra])  # fmt: skip
    assert exc.value.code == 2 and extra[0] in capsys.readouterr().err


def _tiered(tier: int | None, passes: bool = True, attain: float = 0.9) -> Outcome:
    settings = () if tier is None else (("tier_mib", tier),)
    return Outcome(AGG.at(4, settings), 1000.0, 10.0, attain, 0, passes)


def test_recommend_prefers_the_smaller_tier_at_equal_instances() -> None:
    base, small, big = _tiered(None, attain=0.95), _tiered(0, attain=0.8), _tiered(1 << 20)
    best, table = recommend([big, base, small], tier_base=65536)
    assert best is small and [o for o, _ in table] == [small, base, big]
    assert table[1][1] == table[2][1] == "passes, but with a larger tier"


@pytest.mark.parametrize(
    ("start", "passing", "want", "runs"),
    [
        # the base (65536) was bigger than needed: 16384 is the smallest that passes
        (None, {16384, 65536}, 16384, [0, 16384]),
        # refine chose 1 TiB; the base passes at that size too, nothing smaller does
        (1 << 20, {65536, 1 << 20}, None, [0, 16384, 65536]),
        # nothing below the chosen tier passes: it stays
        (1 << 20, {1 << 20}, 1 << 20, [0, 16384, 65536]),
        # already the smallest: nothing to try
        (0, {0}, 0, []),
    ],
    ids=["base-too-big", "back-to-the-base", "chosen-stays", "already-smallest"],
)
def test_smallest_tier_keeps_the_size_and_shrinks_the_tier(
    start: int | None, passing: set[int], want: int | None, runs: list[int]
) -> None:
    tried: list[int] = []

    def run(c: Candidate) -> Outcome:
        tier = dict(c.settings).get("tier_mib", 65536)
        tried.append(tier)
        assert c.instances == 4
        return Outcome(c, 1000.0, 10.0, 0.9, 0, tier in passing)

    best, seen = smallest_tier(_tiered(start), [0, 16384, 1 << 20], 65536, run)
    assert dict(best.candidate.settings).get("tier_mib") == want
    assert tried == runs and len(seen) == len(runs)


@pytest.mark.parametrize(
    ("tier", "kvcache"),
    [(0, None), (65536, ["--kvcache-mib", "65536"])],
    ids=["no-tier", "tier"],
)
def test_spec_writes_the_tier_as_a_kvcache_role(tier: int, kvcache: list[str] | None) -> None:
    spec = parse_spec(spec_of(AGG.at(3), name="rec", model="m", perf_profile="test", slo=SLO,
                              settings={"tier_mib": tier}))  # fmt: skip
    tiers = [r for r in spec.roles if r.role == "kvcache"]
    assert [list(r.args) for r in tiers] == ([kvcache] if kvcache else [])
    assert ("--kvcache-tier" in spec.roles[0].args) == bool(kvcache)


def test_recommend_cli_sizes_the_tier_with_agent_memory(tmp_path: Path) -> None:
    off = ("--try-max-batch", "", "--try-max-batched-tokens", "", "--try-kv-blocks", "",
           "--try-policy", "", "--try-predictor", "", "--try-max-utilization", "")  # fmt: skip
    code, doc = _recommend(tmp_path, "t", *off, "--agent-memory", "retention",
                           "--tier-mib", "4096", "--try-tier-mib", "0,1048576")  # fmt: skip
    assert doc["search"]["base_settings"]["tier_mib"] == 4096
    assert doc["search"]["refine"] == {"tier_mib": [0, 1048576]}
    assert all("tier_mib" in r for r in doc["tried"])
    # these conversations fit the engines' own KV: the tier saves nothing, so none is kept
    assert code == 0 and doc["recommendation"]["tier_mib"] == 0
    spec = parse_spec(yaml.safe_load((tmp_path / "t.yaml").read_text()))
    assert [r.role for r in spec.roles] == ["worker"]
    assert "--kvcache-tier" not in spec.roles[0].args
    code, doc = _recommend(tmp_path, "u", *off)  # no agent memory: no tier anywhere
    assert "tier_mib" not in doc["search"]["base_settings"]
    assert all("tier_mib" not in r for r in doc["tried"])
