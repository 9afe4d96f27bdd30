"""``tideserve gateway --gateways N|auto``: how many processes (pure rule)."""

from __future__ import annotations

import pytest

from services.scheduler.cli import processes
from services.stack.gateways import GatewayCount


@pytest.mark.parametrize(
    ("gateways", "share", "port", "cores", "count"),
    [
        ("auto", True, 8000, 4, 4),
        ("auto", False, 8000, 4, 1),
        ("auto", True, 0, 4, 1),
        ("auto", True, 8000, 1, 1),
        (3, False, 8000, 1, 3),
        (1, False, 0, 4, 1),
    ],
    ids=[
        "auto-shared-one-per-core",
        "auto-unshared-one",
        "auto-free-port-one",
        "auto-one-core",
        "explicit",
        "one-on-a-free-port",
    ],
)
def test_processes(gateways: GatewayCount, share: bool, port: int, cores: int, count: int) -> None:
    assert processes(gateways, share_state=share, port=port, cores=cores) == count


def test_several_processes_need_a_fixed_port() -> None:
    with pytest.raises(ValueError, match="fixed --port"):
        processes(2, share_state=True, port=0, cores=4)
