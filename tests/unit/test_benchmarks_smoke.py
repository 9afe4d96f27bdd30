"""Smoke tests of the benchmark scripts: they import, parse their arguments, build the
commands and configs they would run, and compute their ratios from given figures. Nothing
here starts a process or measures time."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    return importlib.import_module(name)


@pytest.mark.parametrize(
    ("module", "argv", "expect"),
    [
        ("routing_compare", [], {"engines": 8, "pd": False, "routers": None}),
        ("routing_compare", ["--pd", "--prefill", "2", "--decode", "4"],
         {"pd": True, "prefill": 2, "decode": 4, "decode_can_prefill": False}),
        ("routing_compare", ["--pd", "--decode-can-prefill"], {"decode_can_prefill": True}),
        ("routing_compare", ["--routers", "sglang:round_robin", "--kv-blocks", "100"],
         {"routers": "sglang:round_robin", "kv_blocks": 100}),
        ("gateway_overhead", [], {"rates": "200,1000", "pin": "off"}),
        ("gateway_overhead", ["--rates", "50", "--no-stream"], {"rates": "50", "no_stream": True}),
        ("pick_rate", [], {"endpoints": 64, "block_size": 64}),
        ("pick_rate", ["--modes", "pure_cycle", "--endpoints", "8"],
         {"modes": "pure_cycle", "endpoints": 8}),
    ],
    ids=["rc-defaults", "rc-pd", "rc-pd-decode-can-prefill", "rc-routers", "ovh-defaults", "ovh-flags", "pick-defaults",
         "pick-flags"],
)  # fmt: skip
def test_argument_parsing(module: str, argv: list[str], expect: dict[str, Any]) -> None:
    args = _load(module).parse_args(argv)
    assert {k: getattr(args, k) for k in expect} == expect


def _plan(pd: bool) -> list[dict[str, Any]]:
    if not pd:
        return [{"role": "aggregated", "url": f"http://127.0.0.1:{p}", "port": p,
                 "bootstrap_port": 0} for p in (1001, 1002)]  # fmt: skip
    return [
        {"role": "prefill", "url": "http://127.0.0.1:1001", "port": 1001, "bootstrap_port": 9001},
        {"role": "decode", "url": "http://127.0.0.1:1002", "port": 1002, "bootstrap_port": 0},
    ]


@pytest.mark.parametrize(
    ("router", "pd", "present", "absent"),
    [
        ("tideserve:default", False, ["gateway", "--endpoints"], ["--profile"]),
        ("tideserve:least_load", False, ["--profile", "least_load"], []),
        ("tideserve:default", True, ["--prefill", "9001", "--decode", "--no-decode-can-prefill"],
         ["--endpoints", "--decode-can-prefill"]),
        ("sglang:cache_aware", False, ["--worker-urls", "--policy", "cache_aware",
                                       "--prometheus-port"], ["--pd-disaggregation"]),
        ("sglang:round_robin", True, ["--pd-disaggregation", "--prefill", "9001", "--decode",
                                      "round_robin"], ["--worker-urls"]),
    ],
    ids=["ts-default", "ts-profile", "ts-pd", "sglang-agg", "sglang-pd"],
)  # fmt: skip
def test_router_commands(router: str, pd: bool, present: list[str], absent: list[str]) -> None:
    rc = _load("routing_compare")
    args = rc.parse_args(["--pd"] if pd else [])
    args.slo_config_file = Path("/tmp/slo.yaml")
    cmd = _load("_compare_router").router_cmd(
        router, 5000, _plan(pd), args, Path("/venv/bin/python")
    )
    assert all(x in cmd for x in present), cmd
    assert not any(x in cmd for x in absent), cmd


@pytest.mark.parametrize(
    ("argv", "engine_profile", "present", "absent"),
    [
        ([], "h200-llama3.1-8b*1.2", ["--slo-config", "/tmp/slo.yaml"],
         ["--default-slo-class", "--perf-profile"]),
        (["--old-rules"], "h200-llama3.1-8b", ["--default-slo-class", "interactive"],
         ["--slo-config"]),
        (["--engine-slowdown", "1", "--profile", "test"], "test", ["--slo-config"], []),
    ],
    ids=["of-record", "old-rules", "no-slowdown"],
)  # fmt: skip
def test_comparison_rules(
    argv: list[str], engine_profile: str, present: list[str], absent: list[str]
) -> None:
    rc = _load("routing_compare")
    args = rc.parse_args(argv)
    args.slo_config_file = Path("/tmp/slo.yaml")
    cmd = _load("_compare_router").router_cmd("tideserve:default", 5000, _plan(False), args, None)
    assert rc.engine_profile(args) == engine_profile
    assert all(x in cmd for x in present), cmd
    assert not any(x in cmd for x in absent), cmd
    assert rc.gateway_perf_profile(args, None) == "h200-llama3.1-8b"


@pytest.mark.parametrize(
    ("ttft", "tpot"), [(2000.0, 100.0), (1500.0, 50.0)], ids=["issue-slo", "tighter"]
)
def test_slo_config_is_what_the_gateway_reads(tmp_path: Path, ttft: float, tpot: float) -> None:
    import yaml

    from services.scheduler import cli
    from services.scheduler.compose import Scheduler

    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump(_load("_compare_rules").slo_config(ttft, tpot)))
    parser = __import__("argparse").ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["gateway", "--endpoints", "http://a:1", "--slo-config", str(f)])
    core = Scheduler(cli.settings_from_args(args)).core
    assert core.ttft_budget_ms("") == ttft
    assert core.slo.tpot_ms[core.queue.config.default_class] == tpot


def test_runs_interleave_and_aggregate() -> None:
    rc = _load("routing_compare")
    args = rc.parse_args(["--routers", "tideserve:default,sglang:cache_aware", "--runs", "2"])
    assert [(n, v["run"]) for n, v in rc.run_plan(args, None)] == [
        ("tideserve:default", 0), ("sglang:cache_aware", 0),
        ("tideserve:default", 1), ("sglang:cache_aware", 1),
    ]  # fmt: skip
    results = [
        _result("tideserve:default", 400, 800, 2.0, run=0),
        _result("sglang:cache_aware", 1000, 1000, 1.0, run=0),
        _result("tideserve:default", 600, 900, 3.0, run=1),
        {"router": "sglang:cache_aware", "run": 1, "error": "x"},
    ]
    agg = rc.per_router(results)
    assert agg["tideserve:default"]["metrics"]["goodput_rps"] == {
        "mean": 2.5, "min": 2.0, "max": 3.0,
    }  # fmt: skip
    assert (agg["sglang:cache_aware"]["runs"], agg["sglang:cache_aware"]["errors"]) == (1, 1)
    out = rc.targets(rc.mean_results(results))
    assert out["vs_sglang:cache_aware"]["ttft_mean_ratio"] == 0.5
    assert out["vs_sglang:cache_aware"]["goodput_ratio"] == 2.5


def _result(router: str, ttft: float, p90: float, goodput: float, **extra: Any) -> dict[str, Any]:
    return {"router": router, "ttft_ms": {"mean": ttft, "p90": p90}, "goodput_rps": goodput,
            "cpu": {"saturated": False}, **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("results", "expect"),
    [
        (
            [_result("tideserve:default", 400, 800, 2.0, cache_hit_ratio=0.27,
                     infinite_cache_hit_ratio=0.3),
             _result("sglang:cache_aware", 1000, 1000, 1.5),
             _result("sglang:round_robin", 1000, 2000, 1.0)],
            {("vs_sglang:cache_aware", "ttft_met"): True,
             ("vs_sglang:round_robin", "ttft_mean_ratio"): 0.4,
             ("vs_sglang:round_robin", "goodput_met"): True,
             ("cache_hit_vs_infinite", "met"): True},
        ),
        (
            [_result("tideserve:default", 900, 900, 1.0, cache_hit_ratio=0.1,
                     infinite_cache_hit_ratio=0.3),
             _result("sglang:cache_aware", 1000, 1000, 1.0),
             _result("sglang:round_robin", 1000, 1000, 1.0)],
            {("vs_sglang:cache_aware", "ttft_met"): False,
             ("vs_sglang:round_robin", "goodput_met"): False,
             ("cache_hit_vs_infinite", "met"): False},
        ),
    ],
    ids=["targets-met", "targets-missed"],
)  # fmt: skip
def test_routing_targets(results: list[dict[str, Any]], expect: dict[tuple[str, str], Any]) -> None:
    out = _load("routing_compare").targets(results)
    assert {k: out[k[0]][k[1]] for k in expect} == expect


def test_routing_targets_without_our_result() -> None:
    out = _load("routing_compare").targets([{"router": "tideserve:default", "error": "x"}])
    assert "missing" in out


def test_nginx_config_serves_every_engine_path(tmp_path: Path) -> None:
    conf = _load("gateway_overhead").nginx_config(tmp_path, 4321, 3).read_text()
    for path in ("/health", "/metrics", "/get_server_info", "/v1/models", "/v1/completions",
                 "/v1/chat/completions", "/v1/messages", "/v1/responses"):  # fmt: skip
        assert f"location = {path} " in conf
    assert "listen 127.0.0.1:4321" in conf and conf.count('data: {"id": "chatcmpl') == 3
    # the native agent-API streams are files (past nginx's 4 KiB parameter limit)
    assert "event: response.incomplete" in (tmp_path / "canned" / "responses.sse").read_text()
    assert "event: message_stop" in (tmp_path / "canned" / "messages.sse").read_text()
    assert "$" not in conf  # nginx would interpolate variables in canned bodies


@pytest.mark.parametrize("stream", [False, True], ids=["completions", "chat-stream"])
def test_loadgen_request_is_valid_http(stream: bool) -> None:
    raw = _load("gateway_overhead").request_bytes("127.0.0.1", 80, stream, 16)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body).get("stream", False) is stream


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_loadgen_messages_request(stream: bool) -> None:
    raw = _load("gateway_overhead").request_bytes("127.0.0.1", 80, stream, 16, api="messages")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert (
        head.startswith(b"POST /v1/messages ") and f"Content-Length: {len(body)}".encode() in head
    )
    got = json.loads(body)
    assert (
        got["stream"] is stream and got["max_tokens"] == 8 and got["messages"][0]["role"] == "user"
    )


def test_agent_api_phases_are_streamed_per_rate() -> None:
    ovh = _load("gateway_overhead")
    args = ovh.parse_args(["--rates", "200,1000"])
    got = [(n, api) for n, _, stream, api in ovh.phases(args, True) if api != "chat" and stream]
    assert got == [
        ("200rps_messages_stream", "messages"), ("200rps_responses_stream", "responses"),
        ("1000rps_messages_stream", "messages"), ("1000rps_responses_stream", "responses"),
    ]  # fmt: skip
    no_stream = ovh.phases(ovh.parse_args(["--no-stream"]), True)
    assert [api for *_, api in no_stream] == ["chat", "chat"]


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        ([], ["200rps_nonstream", "200rps_stream", "1000rps_nonstream", "1000rps_stream"]),
        (["--rates", "50", "--no-stream"], ["50rps_nonstream"]),
    ],
    ids=["default-phases", "one-rate-no-stream"],
)
def test_open_loop_phases(argv: list[str], expect: list[str]) -> None:
    ovh = _load("gateway_overhead")
    assert [name for name, *_ in ovh.phases(ovh.parse_args(argv))] == expect


def test_responses_phase_streams_a_responses_request() -> None:
    ovh = _load("gateway_overhead")
    names = [(n, api) for n, _, _, api in ovh.phases(ovh.parse_args(["--rates", "50"]), True)]
    assert names[-1] == ("50rps_responses_stream", "responses")
    raw = ovh.request_bytes("127.0.0.1", 80, True, 16, (), "responses")
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/responses ") and json.loads(body)["store"] is False


def _phase(p50: float, p99: float, cpu: float) -> dict[str, Any]:
    return {"added_latency_ms": {"p50": p50, "p99": p99}, "router": {"cpu_us_per_request": cpu}}


@pytest.mark.parametrize(
    ("phases", "expect"),
    [
        (
            {"200rps_stream": _phase(1.0, 2.0, 800.0), "200rps_responses_stream": _phase(1.1, 3.0, 1000.0)},
            {"200rps": {"responses": {"added_p50": 1.1, "added_p99": 1.5, "cpu_per_request": 1.25}}},
        ),
        (
            {"200rps_stream": _phase(0.0, 2.0, 800.0), "200rps_messages_stream": _phase(1.0, 1.0, 400.0)},
            {"200rps": {"messages": {"added_p50": None, "added_p99": 0.5, "cpu_per_request": 0.5}}},
        ),
        ({"200rps_responses_stream": _phase(1.0, 1.0, 1.0)}, {}),
    ],
    ids=["ratios", "zero-chat-added-is-no-ratio", "no-chat-phase"],
)  # fmt: skip
def test_agent_apis_versus_chat(phases: dict[str, Any], expect: dict[str, Any]) -> None:
    assert _load("gateway_overhead").versus_chat(phases) == expect


@pytest.mark.parametrize(
    ("xs", "expect"),
    [([3.0, 1.0, 2.0], 2.0), ([5.0], 5.0), ([], None)],
    ids=["odd", "single", "empty"],
)
def test_median_of_repeats(xs: list[float], expect: float | None) -> None:
    assert _load("gateway_overhead")._med(xs) == expect


_W = "/w/services"


@pytest.mark.parametrize(
    ("frames", "stage"),
    [
        ([f"Gateway.handle ({_W}/scheduler/http/server.py", f"tokenize ({_W}/common/tokens/whitespace.py"],
         "tokenize and hash"),
        ([f"Gateway.handle ({_W}/scheduler/http/server.py", f"parse_request ({_W}/scheduler/http/openai.py",
          "loads (/usr/lib/json/__init__.py"], "parse"),
        ([f"AdmissionGate.take_in ({_W}/scheduler/admission/gate.py",
          f"AdmissionGate.lookup ({_W}/scheduler/admission/gate.py"], "prefix lookup"),
        ([f"AdmissionGate.take_in ({_W}/scheduler/admission/gate.py"], "admission"),
        ([f"Gateway._route ({_W}/scheduler/http/server.py", f"GatewayCore.pick ({_W}/common/scheduling/service.py",
          f"Scheduler._run ({_W}/common/routing/framework.py"], "pick"),
        ([f"open_upstream ({_W}/scheduler/http/upstream.py", "ClientSession._request (/x/aiohttp/client.py"],
         "forward"),
        ([f"middleware ({_W}/common/otel.py", f"middleware ({_W}/scheduler/http/records.py",
          "MetricWrapperBase.labels (/x/prometheus_client/metrics.py"], "record"),
        (["ResponseHandler.data_received (/x/aiohttp/client_proto.py"], "upstream client (aiohttp)"),
        (["RequestHandler.data_received (/x/aiohttp/web_protocol.py"], "HTTP server (aiohttp)"),
        (["run (/x/uvloop/__init__.py"], "event loop and other"),
    ],
    ids=["tokenize-inside-parse", "parse", "prefix-lookup", "admission", "pick", "forward",
         "record-inside-tracing", "upstream-client", "http-server", "loop"],
)  # fmt: skip
def test_profile_stage_of_a_sample(frames: list[str], stage: str) -> None:
    assert _load("gateway_profile").stage_of(frames) == stage


def test_profile_stage_shares() -> None:
    raw = (
        f"a (/x/asyncio/events.py;tokenize ({_W}/common/tokens/whitespace.py 3\n"
        f"pick ({_W}/common/scheduling/service.py 1\n"
    )
    shares, total = _load("gateway_profile").stage_shares(raw)
    assert total == 4 and shares == {"tokenize and hash": 0.75, "pick": 0.25}


@pytest.mark.parametrize(
    ("workload", "tokens"),
    [("short", 128), ("long_8k", 8192), ("long_64k", 65536)],
    ids=["short", "8k", "64k"],
)
def test_profile_workload_prompts_have_their_size(workload: str, tokens: int) -> None:
    raw = _load("gateway_profile").workload_request(workload, 80)
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert len(body["prompt"].split()) == tokens


def test_profile_agentic_request_is_about_64k_tokens_of_tool_rounds() -> None:
    from services.common.tokens import TokenPath

    body = _load("gateway_profile").agentic_body(64 * 1024)
    n = len(TokenPath().encode_chat(body["messages"]))
    assert 60_000 <= n <= 70_000
    assert sum(1 for m in body["messages"] if m["role"] == "tool") == 24 and body["stream"]


@pytest.mark.parametrize(
    ("argv", "weight"), [([], 4.0), (["--goodput-weight", "2"], 2.0)], ids=["default", "weight"]
)
def test_goodput_sim_profiles_load_with_the_candidate(
    tmp_path: Path, argv: list[str], weight: float
) -> None:
    from services.common.routing.config import load_config

    gs = _load("goodput_sim")
    path = Path(gs.profiles_file(gs.parse_args(argv), tmp_path))
    sched = load_config(path)
    scorers = {s.name: w for s, w in sched.profiles["goodput"].scorers}
    assert scorers["goodput"] == weight and "default" in sched.profiles


@pytest.mark.parametrize(
    ("slo_ttft_ms", "expected_share"), [(60_000.0, 0.0), (1.0, 1.0)], ids=["all-feasible", "none"]
)
def test_goodput_sim_ceiling(slo_ttft_ms: float, expected_share: float) -> None:
    from services.common.bench.traces import Trace, parse_mooncake
    from services.sim import SimConfig, simulate

    lines = [json.dumps({"timestamp": i * 500, "input_length": 1100, "output_length": 8,
                         "hash_ids": [i // 2, 100 + i, 200 + i]}) for i in range(6)]  # fmt: skip
    trace = Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(lines)))
    cfg = SimConfig(engines=2, max_requests=6, kv_blocks=2048, slo_ttft_ms=slo_ttft_ms,
                    keep_block_hashes=True)  # fmt: skip
    _, run = simulate(cfg, trace)
    out = _load("goodput_sim").ceiling(run, cfg)
    assert out["infeasible_share"] == expected_share
    assert out["max_attainment"] == 1.0 - expected_share


@pytest.mark.parametrize(
    ("profile", "ok"),
    [("cache_aware", True), ("cache_aware+inflight", True), ("cache_aware+bogus", False)],
    ids=["plain", "inflight", "unknown-variant"],
)
def test_goodput_sim_profile_variants(tmp_path: Path, profile: str, ok: bool) -> None:
    from services.common.bench.traces import Trace, parse_mooncake

    gs = _load("goodput_sim")
    lines = [json.dumps({"timestamp": i * 50, "input_length": 700, "output_length": 4,
                         "hash_ids": [i % 2, 100 + i]}) for i in range(6)]  # fmt: skip
    trace = Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(lines)))
    a = gs.parse_args(["--profiles", profile, "--engines", "2", "--kv-blocks", "2048"])
    pfile = gs.profiles_file(a, tmp_path)
    if not ok:
        with pytest.raises(SystemExit, match="unknown profile variant"):
            gs.run_cell(a, trace, 0, 6, 1.0, pfile)
        return
    cell = gs.run_cell(a, trace, 0, 6, 1.0, pfile)
    assert cell["profiles"][profile]["failed"] == 0


@pytest.mark.parametrize(
    ("gap_ms", "expected_share"),
    [(500.0, 0.5), (10.0, 1.0)],
    ids=["after-the-prefill", "during-the-prefill"],
)
def test_goodput_sim_ceiling_counts_a_prefix_once_computed(
    gap_ms: float, expected_share: float
) -> None:
    """Two requests with the same prompt, under a TTFT SLO that only a cached prompt meets
    (1,100 tokens: about 40 ms of prefill + 74 ms to the first chunk; cached, about 5 ms):
    the second is feasible only when it arrives after the first's prefill could have ended."""
    from services.common.bench.traces import Trace, parse_mooncake
    from services.sim import SimConfig, simulate

    lines = [json.dumps({"timestamp": t, "input_length": 1100, "output_length": 8,
                         "hash_ids": [0, 1, 2]}) for t in (0.0, gap_ms)]  # fmt: skip
    trace = Trace("mem.jsonl", "mooncake", tuple(parse_mooncake(lines)))
    cfg = SimConfig(engines=2, max_requests=2, kv_blocks=2048, slo_ttft_ms=100.0,
                    keep_block_hashes=True)  # fmt: skip
    _, run = simulate(cfg, trace)
    assert _load("goodput_sim").ceiling(run, cfg)["infeasible_share"] == expected_share


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("conversation:0:400:2.5", ("mooncake_conversation_trace.jsonl", 0, 400, 2.5)),
        ("agentic:300:200:0.5", ("weka_agentic_dev.jsonl", 300, 200, 0.5)),
        ("/x/my:trace.jsonl:5:10:1", ("my:trace.jsonl", 5, 10, 1.0)),
    ],
    ids=["conversation", "agentic", "a-path-with-a-colon"],
)
def test_fidelity_cells(text: str, expect: tuple[str, int, int, float]) -> None:
    path, offset, n, rate, _ = _load("sim_fidelity").parse_cell(text)
    assert (path.name, offset, n, rate) == expect


