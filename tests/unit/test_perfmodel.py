"""The shared performance model: the shapes the scheduler and the simulator rely on."""

from __future__ import annotations

import pytest

from services.common.perfmodel import DEFAULT_PROFILE, PROFILES, PerfProfile, get_profile

ALL = sorted(PROFILES)


@pytest.fixture(params=ALL, ids=ALL)
def profile(request: pytest.FixtureRequest) -> PerfProfile:
    return PROFILES[request.param]


def test_default_profile_exists_and_unknown_name_lists_known_ones() -> None:
    assert get_profile(DEFAULT_PROFILE).name == DEFAULT_PROFILE
    with pytest.raises(KeyError, match=r"h200-llama3\.1-8b"):
        get_profile("no-such-gpu")


@pytest.mark.parametrize(
    ("name", "kv_bytes"),
    [("h200-llama3.1-8b", 131_072), ("h200x8-llama3.1-70b", 327_680), ("test", 4_096)],
    ids=["8b", "70b", "test"],
)
def test_kv_bytes_per_token_is_two_layers_kvheads_headdim_dtype(name: str, kv_bytes: int) -> None:
    assert get_profile(name).kv_bytes_per_token == kv_bytes


def test_prefill_time_grows_with_uncached_tokens(profile: PerfProfile) -> None:
    times = [profile.prefill_ms(n) for n in (1024, 2048, 8192, 32768)]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_full_cache_hit_costs_nothing_and_partial_hit_is_cheaper(profile: PerfProfile) -> None:
    prompt = 16_384
    cold = profile.prefill_ms(prompt)
    warm = profile.prefill_ms(prompt - 12_288, cached_tokens=12_288)
    assert profile.prefill_ms(0, cached_tokens=prompt) == 0.0
    assert 0.0 < warm < cold


def test_cached_context_makes_extension_cost_more(profile: PerfProfile) -> None:
    # The attention term: appending to a long context costs more than starting fresh.
    assert profile.prefill_ms(4096, cached_tokens=60_000) > profile.prefill_ms(4096)


def test_decode_step_grows_with_batch_and_with_context(profile: PerfProfile) -> None:
    by_batch = [profile.decode_step_ms(b, 1000 * b) for b in (1, 8, 64, 256)]
    by_ctx = [profile.decode_step_ms(8, ctx) for ctx in (1_000, 100_000, 1_000_000)]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == len(by_batch)
    assert by_ctx == sorted(by_ctx) and len(set(by_ctx)) == len(by_ctx)
    assert profile.decode_step_ms(0, 0) == 0.0


def test_mixed_step_reads_weights_once(profile: PerfProfile) -> None:
    mixed = profile.step_ms([(512, 0)], 16, 16_000)
    separate = profile.prefill_ms(512) + profile.decode_step_ms(16, 16_000)
    assert max(profile.prefill_ms(512), profile.decode_step_ms(16, 16_000)) <= mixed < separate


def test_transfer_is_latency_plus_bytes_over_bandwidth(profile: PerfProfile) -> None:
    t = profile.transfer_ms(10_000)
    expected = (
        profile.link_latency_ms + 10_000 * profile.kv_bytes_per_token / profile.link_bandwidth * 1e3
    )
    assert t == pytest.approx(expected)
    assert profile.transfer_ms(0) == 0.0


@pytest.mark.parametrize(
    ("name", "lo_tok_s", "hi_tok_s", "lo_ms", "hi_ms"),
    [
        ("h200-llama3.1-8b", 15_000, 40_000, 3.0, 8.0),
        ("h200x8-llama3.1-70b", 10_000, 30_000, 5.0, 12.0),
    ],
    ids=["8b", "70b"],
)
def test_published_order_of_magnitude(
    name: str, lo_tok_s: float, hi_tok_s: float, lo_ms: float, hi_ms: float
) -> None:
    p = get_profile(name)
    assert lo_tok_s < p.prefill_tokens_per_s(4096) < hi_tok_s
    assert lo_ms < p.decode_step_ms(1, 1000) < hi_ms
    assert p.kv_capacity_tokens > p.max_context


@pytest.mark.parametrize("factor", [2.0, 0.5], ids=["twice-as-slow", "twice-as-fast"])
def test_slowed_profile_scales_every_time(factor: float) -> None:
    base = get_profile("h200-llama3.1-8b")
    slow = get_profile(f"h200-llama3.1-8b*{factor:g}")
    assert slow.name == f"h200-llama3.1-8b*{factor:g}"
    for n, c in ((64, 0), (4096, 1000)):
        assert slow.prefill_ms(n, c) == pytest.approx(factor * base.prefill_ms(n, c))
    assert slow.decode_step_ms(32, 64_000) == pytest.approx(
        factor * base.decode_step_ms(32, 64_000)
    )
    assert slow.transfer_ms(1000) == pytest.approx(factor * base.transfer_ms(1000))
    assert slow.kv_capacity_tokens == base.kv_capacity_tokens


@pytest.mark.parametrize("name", ["nope", "h200-llama3.1-8b*x", "h200-llama3.1-8b*0"])
def test_unknown_or_bad_scaled_profile(name: str) -> None:
    with pytest.raises(KeyError, match="NAME\\*FACTOR"):
        get_profile(name)


@pytest.mark.parametrize(
    ("batch", "context", "steps"),
    [(1, 1_000, 1), (8, 40_000, 300), (256, 100_000, 400), (256, 2_000_000, 50), (3, 0, 0)],
    ids=["one-step", "memory-bound", "compute-then-memory", "long-context", "no-steps"],
)
def test_decode_steps_sum_the_steps_one_by_one(
    profile: PerfProfile, batch: int, context: int, steps: int
) -> None:
    one_by_one = sum(profile.step_ms([], batch, context + batch * i) for i in range(steps))
    assert profile.decode_steps_ms(batch, context, steps) == pytest.approx(one_by_one, rel=1e-12)
