"""Predicted tool time: per (agent, tool) and per tool distributions, confidence, fallbacks,
bounded memory."""

from __future__ import annotations

import pytest

from services.common.sessions import GapEstimate, ToolTimePredictor
from services.common.sessions.tooltime import GapSketch, nearest_rank

Obs = tuple[tuple[str, ...], str, float]


def fed(obs: list[Obs], **kw: int | float) -> ToolTimePredictor:
    p = ToolTimePredictor(min_samples=3, session_min_samples=2, default_gap_s=30.0, **kw)  # type: ignore[arg-type]
    for tools, agent, gap in obs:
        p.observe(tools, agent, gap)
    return p


def many(tools: tuple[str, ...], agent: str, gaps: list[float]) -> list[Obs]:
    return [(tools, agent, g) for g in gaps]


BASH_A = many(("bash",), "claude", [10.0, 10.0, 10.0, 10.0])
BASH_B = many(("bash",), "codex", [100.0, 100.0, 100.0])
READ_A = many(("read",), "claude", [1.0, 1.0, 1.0])


@pytest.mark.parametrize(
    ("obs", "tools", "agent", "session", "source", "seconds", "samples"),
    [
        (BASH_A, ("bash",), "claude", (), "agent_tool", 10.0, 4),
        (BASH_A + BASH_B, ("bash",), "codex", (), "agent_tool", 100.0, 3),
        # an agent never seen with the tool: the tool's distribution across agents (p50)
        (BASH_A + BASH_B, ("bash",), "opencode", (), "tool", 10.0, 7),
        # parallel tool calls wait for the slowest tool; confidence is the fewest samples
        (BASH_A + READ_A, ("bash", "read"), "claude", (), "agent_tool", 10.0, 3),
        # one tool unknown: no tool level answers; the session's own history does
        (BASH_A, ("bash", "grep"), "claude", (5.0, 7.0, 9.0), "session", 7.0, 3),
        # too little own history: every gap the predictor saw
        (BASH_A, ("grep",), "claude", (5.0,), "global", 10.0, 4),
        (many(("x",), "a", [1.0, 2.0]), ("grep",), "a", (), "default", 30.0, 0),
        # a turn that ended in an answer is the tool NO_TOOL
        (many((), "claude", [60.0] * 3), (), "claude", (), "agent_tool", 60.0, 3),
    ],
    ids=[
        "agent-tool",
        "per-agent-differs",
        "tool-across-agents",
        "slowest-of-parallel-tools",
        "session-history",
        "global",
        "default",
        "answer-is-no-tool",
    ],
)
def test_predict_fallbacks(
    obs: list[Obs],
    tools: tuple[str, ...],
    agent: str,
    session: tuple[float, ...],
    source: str,
    seconds: float,
    samples: int,
) -> None:
    est = fed(obs).predict(tools, agent, 0.5, session)
    assert est.source == source
    assert est.samples == samples
    assert est.seconds == pytest.approx(seconds, rel=0.03)


@pytest.mark.parametrize(
    ("q", "expect"),
    [(0.1, 1.0), (0.5, 5.0), (0.9, 9.0), (1.0, 10.0)],
    ids=["p10", "p50", "p90", "p100"],
)
def test_percentile_of_a_tool(q: float, expect: float) -> None:
    p = fed(many(("bash",), "a", [float(i) for i in range(1, 11)]))
    assert p.predict(("bash",), "a", q) == GapEstimate(
        pytest.approx(expect, rel=0.03), 10, "agent_tool"
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "gap", [-1.0, float("nan"), float("inf")], ids=["negative", "nan", "infinite"]
)
def test_bad_gaps_are_not_samples(gap: float) -> None:
    p = fed(many(("bash",), "a", [gap] * 5))
    assert p.predict(("bash",), "a", 0.5).source == "default"
    assert len(p) == 0


@pytest.mark.parametrize("q", [0.0, -0.5, 1.5], ids=["zero", "negative", "above-one"])
def test_percentile_out_of_range_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="percentile"):
        ToolTimePredictor().predict(("bash",), "a", q)


def test_distributions_are_bounded_and_the_global_one_stays() -> None:
    p = ToolTimePredictor(min_samples=1, max_keys=5)
    for i in range(20):
        p.observe((f"tool{i}",), "", 1.0)
    assert len(p) == 5
    assert p.predict(("tool19",), "", 0.5).source == "tool"
    assert p.predict(("tool0",), "", 0.5).source == "global"
    assert p.predict(("tool0",), "", 0.5).samples == 20


def test_rotation_forgets_old_generations() -> None:
    sk = GapSketch(0.02, 128, rotate_after=4)
    for g in [1.0] * 4 + [50.0] * 4 + [100.0] * 4:
        sk.add(g)
    assert sk.count == 8  # two generations of four
    assert sk.quantile(0.0) == pytest.approx(50.0, rel=0.03)


@pytest.mark.parametrize(
    ("values", "q", "expect"),
    [([3.0], 0.9, 3.0), ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0), ([4.0, 1.0, 3.0, 2.0], 0.75, 3.0)],
    ids=["single", "median", "unsorted"],
)
def test_nearest_rank(values: list[float], q: float, expect: float) -> None:
    assert nearest_rank(values, q) == expect
