"""The generated protobuf code and the migrations import from a built wheel, not only in-tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        cwd=build,
        capture_output=True,
    )
    (whl,) = out.glob("tideserve-*.whl")
    return whl


def test_wheel_ships_protos_generated_code_and_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for stem in ("common", "events", "scheduler", "kvmeta", "autoscaler", "telemetry"):
        assert f"tideserve/v1/{stem}.proto" in names
        assert f"tideserve/v1/{stem}_pb2.py" in names
        assert f"tideserve/v1/{stem}_pb2.pyi" in names
    assert "services/common/tokens/__init__.py" in names
    assert "services/common/streams/follower.py" in names
    for svc in ("scheduler", "autoscaler", "kvmeta", "telemetry"):
        assert any(n.startswith(f"services/{svc}/migrations/") for n in names), svc


def test_generated_modules_import_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from tideserve.v1 import scheduler_pb2, scheduler_pb2_grpc, kvmeta_pb2_grpc, events_pb2;"
        "import tideserve.v1, services.common.tokens as t;"
        "assert tideserve.v1.__file__.startswith(sys.argv[1]), tideserve.v1.__file__;"
        "assert t.__file__.startswith(sys.argv[1]), t.__file__;"
        "r = scheduler_pb2.PickResponse(decode=scheduler_pb2.PickedEndpoint());"
        "print(scheduler_pb2_grpc.SchedulerServiceStub.__name__, events_pb2.KVEventBatch.DESCRIPTOR.full_name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.split() == ["SchedulerServiceStub", "tideserve.v1.KVEventBatch"]
