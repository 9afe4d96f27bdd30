"""Engines the autoscaler's local driver runs for the stack are found through its record
(services.common.local.recorded): ``status`` lists them and ``down`` stops them, also when the
autoscaler that started them was SIGKILLed and nothing else knows them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.local.procs import ProcRef, is_alive, stop_processes
from services.common.local.recorded import (
    RECORD_FILE,
    RecordedEngine,
    read_recorded,
    stop_recorded,
    write_recorded,
)
from services.common.local.state import ProcEntry, StackState, read_state, write_state
from services.stack.control import collect_engine_status, stack_down
from services.stack.health import Health

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    refs = [ProcRef.of(str(p.pid), p.pid) for p in started if p.poll() is None]
    stop_processes(refs, 1.0)


def _engine(p: subprocess.Popen[bytes], iid: str = "default-engine-1") -> RecordedEngine:
    ref = ProcRef.of(iid, p.pid)
    return RecordedEngine(
        iid, "default", "engine", "worker", "http://127.0.0.1:30001", p.pid, ref.create_time
    )


def test_down_stops_the_recorded_engines_of_a_killed_autoscaler(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    # the engine outlived its autoscaler; the stand-in `up` exits on SIGTERM knowing nothing
    # of it (it was never up's child)
    engine = subprocess.Popen(SLEEP)
    up = subprocess.Popen(SLEEP)
    procs.extend([engine, up])
    engine_dir = tmp_path / "engines"
    write_recorded(engine_dir, 999_999, [_engine(engine)])
    up_ref = ProcRef.of("up", up.pid)
    write_state(
        tmp_path,
        StackState(
            up=ProcEntry("up", up.pid, up_ref.create_time, kind="up"),
            state_dir=str(tmp_path),
            phase="running",
            engine_dir=str(engine_dir),
        ),
    )
    result = stack_down(
        tmp_path,
        up_timeout_s=0.5,
        stop_timeout_s=5.0,
        sleep=lambda s: (up.poll(), engine.poll(), time.sleep(s)) and None,
    )
    assert result.was_running and result.still_alive == ()
    assert "default-engine-1" in result.orphans
    assert engine.wait(5) is not None
    assert read_state(tmp_path) is None
    assert not (engine_dir / RECORD_FILE).exists()


def test_status_lists_the_recorded_engines(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    engine = subprocess.Popen(SLEEP)
    procs.append(engine)
    write_recorded(tmp_path, 1, [_engine(engine)])
    state = StackState(
        up=ProcEntry("up", 1, None, kind="up"), state_dir=str(tmp_path), engine_dir=str(tmp_path)
    )
    probed: list[str] = []

    def probe(url: str, timeout_s: float) -> Health:
        probed.append(url)
        return Health.SERVING

    (status,) = collect_engine_status(state, probe)
    assert (status.name, status.role, status.url, status.pid, status.alive, status.health) == (
        "default-engine-1",
        "aggregated",  # the stack's word for a worker
        "http://127.0.0.1:30001",
        engine.pid,
        True,
        "SERVING",
    )
    assert probed == ["http://127.0.0.1:30001/health"]


def test_stop_recorded_spares_a_recycled_pid(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """A recorded pid whose start time differs is another process now: never signalled."""
    other = subprocess.Popen(SLEEP)
    procs.append(other)
    stale = RecordedEngine("x-1", "x", "w", "worker", "http://h:1", other.pid, 1.0)
    write_recorded(tmp_path, 1, [stale])
    assert stop_recorded(tmp_path, 1.0) == ([], [])
    assert is_alive(ProcRef.of("other", other.pid))
    assert read_recorded(tmp_path) == []


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not JSON"),
        ('{"version": 7, "engines": []}', "not an engine record of version 1"),
        ('{"version": 1, "engines": [{"pid": 1}]}', "malformed engine entry"),
    ],
    ids=["not-json", "other-version", "missing-fields"],
)
def test_an_unreadable_record_is_refused(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / RECORD_FILE).write_text(content)
    with pytest.raises(ValueError, match=needle):
        read_recorded(tmp_path)
