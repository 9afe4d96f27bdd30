"""session-load (a new session's first turn goes where recent routed prompt tokens are
fewest) and load-guard's keep_cached_tokens (a hot instance holding the session's KV stays)."""

from __future__ import annotations

import math

import pytest

from services.common.routing.types import Choice, Pick
from tests.unit._routing_helpers import ctx, ep, make, req

FLEET = [ep("a"), ep("b"), ep("c")]


def _pick(iid: str) -> Pick:
    return Pick(decode=Choice(ep(iid), 1.0), prefill=None, profile="p")


def _routed(plugin: object, history: list[tuple[float, str, int]]) -> None:
    for now, iid, tokens in history:
        plugin.on_pick(now, req(prompt_tokens=tokens), _pick(iid))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("history", "cached", "prompt", "params", "want"),
    [
        pytest.param([], {}, 40_000, {}, {}, id="nothing-routed-yet-scores-nothing"),
        pytest.param(
            [(0.0, "a", 80_000), (0.0, "b", 40_000)],
            {},
            40_000,
            {},
            {"a": 0.0, "b": 0.5, "c": 1.0},
            id="new-session-prefers-least-committed",
        ),
        pytest.param(
            [(0.0, "a", 80_000), (0.0, "b", 40_000)],
            {"a": 30_000},
            40_000,
            {},
            {},
            id="continuing-session-scores-nothing",
        ),
        pytest.param(
            [(0.0, "a", 80_000), (0.0, "b", 40_000)],
            {"a": 10_000},
            40_000,
            {},
            {"a": 0.0, "b": 0.5, "c": 1.0},
            id="small-prefix-is-still-new",
        ),
        pytest.param(
            [(0.0, "a", 80_000)],
            {},
            8_000,
            {"min_prompt_tokens": 32_768},
            {},
            id="short-first-turn-left-to-the-queue",
        ),
    ],
)
def test_session_load_scores(
    history: list[tuple[float, str, int]],
    cached: dict[str, int],
    prompt: int,
    params: dict[str, float],
    want: dict[str, float],
) -> None:
    p = make("session-load", **params)
    _routed(p, history)
    c = ctx(now=0.0)
    c.cached_tokens.update(cached)
    got = p.score(c, req(prompt_tokens=prompt), FLEET)
    assert got == pytest.approx(want)


def test_session_load_decays_with_half_life() -> None:
    p = make("session-load", half_life_s=30.0)
    _routed(p, [(0.0, "a", 64_000)])
    assert p.committed("a", 30.0) == pytest.approx(32_000)
    assert p.committed("a", 90.0) == pytest.approx(8_000)
    # an older, larger commitment decays below a fresh smaller one
    _routed(p, [(90.0, "b", 10_000)])
    got = p.score(ctx(now=90.0), req(prompt_tokens=50_000), FLEET)
    assert got["a"] > 0 and math.isclose(got["b"], 0.0) and got["c"] == 1.0


HOT = [ep("w0", waiting=40), ep("w1", waiting=1), ep("w2", waiting=2)]


@pytest.mark.parametrize(
    ("keep", "cached_w0", "want"),
    [
        pytest.param(0, 100_000, ["w1", "w2"], id="off-removes-the-hot-instance"),
        pytest.param(16_384, 4_096, ["w1", "w2"], id="short-prefix-still-spills"),
        pytest.param(16_384, 80_000, ["w0", "w1", "w2"], id="long-session-kv-keeps-it"),
    ],
)
def test_guard_keeps_instances_holding_long_prefixes(
    keep: int, cached_w0: int, want: list[str]
) -> None:
    g = make("load-guard", abs_threshold=16, rel_threshold=1.5, keep_cached_tokens=keep)
    c = ctx()
    c.cached_tokens["w0"] = cached_w0
    kept = g.filter(c, req(prompt_tokens=100_000), HOT)
    assert [e.instance_id for e in kept] == want
