"""The chaos suite's profile: ``short`` (default, inside ``make test``) or ``long`` (by hand:
``pytest tests/chaos --chaos-profile long`` or ``TIDESERVE_CHAOS_PROFILE=long``)."""

from __future__ import annotations

import os

import pytest

from tests.chaos.profiles import PROFILES, Profile


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-profile",
        choices=sorted(PROFILES),
        default=None,
        help="chaos suite profile (default: $TIDESERVE_CHAOS_PROFILE or short)",
    )


def _profile(config: pytest.Config) -> Profile:
    # the option exists only when this conftest was loaded at start-up (pytest tests/chaos)
    name = config.getoption("--chaos-profile", default=None)
    name = name or os.environ.get("TIDESERVE_CHAOS_PROFILE") or "short"
    if name not in PROFILES:
        raise pytest.UsageError(f"unknown chaos profile {name!r}; known: {sorted(PROFILES)}")
    return PROFILES[name]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The profile's time limit on the chaos tests (instead of the suite's 300 s): every
    wait inside is bounded too, this only stops a run that outgrew its profile."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.timeout(_profile(config).timeout_s))


@pytest.fixture
def chaos_profile(request: pytest.FixtureRequest) -> Profile:
    return _profile(request.config)
