"""The real Mooncake Transfer Engine in tests: why it is unavailable (for a skip that says
so), and kvmeta's metadata endpoint in a child process.

The endpoint cannot be served in the test's own process: ``TransferEngine.initialize`` holds
the GIL while it PUTs its segment to the metadata server, so an in-process server never
answers (curl times out after 3 s).

"""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import cache
from typing import Any

import pytest

from tests.helpers.ports import free_port

__all__ = ["FakeNative", "metadata_process", "metadata_url_or_skip", "transfer_engine_unavailable"]


@cache
def transfer_engine_unavailable() -> str | None:
    """None when ``mooncake.engine`` loads in a fresh interpreter, else the exact reason
    (the data plane's own message, naming the package and the system libraries)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from services.common.dataplane.transfer import load_transfer_engine as l; l()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["(no output)"])[-1]


@contextlib.contextmanager
def metadata_process(start_timeout_s: float = 60.0) -> Iterator[str]:
    """kvmeta's metadata endpoint in a child process on a free port; yields its URL once it
    answers (404 for an unknown key)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.kvmeta.metadata_http", "--port", str(port)]
    )
    url = f"http://127.0.0.1:{port}/metadata"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(url + "?key=probe", timeout=2)
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"metadata server did not start (exit {proc.poll()})")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def metadata_url_or_skip() -> Iterator[str]:
    """For a module fixture (``yield from``): kvmeta's metadata endpoint in a child process;
    skips, saying why, when the Transfer Engine cannot load."""
    reason = transfer_engine_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with metadata_process() as url:
        yield url


class FakeNative:
    """The Transfer Engine's Python surface: copies between addresses in this process;
    ``gate`` (when set) blocks every batch until it is set; ``rc`` is what batches return."""

    gate: threading.Event | None = None
    rc = 0
    init_rc = 0

    def initialize(self, host: str, url: str, protocol: str, device: str) -> int:
        return self.init_rc

    def register_memory(self, addr: int, size: int) -> int:
        return 0

    def unregister_memory(self, addr: int) -> int:
        return 0

    def batch_transfer_sync_read(self, peer: str, local: Any, remote: Any, lengths: Any) -> int:
        if self.gate is not None:
            self.gate.wait(10)
        if self.rc == 0:
            for lo, ro, n in zip(local, remote, lengths, strict=True):
                ctypes.memmove(lo, ro, n)
        return self.rc

    batch_transfer_sync_write = batch_transfer_sync_read
