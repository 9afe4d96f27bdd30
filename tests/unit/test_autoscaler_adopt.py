"""Orphan engines a killed local driver left behind (services/autoscaler/drivers/adopt.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.autoscaler.drivers.adopt import AdoptedChild, Orphans
from services.common.local.procs import ProcRef
from services.common.local.recorded import RecordedEngine, read_recorded, write_recorded

ME = ProcRef.of("me", os.getpid())  # alive for the whole test


def engine(iid: str, role: str = "w", dep: str = "dep", alive: bool = True) -> RecordedEngine:
    pid, created = (ME.pid, ME.create_time) if alive else (ME.pid, 1.0)  # wrong start: gone
    return RecordedEngine(iid, dep, role, "worker", f"http://127.0.0.1:1/{iid}", pid, created)


@pytest.mark.parametrize(
    ("engines", "asks", "taken"),
    [
        ([engine("w-2"), engine("w-1")], [("dep", "w")] * 3, ["w-1", "w-2", None]),
        ([engine("w-1", alive=False), engine("w-2")], [("dep", "w")], ["w-2"]),
        ([engine("p-1", role="p"), engine("x-1", dep="other")], [("dep", "w")], [None]),
    ],
    ids=["lowest-id-first-then-none", "dead-ones-skipped", "other-roles-untouched"],
)
def test_take(
    engines: list[RecordedEngine], asks: list[tuple[str, str]], taken: list[str | None]
) -> None:
    orphans = Orphans(engines)
    got = [orphans.take(d, r) for d, r in asks]
    assert [e.instance_id if e else None for e in got] == taken


def test_drop_gives_up_a_role_or_everything() -> None:
    orphans = Orphans([engine("w-1"), engine("p-1", role="p"), engine("q-1", role="q")])
    assert [r.pid for r in orphans.drop("dep", "w")] == [ME.pid]
    assert len(orphans) == 2
    assert len(orphans.drop()) == 2 and len(orphans) == 0


def test_load_takes_the_record_over(tmp_path: Path) -> None:
    write_recorded(tmp_path, 1, [engine("w-1"), engine("w-2", alive=False)])
    orphans = Orphans.load(tmp_path)
    assert len(orphans) == 1
    assert read_recorded(tmp_path) == []  # the driver rewrites it with what it adopts


def test_unreadable_record_means_no_orphans(tmp_path: Path) -> None:
    (tmp_path / "instances.json").write_text("{not json")
    assert len(Orphans.load(tmp_path)) == 0


def test_adopted_child_is_running_until_its_process_is_gone() -> None:
    assert AdoptedChild.of(engine("w-1")).exit_code() is None
    assert AdoptedChild.of(engine("w-1", alive=False)).exit_code() == -1