def test_fidelity_gap_is_sim_over_the_live_mean_and_summary_takes_the_largest() -> None:
    fid = _load("sim_fidelity")
    live = [{"ttft_ms": {"p90": 1000.0}, "cache_hit_ratio": 0.5},
            {"ttft_ms": {"p90": 3000.0}, "cache_hit_ratio": 0.5}]  # fmt: skip
    g = fid.gaps(live, {"ttft_ms": {"p90": 1800.0}, "cache_hit_ratio": 0.55})
    assert g["ttft_ms.p90"] == {"live": 2000.0, "live_runs": [1000.0, 3000.0], "sim": 1800.0,
                                "gap": -0.1}  # fmt: skip
    assert g["cache_hit_ratio"]["gap"] == 0.1 and g["tpot_ms.p50"]["gap"] is None
    other = fid.gaps(live[:1], {"ttft_ms": {"p90": 1300.0}})
    s = fid.summarize([{"gaps": g}, {"gaps": other}])
    assert s["ttft_ms.p90"] == {"max_abs_gap": 0.3, "mean_abs_gap": 0.2, "within_10pct": 1,
                                "of": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("saturated_flags", "expect_rows", "expect_p50"),
    [
        pytest.param((False, False), 2, {"max_abs_gap": 0.2, "mean_abs_gap": 0.125,
                                         "within_10pct": 1, "of": 2}, id="both-clean"),
        pytest.param((False, True), 1, {"max_abs_gap": 0.05, "mean_abs_gap": 0.05,
                                        "within_10pct": 1, "of": 1}, id="saturated-left-out"),
        pytest.param((True, True), 0, None, id="none-clean"),
    ],
)  # fmt: skip
def test_sim_vs_live_fidelity_counts_unsaturated_rows_only(
    saturated_flags: tuple[bool, bool], expect_rows: int, expect_p50: dict[str, Any] | None
) -> None:
    svl = _load("goodput_sim_vs_live")
    rows = [{"live_saturated": sat, "gap": {"ttft_ms.p50": g, "tpot_ms.p90": None}}
            for sat, g in zip(saturated_flags, (0.05, -0.2), strict=True)]  # fmt: skip
    got = svl.fidelity(rows)
    assert got["rows"] == expect_rows and got["rows_saturated_left_out"] == 2 - expect_rows
    assert got.get("ttft_ms.p50") == expect_p50 and "tpot_ms.p90" not in got
    assert svl.saturated([{"cpu": {"saturated": False}}, {"cpu": {"saturated": True}}])
    assert not svl.saturated([{"cpu": None}, {}])


