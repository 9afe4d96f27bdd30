"""KV capacity in an engine's load report: the /metrics scrape and the load stream."""

from __future__ import annotations

from typing import Literal

import pytest
from tideserve.v1 import events_pb2

from services.common.engine_load import parse_metrics
from services.engine.metrics import EngineMetrics, Gauges
from services.scheduler.feeds.load_stream import load_report

VLLM = "vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.25\n"
SGLANG = "sglang:num_running_reqs 2\nsglang:token_usage 0.25\n"
INFO = 'vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="%s"} 1.0\n'


@pytest.mark.parametrize(
    ("page", "capacity"),
    [
        (VLLM + INFO % "661", 661 * 16),
        (VLLM + INFO % "None", 0),  # vLLM before the cache is profiled
        (VLLM, 0),
        (VLLM + 'vllm:cache_config_info{block_size="16"} 1\n', 0),
        (SGLANG + 'sglang:max_total_num_tokens{model_name="m"} 161721.0\n', 161721),
        (SGLANG + "sglang:max_total_num_tokens NaN\n", 0),
        (SGLANG, 0),
    ],
    ids=[
        "vllm",
        "vllm-unprofiled",
        "vllm-none",
        "vllm-no-blocks",
        "sglang",
        "sglang-nan",
        "sglang-none",
    ],
)
def test_scrape_reads_kv_capacity(page: str, capacity: int) -> None:
    report = parse_metrics(page)
    assert report is not None
    assert (report.kv_capacity_tokens, report.kv_usage, report.running) == (capacity, 0.25, 2)


@pytest.mark.parametrize(
    ("blocks", "block_size", "tokens"),
    [(2300, 64, 147200), (0, 64, 0), (-5, 16, 0)],
    ids=["reported", "unreported", "negative"],
)
def test_load_stream_capacity_in_tokens(blocks: int, block_size: int, tokens: int) -> None:
    snap = events_pb2.LoadSnapshot(kv_capacity_blocks=blocks, kv_usage=0.5)
    assert load_report(snap, block_size).kv_capacity_tokens == tokens


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
def test_simulated_engine_page_carries_its_capacity(dialect: Literal["sglang", "vllm"]) -> None:
    m = EngineMetrics(dialect, "m", kv_blocks=2300, block_size=64)
    page = m.render(Gauges(1, 0, 64, 0.5, 0.0, 0.0)).decode()
    report = parse_metrics(page)
    assert report is not None and report.kv_capacity_tokens == 2300 * 64
