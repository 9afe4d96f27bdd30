"""What ``tideserve up`` prints once the stack serves (services.stack.announce, pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.local.state import ProcEntry, StackState
from services.stack.announce import NO_ENGINE, announcement
from services.stack.up import UpOptions

UP = ProcEntry("up", 1, None, "up")
KVMETA = ProcEntry(
    "kvmeta", 11, None, "service", grpc_address="127.0.0.1:50052",
    endpoints={"metrics": "http://127.0.0.1:9102/metrics"},
)  # fmt: skip
GATEWAY = ProcEntry(
    "scheduler", 12, None, "service", grpc_address="127.0.0.1:50051",
    endpoints={"gateway": "http://127.0.0.1:8000/v1"},
)  # fmt: skip
REDIS = ProcEntry("redis", 13, None, "redis", url="redis://default:secret@127.0.0.1:6380/0")
ENGINE = ProcEntry("engine-1", 21, None, "engine", url="http://127.0.0.1:30001", role="decode")

CASES = [
    # processes, options, lines that must appear, text that must not
    (
        [KVMETA, GATEWAY, REDIS],
        {},
        [
            "  kvmeta      gRPC 127.0.0.1:50052  metrics http://127.0.0.1:9102/metrics  (pid 11)",
            "  engine-1    decode engine http://127.0.0.1:30001  (pid 21)",
            "gateway (OpenAI API): http://127.0.0.1:8000/v1",
            "logs: /s/logs",
        ],
        ["secret", "external"],
    ),
    (
        [GATEWAY],
        {"postgres_url": "postgresql://u:pw@db/ts", "redis_url": "redis://r:6379/0"},
        ["  postgres    external postgresql://u:***@db/ts", "  redis       external redis://r/0"],
        ["pw@"],
    ),
]


@pytest.mark.parametrize(
    ("processes", "opts", "present", "absent"), CASES, ids=["embedded", "external-stores"]
)
def test_announcement(
    processes: list[ProcEntry], opts: dict[str, str], present: list[str], absent: list[str]
) -> None:
    state = StackState(up=UP, state_dir="/s", processes=list(processes), gateway_url=None)
    state.gateway_url = next(
        (p.endpoints["gateway"] for p in processes if "gateway" in p.endpoints), None
    )
    state.postgres_url = "postgresql://u:***@db/ts" if "postgres_url" in opts else None
    state.redis_url = "redis://r/0" if "redis_url" in opts else None
    text = announcement(state, [ENGINE], UpOptions(state_dir=Path("/s"), **opts))  # type: ignore[arg-type]
    lines = text.splitlines()
    assert NO_ENGINE not in lines
    assert lines[0] == "tideserve stack is up (state dir /s)"
    assert lines[-1] == "Ctrl-C or `tideserve down` stops everything."
    for line in present:
        assert line in lines
    for bad in absent:
        assert bad not in text


@pytest.mark.parametrize(
    ("processes", "engines", "noted"),
    [
        ([GATEWAY], [], True),
        ([GATEWAY], [ENGINE], False),
        ([GATEWAY, ENGINE], [], False),
        ([KVMETA], [], False),  # no gateway announced: nothing to say about its engines
    ],
    ids=["no-engine", "autoscaled-engine", "engine-process", "no-gateway"],
)
def test_announcement_says_when_no_engine_was_started(
    processes: list[ProcEntry], engines: list[ProcEntry], noted: bool
) -> None:
    state = StackState(up=UP, state_dir="/s", processes=list(processes), gateway_url=None)
    state.gateway_url = next(
        (p.endpoints["gateway"] for p in processes if "gateway" in p.endpoints), None
    )
    lines = announcement(state, engines, UpOptions(state_dir=Path("/s"))).splitlines()
    assert (NO_ENGINE in lines) == noted