def test_fidelity_slice_starts_at_zero(tmp_path: Path) -> None:
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 10,
                                       "output_length": 2, "hash_ids": [i]}) + "\n"
                           for i in range(5)))  # fmt: skip
    out = _load("sim_fidelity").write_slice(src, 2, 2, tmp_path / "s.jsonl")
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["timestamp"], r["hash_ids"]) for r in rows] == [(0, [2]), (100, [3])]


def test_instructions_per_request_and_against_chat(tmp_path: Path) -> None:
    ins = _load("gateway_instructions")
    got = ins.per_request({"chat": [1000, 1200], "responses": [1300, 1450]}, 10)
    assert got == {
        "chat": {"instructions_per_request": 110, "rounds": [100, 120], "vs_chat": 1.0},
        "responses": {"instructions_per_request": 138, "rounds": [130, 145], "vs_chat": 1.25},
    }
    dump = tmp_path / "callgrind.out.1"
    dump.write_text("events: Ir\nsummary: 0\n\nfn=x\n1 5\ntotals: 4242\n")
    assert ins.totals(dump) == 4242


@pytest.mark.parametrize(
    ("cfg_kw", "disaggregated"),
    [
        pytest.param({"prefill": 1, "decode": 2}, 24, id="pd-all-disaggregated"),
        pytest.param({"prefill": 1, "decode": 2, "decode_keeps_kv": True}, 24, id="pd-keeps-kv"),
        pytest.param({"engines": 3}, 0, id="aggregated-all-local"),
    ],
)
def test_pd_breakdown_phases_add_up_to_the_ttft(cfg_kw: dict[str, Any], disaggregated: int) -> None:
    from services.sim.config import SimConfig
    from tests.helpers.sim_traces import trace_of

    mod = _load("pd_breakdown")
    sim = mod.Observed(SimConfig(max_requests=24, kv_blocks=2048, **cfg_kw), trace_of(24))
    run = sim.run()
    out = mod.breakdown(sim, run.requests)
    assert out["disaggregated"] == disaggregated
    assert out["disaggregated"] + out["local"] == 24
    if disaggregated:
        total = sum(out["phases_ms"].values())
        assert total == pytest.approx(out["ttft_ms_disaggregated"], abs=1.0)


