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


@pytest.fixture
def chaos_profile(request: pytest.FixtureRequest) -> Profile:
    # the option exists only when this conftest was loaded at start-up (pytest tests/chaos)
    name = request.config.getoption("--chaos-profile", default=None)
    name = name or os.environ.get("TIDESERVE_CHAOS_PROFILE") or "short"
    if name not in PROFILES:
        raise pytest.UsageError(f"unknown chaos profile {name!r}; known: {sorted(PROFILES)}")
    return PROFILES[name]
