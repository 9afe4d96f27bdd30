"""When the simulated gateway learns that a request ended (``SimConfig.end_lag_ms``)."""

from __future__ import annotations

import json

import pytest

from services.common.bench.traces import Trace, parse_mooncake
from services.sim import SimConfig, SimConfigError, simulate


def _two(second_at_ms: float) -> Trace:
    """A short request at 0, then an unrelated one at ``second_at_ms``."""
    lines = [
        json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}),
        json.dumps(
            {"timestamp": second_at_ms, "input_length": 600, "output_length": 4,
             "hash_ids": [7, 8]}
        ),
    ]  # fmt: skip
    return Trace("two.jsonl", "mooncake", tuple(parse_mooncake(lines)))


def _cfg(lag: float) -> SimConfig:
    return SimConfig(
        engines=2, profile="cache_aware", load_source="stream", kv_blocks=2048, end_lag_ms=lag
    )


@pytest.mark.parametrize(
    ("lag_ms", "same_engine"),
    [(0.0, True), (5.0, True), (60.0, False)],
    ids=["at-once", "lag-shorter-than-the-gap", "lag-longer-than-the-gap"],
)
def test_the_next_pick_counts_a_request_until_its_end_is_learnt(
    lag_ms: float, same_engine: bool
) -> None:
    # the first request's end in modelled ms, then an unrelated one 20 ms after it: the
    # gateway counts the first on its engine until it learns of its end, so sglang-router's
    # least-loaded fallback sends the second to the other engine; once learnt, both are
    # idle and it takes the first of equals, the first request's
    _, probe = simulate(_cfg(0.0), _two(10_000))
    first = probe.requests[0]
    assert first.last is not None
    _, run = simulate(_cfg(lag_ms), _two(first.last + 20.0))
    a, b = run.requests
    assert a.last == first.last  # the lag changes what the gateway sees, not the engines
    assert (a.target == b.target) is same_engine


def test_a_negative_end_lag_is_refused() -> None:
    with pytest.raises(SimConfigError, match="--end-lag-ms"):
        SimConfig(end_lag_ms=-1.0).validate()