@pytest.mark.parametrize(
    ("others", "count", "passes"),
    [(2, 3, True), (0, 1, True), (1, 3, False)],
    ids=["last-of-three", "alone", "one-missing-times-out"],
)  # fmt: skip
def test_start_barrier(tmp_path: Path, others: int, count: int, passes: bool) -> None:
    """A run leaves its file and goes on once the barrier holds ``count`` (the others' files
    already there); with one still missing it gives up at the timeout."""
    fleet = _load("_compare_fleet")
    harness = _load("_harness")
    where = tmp_path / "started"
    where.mkdir()
    for i in range(others):
        (where / f"other-{i}").touch()
    group = harness.ProcGroup(tmp_path / "logs")
    spec = f"{where}:{count}"
    if passes:
        rank = fleet.wait_barrier(spec, "run", group, timeout_s=5.0, stagger_s=0.0)
        assert rank == others  # "other-*" sort before "run-*": its bench starts last
    else:
        with pytest.raises(RuntimeError, match="fewer than 3 runs up"):
            fleet.wait_barrier(spec, "run", group, timeout_s=0.0)
    assert len(list(where.iterdir())) == others + 1


def test_engines_start_one_at_a_time_on_the_machine(tmp_path: Path) -> None:
    """While one benchmark process starts an engine, another cannot take the start lock."""
    import fcntl

    fleet = _load("_compare_fleet")
    lock = tmp_path / "start.lock"

    def try_lock() -> bool:
        with lock.open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True

    with fleet.starting(lock):
        assert not try_lock()
    assert try_lock()


