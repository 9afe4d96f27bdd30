"""Priors of the tool-time predictor: distributions learned elsewhere (telemetry's) answer
where the predictor's own are not yet confident; its own confident data wins."""

from __future__ import annotations

import pytest

from services.common.sessions import ALL_TOOLS, GapQuantiles, PriorGrid, ToolTimePredictor

GRID = (0.5, 0.9, 0.99)
MIN = 3


def predictor(
    priors: list[GapQuantiles], own: list[tuple[tuple[str, ...], str, float]]
) -> ToolTimePredictor:
    p = ToolTimePredictor(min_samples=MIN, session_min_samples=2, default_gap_s=30.0)
    p.set_priors(GRID, priors)
    for tools, agent, gap in own:
        p.observe(tools, agent, gap)
    return p


def row(tool: str, samples: int, seconds: tuple[float, ...], agent: str = "") -> GapQuantiles:
    return GapQuantiles(agent, tool, samples, seconds)


BASH = row("bash", 50, (10.0, 20.0, 40.0))
READ = row("read", 50, (1.0, 2.0, 4.0))
EVERY = row(ALL_TOOLS, 100, (5.0, 15.0, 30.0))


@pytest.mark.parametrize(
    ("priors", "own", "tools", "session", "source", "seconds", "samples"),
    [
        ([BASH], [], ("bash",), (), "prior_tool", 10.0, 50),
        # the agent's own distribution is not confident: the tool's prior across agents
        ([BASH], [(("bash",), "claude", 99.0)] * 2, ("bash",), (), "prior_tool", 10.0, 50),
        # own confident data wins over the prior at the same level
        ([BASH], [(("bash",), "", 3.0)] * MIN, ("bash",), (), "tool", 3.0, MIN),
        # ... and at a higher level (the agent's own)
        ([BASH], [(("bash",), "claude", 3.0)] * MIN, ("bash",), (), "agent_tool", 3.0, MIN),
        # a prior with too few samples is not confident either
        ([row("bash", MIN - 1, (10.0, 20.0, 40.0))], [], ("bash",), (), "default", 30.0, 0),
        # parallel tools: the slowest, the fewest samples; one from a prior makes it a prior
        ([BASH, READ], [], ("bash", "read"), (), "prior_tool", 10.0, 50),
        (
            [BASH],
            [(("read",), "", 1.0)] * MIN,
            ("bash", "read"),
            (),
            "prior_tool",
            10.0,
            MIN,
        ),
        # a tool neither own nor prior knows: session history, then the global prior
        ([BASH, EVERY], [], ("grep",), (7.0, 9.0), "session", 7.0, 2),
        ([BASH, EVERY], [], ("grep",), (), "prior_global", 5.0, 100),
        # the own global distribution wins over the global prior
        ([EVERY], [(("x",), "", 2.0)] * MIN, ("grep",), (), "global", 2.0, MIN),
        # an agent's prior (agent-level rows are accepted, though telemetry has none)
        (
            [row("bash", 50, (8.0, 9.0, 10.0), "claude"), BASH],
            [],
            ("bash",),
            (),
            "prior_agent_tool",
            8.0,
            50,
        ),
    ],
    ids=[
        "prior-tool",
        "agent-not-confident",
        "own-tool-wins",
        "own-agent-wins",
        "prior-too-few",
        "parallel-priors",
        "parallel-own-and-prior",
        "session-before-global-prior",
        "global-prior",
        "own-global-wins",
        "agent-prior",
    ],
)
def test_prior_levels(
    priors: list[GapQuantiles],
    own: list[tuple[tuple[str, ...], str, float]],
    tools: tuple[str, ...],
    session: tuple[float, ...],
    source: str,
    seconds: float,
    samples: int,
) -> None:
    est = predictor(priors, own).predict(tools, "claude", 0.5, session)
    assert (est.source, est.samples) == (source, samples)
    assert est.seconds == pytest.approx(seconds, rel=0.03)


@pytest.mark.parametrize(
    ("q", "expect"),
    [(0.1, 10.0), (0.5, 10.0), (0.7, 15.0), (0.9, 20.0), (0.945, 30.0), (0.99, 40.0), (1.0, 40.0)],
    ids=["below-grid", "first", "between", "point", "between-upper", "last", "above-grid"],
)
def test_prior_percentile_interpolates_and_clamps(q: float, expect: float) -> None:
    assert PriorGrid.of(GRID, 50, (10.0, 20.0, 40.0)).at(q) == pytest.approx(expect)


@pytest.mark.parametrize(
    ("qs", "seconds", "expect"),
    [
        ((0.5, 0.9), (5.0, 3.0), (5.0, 5.0)),  # a non-monotone grid is made monotone
        ((0.5, 0.9), (-1.0, 2.0), (0.0, 2.0)),  # negative seconds are 0
    ],
    ids=["running-max", "non-negative"],
)
def test_prior_grid_is_normalised(
    qs: tuple[float, ...], seconds: tuple[float, ...], expect: tuple[float, ...]
) -> None:
    assert PriorGrid.of(qs, 10, seconds).seconds == expect


@pytest.mark.parametrize(
    ("qs", "seconds"),
    [
        ((), ()),
        ((0.9, 0.5), (1.0, 2.0)),
        ((0.5, 0.5), (1.0, 2.0)),
        ((0.0, 0.5), (1.0, 2.0)),
        ((0.5, 0.9), (1.0,)),
        ((0.5, 0.9), (1.0, float("nan"))),
    ],
    ids=["empty", "decreasing", "repeated", "zero", "length", "nan"],
)
def test_bad_priors_are_refused_and_keep_the_old(
    qs: tuple[float, ...], seconds: tuple[float, ...]
) -> None:
    p = predictor([BASH], [])
    with pytest.raises(ValueError, match="prior"):
        p.set_priors(qs, [row("bash", 50, seconds)])
    assert p.priors == 1
    assert p.predict(("bash",), "", 0.5).source == "prior_tool"


def test_new_priors_replace_the_old() -> None:
    p = predictor([BASH, READ], [])
    p.set_priors(GRID, [row("read", 50, (2.0, 3.0, 4.0))])
    assert p.priors == 1
    assert p.predict(("bash",), "", 0.5).source == "default"
    assert p.predict(("read",), "", 0.5).seconds == pytest.approx(2.0)
    assert len(p) == 0  # priors are not sketches
