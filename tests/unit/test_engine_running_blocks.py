"""``tideserve engine --kv-running-blocks``: an engine whose cache is larger than the KV its
running requests may hold (the warm reference of benchmarks/agent_memory_live.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.engine import cli
from services.engine.server import EngineServer
from services.engine.settings import EngineSettings


def settings(tmp_path: Path, *argv: str) -> EngineSettings:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    cli.register(sub)
    args = p.parse_args(["engine", "--profile", "test", "--state-dir", str(tmp_path), *argv])
    return cli.settings_from_args(args)


@pytest.mark.parametrize(
    ("argv", "capacity", "running"),
    [
        (["--kv-blocks", "640"], 640, 640),
        (["--kv-blocks", "640", "--kv-running-blocks", "64"], 640, 64),
        (["--kv-blocks", "64", "--kv-running-blocks", "64"], 64, 64),
    ],
    ids=["all-of-it", "cache-beyond-running", "equal"],
)
def test_running_blocks_bound_what_requests_hold(
    tmp_path: Path, argv: list[str], capacity: int, running: int
) -> None:
    cache = EngineServer(settings(tmp_path, *argv)).core.cache
    assert (cache.capacity_blocks, cache.running_blocks) == (capacity, running)


def test_more_running_than_capacity_is_refused(tmp_path: Path) -> None:
    s = settings(tmp_path, "--kv-blocks", "64", "--kv-running-blocks", "65")
    with pytest.raises(ValueError, match="running_blocks"):
        EngineServer(s)