@pytest.mark.parametrize(
    ("windows", "missed", "want"),
    [
        (40, [], [(1, 20, 20, 1200.0), (2, 20, 20, 1200.0)]),
        (40, [0, 19, 20], [(1, 20, 18, 1200.0), (2, 20, 19, 1200.0)]),
        (50, [45], [(1, 20, 20, 1200.0), (2, 20, 20, 1200.0), (3, 10, 9, 600.0)]),
    ],
    ids=["all-met", "misses-split-by-day", "partial-last-day"],
)
def test_tide_sim_per_day(
    windows: int, missed: list[int], want: list[tuple[int, int, int, float]]
) -> None:
    tide = _load("tide_sim")
    rows = [{"t_s": 60.0 * i, "replicas_prefill": 1} for i in range(windows)]
    got = tide.per_day({"windows": windows, "missed": missed}, rows, 60.0, 1200.0, 60.0)
    assert [(d["day"], d["windows"], d["met"], d["replica_s"]) for d in got] == want


@pytest.mark.parametrize(
    ("static", "want"),
    [("8,3", {"prefill": 8, "decode": 3}), ("12", {"engines": 12})],
    ids=["pd", "aggregated"],
)
def test_tide_sim_fleet(static: str, want: dict[str, int]) -> None:
    tide = _load("tide_sim")
    cfg = tide.fleet(tide.SimConfig(), static)
    assert {k: getattr(cfg, k) for k in ("engines", "prefill", "decode") if k in want} == want
    assert cfg.pd is ("prefill" in want)


