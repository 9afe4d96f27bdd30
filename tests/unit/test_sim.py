"""``tideserve sim`` (services/sim): determinism, trace repetition, the bench's summary
keys, a tiny fleet's sanity, and the CLI's refusals. Virtual time: no timing assertions."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
from array import array
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.bench.client import BenchConfig, run_bench
from services.cli import main as tideserve_main
from services.common.bench.traces import Trace, TraceRequest, load_trace, parse_mooncake
from services.common.tokens import tokenize
from services.sim import SimConfig, simulate
from services.sim.autoscale import AutoscaleConfig
from services.sim.cli import main as sim_main
from services.sim.inputs import Prompts, ShiftedIds, arrivals, repeated
from services.sim.results import BENCH_WALL_KEYS, SIM_KEYS
from services.sim.timeline import COLUMNS
from tests.helpers.engines import EngineFleet
from tests.helpers.sim_traces import trace_of, write_trace


def without_wall(doc: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in doc.items() if k != "wall"}, sort_keys=True)


# -- trace repetition ---------------------------------------------------------------------
@pytest.mark.parametrize(("n", "rounds"), [(4, 1), (8, 1), (20, 3)], ids=["slice", "whole", "x2.5"])
def test_a_short_trace_repeats_with_fresh_prefix_ids(n: int, rounds: int) -> None:
    base = trace_of(8).requests
    got = list(repeated(base, n))
    assert [r.index for r in got] == list(range(n))
    assert all(b.arrival_s > a.arrival_s for a, b in itertools.pairwise(got))
    by_round: list[list[TraceRequest]] = [got[i : i + len(base)] for i in range(0, n, len(base))]
    assert len(by_round) == rounds
    first_ids = {h for r in by_round[0] for h in r.hash_ids or ()}
    for k, rnd in enumerate(by_round[1:], start=1):
        ids = {h for r in rnd for h in r.hash_ids or ()}
        assert not ids & first_ids, f"round {k} reuses a prefix id of round 0"
        # the trace's own reuse (turn 2 shares turn 1's first block) is kept in the round
        for a, b in zip(rnd[0::2], rnd[1::2], strict=False):
            assert a.hash_ids and b.hash_ids and a.hash_ids[0] == b.hash_ids[0]
        assert [(r.input_length, r.output_length) for r in rnd] == [
            (r.input_length, r.output_length) for r in base[: len(rnd)]
        ]


@pytest.mark.parametrize(
    ("read", "want"),
    [
        (lambda s: list(s), [13, 14, 15]),
        (lambda s: s[1], 14),
        (lambda s: s[-1], 15),
        (lambda s: s[:2], (13, 14)),
        (lambda s: len(s), 3),
        (lambda s: s == (13, 14, 15), True),
        (lambda s: s == (13, 14), False),
        (lambda s: hash(s) == hash((13, 14, 15)), True),
        (lambda s: 14 in s, True),
    ],
    ids=["iter", "index", "last", "slice", "len", "eq", "ne", "hash", "contains"],
)
def test_shifted_ids_read_as_the_tuple_of_shifted_ids(
    read: Callable[[ShiftedIds], object], want: object
) -> None:
    assert read(ShiftedIds((3, 4, 5), 10)) == want


def test_arrivals_divide_trace_time_by_rate_scale_and_speedup() -> None:
    cfg = SimConfig(rate_scale=2.0, speedup=2.5)
    got = arrivals(trace_of(3), None, cfg.time_divisor)
    assert [round(at, 6) for at, _ in got] == [0.0, 50.0, 100.0]


# -- runs ---------------------------------------------------------------------------------
TINY = SimConfig(engines=4, max_requests=24, kv_blocks=2048, timeline_s=2.0)


@pytest.mark.parametrize(
    ("cfg", "disaggregated"),
    [
        (TINY, False),
        (SimConfig(prefill=1, decode=3, max_requests=24, kv_blocks=2048), True),
        (SimConfig(engines=4, gateways=2, max_requests=24, kv_blocks=2048, load_source="stream"),
         False),
        (SimConfig(prefill=1, decode=3, max_requests=24, kv_blocks=2048, decode_keeps_kv=True,
                   short_first_tokens=256), True),
        (SimConfig(engines=4, max_requests=24, kv_blocks=2048, short_first_tokens=256), False),
        (SimConfig(engines=2, max_requests=24, kv_blocks=2048, slo_ttft_ms=300.0,
                   shaper_protect_ms=2000.0), False),
        (SimConfig(engines=2, max_requests=24, kv_blocks=2048, slo_ttft_ms=300.0,
                   shaper_protect_ms=2000.0, shaper_protect_slack=True), False),
    ],
    ids=["aggregated", "pd", "two-gateways-stream", "pd-decode-keeps-kv-short-first",
         "aggregated-short-first", "protect-guard", "protect-slack"],
)  # fmt: skip
def test_a_tiny_fleet_finishes_every_request_once(cfg: SimConfig, disaggregated: bool) -> None:
    doc, run = simulate(cfg, trace_of(24))
    assert doc["completed"] == 24 and doc["failed"] == 0
    assert [r.endings for r in run.requests] == [1] * 24
    assert sum(doc["sim"]["requests_per_instance"]) == 24
    assert sum(c.get("completed", 0) for c in doc["targets"].values()) == 24
    # second turns share the first block with their conversation's first: some hits, and
    # never more than an unbounded cache shared by all engines would give
    assert 0.0 < doc["cache_hit_ratio"] <= doc["infinite_cache_hit_ratio"] + 0.05
    assert doc["ttft_ms"]["mean"] > 0 and doc["tpot_ms"]["mean"] > 0
    assert doc["output_length_mismatch"] == 0
    assert (doc["sim"]["routing"]["disaggregated"] > 0) == disaggregated
    rows = run.timeline.rows
    assert sum(r["arrivals"] for r in rows) == 24 and sum(r["completed"] for r in rows) == 24


@pytest.mark.parametrize(
    ("keeps", "decode_caches"),
    [pytest.param(False, False, id="default"), pytest.param(True, True, id="decode-keeps-kv")],
)
def test_decode_engines_cache_what_they_receive_only_when_told(
    keeps: bool, decode_caches: bool
) -> None:
    cfg = SimConfig(prefill=1, decode=2, max_requests=24, kv_blocks=2048, decode_keeps_kv=keeps)
    doc, run = simulate(cfg, trace_of(24))
    assert doc["completed"] == 24
    resident = sum(len(i.core.cache.resident().get("", set())) for i in run.engines
                   if i.role == "decode")  # fmt: skip
    assert (resident > 0) == decode_caches


@pytest.mark.parametrize(
    ("gateway_profile", "expected"),
    [("", "test*2"), ("test", "test"), ("test*4", "test*4")],
    ids=["exact-by-default", "believes-the-faster-device", "believes-a-slower-one"],
)
def test_the_gateway_prices_with_its_own_profile(gateway_profile: str, expected: str) -> None:
    from services.sim.run import Simulation

    cfg = SimConfig(
        engines=2, max_requests=4, kv_blocks=2048, engine_profile="test*2",
        gateway_perf_profile=gateway_profile,
    )  # fmt: skip
    sim = Simulation(cfg, trace_of(4))
    ttft = next(p for p in sim.gw.cores[0].scheduler.profiles["default"].preparers
                if hasattr(p, "model"))  # fmt: skip
    assert ttft.model.name == expected
    assert sim.perf.name == "test*2"


def test_same_seed_same_json_and_the_seed_is_used() -> None:
    cfg = SimConfig(engines=4, gateways=3, max_requests=40, kv_blocks=2048, profile="power_of_two")
    trace = trace_of(40)
    a, _ = simulate(cfg, trace)
    b, _ = simulate(cfg, trace)
    assert without_wall(a) == without_wall(b)
    other = [simulate(replace(cfg, seed=s), trace)[0] for s in (1, 2)]
    spreads = {json.dumps(d["sim"]["requests_per_instance"]) for d in (a, *other)}
    assert len(spreads) > 1, "three seeds of power-of-two routing gave the same placement"


async def test_the_summary_has_the_bench_keys(tmp_path: Path) -> None:
    """The same trace through ``tideserve bench`` against a simulated engine and through
    the simulator: the same keys at the top and inside each figure."""
    trace_path = write_trace(tmp_path / "t.jsonl", 2)
    fleet = EngineFleet(tmp_path, profile="test", speedup=50.0)
    try:
        _, url = await fleet.start()
        bench, _ = await run_bench(
            BenchConfig(targets=(url,), timeout_s=60.0), load_trace(trace_path)
        )
    finally:
        await fleet.close()
    sim, _ = simulate(SimConfig(engines=1, max_requests=2), load_trace(trace_path))
    assert set(sim) - set(SIM_KEYS) == set(bench) - set(BENCH_WALL_KEYS)
    for key, value in bench.items():
        if isinstance(value, dict) and key not in ("targets", "config", "errors", *BENCH_WALL_KEYS):
            assert set(sim[key]) == set(value), key


# -- the CLI ------------------------------------------------------------------------------
def test_the_cli_writes_json_and_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 12)
    out, tl = tmp_path / "o.json", tmp_path / "o.csv"
    argv = ["sim", "--trace", str(trace), "--engines", "2", "--kv-blocks", "2048",
            "--out", str(out), "--timeline", str(tl), "--max-requests", "30"]  # fmt: skip
    assert tideserve_main(argv) == 0
    assert capsys.readouterr().err == ""  # no progress when stderr is not a terminal
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["completed"] == 30 and doc["trace"]["requests_replayed"] == 30
    lines = tl.read_text(encoding="utf-8").splitlines()
    assert lines[0].split(",") == list(COLUMNS) and len(lines) >= 2


@pytest.mark.parametrize("profiles", ["default", "default,cache_aware"], ids=["one", "two"])
def test_the_cli_plots_replicas_and_load(tmp_path: Path, profiles: str) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (a test dependency)")
    trace = write_trace(tmp_path / "t.jsonl", 12)
    png = tmp_path / "p.png"
    argv = ["--trace", str(trace), "--engines", "2", "--kv-blocks", "2048", "--max-requests",
            "30", "--profile", profiles, "--out", str(tmp_path / "o.json"), "--plot", str(png)]  # fmt: skip
    assert sim_main(argv) == 0
    names = [png] if "," not in profiles else [tmp_path / f"p-{n}.png" for n in profiles.split(",")]
    for path in names:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cli_compares_profiles_each_on_a_fresh_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 12)
    out, tl = tmp_path / "c.json", tmp_path / "c.csv"
    common = ["--trace", str(trace), "--engines", "2", "--kv-blocks", "2048",
              "--max-requests", "30"]  # fmt: skip
    argv = ["sim", *common, "--profile", "default,cache_aware", "--out", str(out),
            "--timeline", str(tl)]  # fmt: skip
    assert tideserve_main(argv) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [r["profile"] for r in doc["comparison"]] == ["default", "cache_aware"]
    assert doc["comparison"][0]["ttft_mean_ms_vs_default"] == 1.0
    assert "cache_aware" in capsys.readouterr().out  # the table
    assert (tmp_path / "c-default.csv").exists() and (tmp_path / "c-cache_aware.csv").exists()
    # each profile's summary is the one its own run writes (a fresh fleet, no shared state)
    alone = tmp_path / "alone.json"
    assert tideserve_main(["sim", *common, "--profile", "cache_aware", "--out", str(alone)]) == 0
    single = json.loads(alone.read_text(encoding="utf-8"))
    assert doc["profiles"]["cache_aware"]["ttft_ms"] == single["ttft_ms"]
    assert single["config"]["shaper_hold_ms"] == 0.0  # a baseline: no dispatch order


def test_a_bad_second_profile_writes_no_timeline_of_the_first(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 4)
    tl = tmp_path / "c.csv"
    with pytest.raises(SystemExit) as exc:
        sim_main(["--trace", str(trace), "--engines", "1", "--profile", "default,nope",
                  "--out", str(tmp_path / "c.json"), "--timeline", str(tl)])  # fmt: skip
    assert exc.value.code == 2 and list(tmp_path.glob("c*")) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--trace"),
        (["--engines", "0"], "--engines must be at least 1"),
        (["--engines", "2", "--prefill", "1", "--decode", "1"], "not allowed with"),
        (["--prefill", "2"], "needs both --prefill N and --decode M"),
        (["--prefill", "0", "--decode", "0"], "both at least 1"),
        (["--rate-scale", "0"], "--rate-scale must be > 0"),
        (["--speedup", "fast"], "not a number"),
        (["--max-requests", "0"], "--max-requests must be at least 1"),
        (["--gateways", "0"], "--gateways must be at least 1"),
        (["--autoscale", "--max-replicas", "0"], "--max-replicas must be at least 1"),
        (["--profile", "nope"], "unknown routing profile 'nope'"),
        (["--profile", "default,nope"], "unknown routing profile 'nope'"),
        (["--engine-profile", "nope"], "unknown performance profile 'nope'"),
        (["--gateway-perf-profile", "nope"], "unknown performance profile 'nope'"),
        (["--offset", "99"], "skips the whole trace"),
        (["--trace", "/nonexistent/t.jsonl"], "cannot read trace"),
        (["--bad-line"], "cannot read"),
        (["--out", "/nonexistent/dir/o.json"], "no such directory"),
    ],
    ids=["no-trace", "zero-engines", "engines-and-pd", "prefill-only", "pd-zero",
         "zero-rate", "rate-not-number", "zero-requests", "zero-gateways", "zero-max-replicas", "unknown-profile",
         "unknown-second-profile",
         "unknown-engine-profile", "unknown-gateway-profile", "offset-past-end", "missing-trace", "bad-trace-line",
         "bad-out-dir"],
)  # fmt: skip
def test_the_cli_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 4)
    out = tmp_path / "o.json"
    if argv == ["--bad-line"]:
        trace.write_text(trace.read_text() + "{not json\n", encoding="utf-8")
        argv, message = [], "not valid JSON"
    base = [] if argv == [] and message == "--trace" else ["--trace", str(trace)]
    if "--out" not in argv:
        base += ["--out", str(out)]
    with pytest.raises(SystemExit) as exc:
        sim_main([*base, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tideserve sim: error: "), err
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize(
    "h", [0, 7, 0xABCDEF, 10_002_005, 2**40 + 3], ids=["zero", "small", "hex", "weka", "huge"]
)
def test_prompt_blocks_are_the_bench_synthesizers_tokens(h: int) -> None:
    p = Prompts()
    assert p.block_tokens(h) == tuple(tokenize(p.synth.block_text(h)))


@pytest.mark.parametrize(
    ("hash_ids", "input_length"),
    [
        ((1, 2, 3), 1536),
        ((1, 2, 3), 1000),  # the last block cut short
        ((5, 5, 6), 1300),  # a repeated block
        ((4, 7), 0),
    ],
    ids=["whole", "cut", "repeat", "empty"],
)
def test_prompt_tokens_are_the_blocks_in_order(
    hash_ids: tuple[int, ...], input_length: int
) -> None:
    """A prompt's new blocks are made together and reused: the same tokens as one by one."""
    p, one = Prompts(), Prompts()
    p.tokens(TraceRequest(0, 1, 0.0, 512, 1, (1, 5)))  # some blocks already made
    r = TraceRequest(1, 2, 0.0, input_length, 1, hash_ids)
    want = list(one.role)
    for h in hash_ids:
        want.extend(one.block_tokens(h))
    want = want[: len(one.role) + input_length]
    assert p.tokens(r) == tuple(want)
    ids, payload = p.prompt(r)  # from the memo
    assert ids == array("I", want)
    assert payload == ids.tobytes()