def test_tide_sim_agent_memory_in_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sessions over a rate curve with the tier in the loop: one table per memory mode,
    each policy against that mode's static fleet, with the memory's figures."""
    tide = _load("tide_sim")
    curve = tmp_path / "rate.csv"
    curve.write_text("t_s,rate_rps\n0,40\n86400,40\n")
    lengths = tmp_path / "sessions.jsonl"
    with lengths.open("w") as f:  # 4 sessions of 3 turns, each turn extending the last
        for turn in range(3):
            for s in range(4):
                ids = [1000 * s + k for k in range(4 + 2 * turn)]
                f.write(json.dumps({"timestamp": turn * 1000 + s, "input_length": 512 * len(ids),
                                    "output_length": 8, "hash_ids": ids}) + "\n")  # fmt: skip
    out = tmp_path / "out.json"
    args = ["--curve", str(curve), "--lengths", str(lengths), "--days", "0.0005",
            "--day-s", "86400", "--static", "2", "--agent-memory", "lru,retention",
            "--slo-ttft-ms", "5000", "--slo-tpot-ms", "100", "--out", str(out)]  # fmt: skip
    assert tide.main(args) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert "policies" not in doc and set(doc["agent_memory"]) == {"lru", "retention"}
    for mode, runs in doc["agent_memory"].items():
        assert set(runs) == {"static", "planner"}
        static = runs["static"]
        assert static["replica_s_vs_static"] == 1.0 and static["peak_replicas"] == 2
        mem = static["agent_memory"]
        assert mem["mode"] == mode and mem["resumed_turns"] > 0
        assert mem["scale_ins"] == {"victims": 0, "active_sessions": 0, "prefix_blocks": 0,
                                    "kept_ratio": None}  # fmt: skip
        assert static["completed"] == doc["load"]["requests"]


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("aggregated", {"engines": 8, "pd": False, "fail_role": None, "agent_memory": None}),
        ("pd_prefill", {"prefill": 3, "decode": 5, "pd": True, "fail_role": "prefill"}),
        ("pd_decode", {"pd": True, "fail_role": "decode"}),
        ("memory_retention", {"agent_memory": "retention", "kv_blocks": 2300, "rate_scale": 0.1}),
    ],
    ids=["aggregated", "pd-prefill", "pd-decode", "memory"],
)  # fmt: skip
def test_sim_failures_cases(case: str, expect: dict[str, Any]) -> None:
    mod = _load("sim_failures")
    cfg = mod.case_config(case, mod.parse_args(["--offsets", "7"]), 7, 2).validate()
    assert (cfg.offset, cfg.seed) == (7, 2)
    assert {k: getattr(cfg, k) for k in expect} == expect


def test_sim_failures_aggregate_means_and_spreads() -> None:
    mod = _load("sim_failures")
    rows = [{"offset": 0, "seed": 0, "dead": ["a"], "failed": 2, "reuse": None},
            {"offset": 0, "seed": 1, "dead": ["b"], "failed": 5, "reuse": None}]  # fmt: skip
    assert mod.aggregate(rows) == {"failed": {"mean": 3.5, "spread": 3, "n": 2}}