def test_sim_speed_reports_each_size(tmp_path: Path) -> None:
    """benchmarks/sim_speed.py runs and reports the documented fields (no timing checked)."""
    bench_dir = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    speed = importlib.import_module("sim_speed")
    trace, out = write_trace(tmp_path / "t.jsonl", 6), tmp_path / "speed.json"
    argv = ["--trace", str(trace), "--instances", "1,2", "--requests", "8", "--out", str(out)]
    assert speed.main(argv) == 0
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert [(r["instances"], r["requests"], r["completed"]) for r in runs] == [(1, 8, 8), (2, 8, 8)]
    keys = {"wall_s", "requests_per_s", "cpu_s", "requests_per_cpu_s", "events", "events_per_s"}
    assert all(keys <= set(r) for r in runs)


def test_two_processes_write_the_same_bytes_apart_from_wall(tmp_path: Path) -> None:
    """Byte-identical across processes with different string-hash salts (no set or dict
    order of salted hashes reaches the results)."""
    trace = write_trace(tmp_path / "t.jsonl", 16)
    texts = []
    for salt in ("1", "2"):
        out = tmp_path / f"o{salt}.json"
        argv = [sys.executable, "-m", "services.sim", "--trace", str(trace), "--prefill", "1",
                "--decode", "2", "--gateways", "2", "--kv-blocks", "2048", "--autoscale",
                "--out", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": salt}
        subprocess.run(argv, check=True, env=env, cwd=Path(__file__).resolve().parents[2])
        doc = json.loads(out.read_text(encoding="utf-8"))
        doc.pop("wall")
        texts.append(json.dumps(doc, indent=2))
    assert texts[0] == texts[1]


def burst_then_tail(burst: int, tail: int) -> Trace:
    """``burst`` distinct 6k-token prompts 100 ms apart, then ``tail`` small ones 30 s apart."""
    lines = [
        json.dumps(
            {
                "timestamp": i * 100,
                "input_length": 6000,
                "output_length": 200,
                "hash_ids": [i * 100 + k for k in range(12)],
            }
        )
        for i in range(burst)
    ]
    lines += [json.dumps({"timestamp": burst * 100 + j * 30_000, "input_length": 600,
                          "output_length": 20, "hash_ids": [99_000 + j, 99_500 + j]})
              for j in range(tail)]  # fmt: skip
    return Trace("burst.jsonl", "mooncake", tuple(parse_mooncake(lines)))


@pytest.mark.parametrize(
    ("cfg", "tail", "grows", "shrinks"),
    [
        (SimConfig(engines=1, kv_blocks=4096), 0, True, False),
        (SimConfig(engines=1, kv_blocks=4096), 40, True, True),
        (SimConfig(prefill=1, decode=1, kv_blocks=4096), 0, True, False),
    ],
    ids=["burst-scales-up", "quiet-tail-scales-down", "pd-roles"],
)
def test_autoscaling_starts_and_drains_instances_without_losing_a_request(
    cfg: SimConfig, tail: int, grows: bool, shrinks: bool
) -> None:
    scaling = AutoscaleConfig(max_replicas=8, startup_s=10.0, tick_s=10.0)
    doc, run = simulate(replace(cfg, autoscale=scaling, timeline_s=5.0), burst_then_tail(120, tail))
    assert doc["completed"] == 120 + tail and doc["failed"] == 0
    assert [r.endings for r in run.requests] == [1] * (120 + tail)
    auto = doc["sim"]["autoscale"]
    assert (auto["peak_replicas"] > cfg.instances) == grows
    assert (auto["instances_removed"] > 0) == shrinks
    served = {r.target for r in run.requests}
    removed = {i.iid for i in run.engines if i.removed}
    # an instance stopped while it was starting never served; a drained one did
    assert all(run.engines[i].ready for i in served & removed)
    replicas = {sum(r[f"replicas_{k}"] for k in ("worker", "prefill", "decode"))
                for r in run.timeline.rows}  # fmt: skip
    assert len(replicas) > 1
