"""A real Mooncake Transfer Engine uses kvmeta as its HTTP metadata server.

The kvmeta service runs as a process (``python -m services.kvmeta``, no Postgres or Redis: the
metadata store is in memory) with its Mooncake metadata endpoint on a free port. Two peer
processes (``te_peer.py``) each start a ``mooncake.engine.TransferEngine`` from the PyPI wheel
``mooncake-transfer-engine-non-cuda`` on the TCP transport with
``http://127.0.0.1:<port>/metadata`` as metadata server, so they find each other only through
kvmeta. The test moves bytes between them with ``transfer_sync_read``/``transfer_sync_write``
and checks every byte, checks what the engines wrote into kvmeta, and that they delete it on
shutdown.

Protocol used by the engine (observed, v0.3.13.post1): ``PUT mooncake/rpc_meta/<segment>``
(``{"ip_or_host_name", "rpc_port"}``), ``GET`` then ``PUT mooncake/ram/<segment>`` (segment
descriptor: ``name``, ``protocol``, ``tcp_data_host``, ``tcp_data_port``, ``buffers``), ``GET
mooncake/ram/<peer>`` before the first transfer to a peer (404 = unknown segment), ``DELETE``
of both keys when the engine is destroyed. Only status 200 counts as success.

Skips only when the wheel is not installed or cannot load its system libraries
(libibverbs1, libnuma1: ``scripts/ensure_system_deps.sh`` installs them as root).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import random
import select
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PEER_SCRIPT = Path(__file__).with_name("te_peer.py")
START_TIMEOUT_S = 90.0  # kvmeta imports grpc/SQLAlchemy/OTel: slow on 2 shared cores
REPLY_TIMEOUT_S = 60.0
TARGET_BYTES = 4 << 20
BIG = (3 << 20) + 4321  # several TCP slices, not a multiple of anything


def _transfer_engine_unavailable() -> str | None:
    """None when ``mooncake.engine`` imports in a fresh interpreter, else the exact reason."""
    if importlib.util.find_spec("mooncake") is None:
        return (
            "the Mooncake Transfer Engine wheel is not installed "
            "(pip install 'mooncake-transfer-engine-non-cuda>=0.3.13', extra tideserve[transfer]; "
            "Linux x86_64/aarch64, CPython 3.10-3.13 only)"
        )
    probe = subprocess.run(
        [sys.executable, "-c", "import mooncake.engine"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
    return (
        f"mooncake.engine cannot load its system libraries: {last} "
        "(install libibverbs1 and libnuma1: run scripts/ensure_system_deps.sh as root, "
        "or sudo apt-get install -y libibverbs1 libnuma1)"
    )


@pytest.fixture(scope="module")
def te_available() -> None:
    reason = _transfer_engine_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _key_url(metadata_url: str, key: str) -> str:
    return f"{metadata_url}?key={urllib.parse.quote(key, safe='')}"


def _get(metadata_url: str, key: str) -> tuple[int, bytes]:
    """(status, body) of ``GET /metadata?key=...``."""
    try:
        with urllib.request.urlopen(_key_url(metadata_url, key), timeout=10) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read())


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="module")
def metadata_url(te_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """kvmeta as a process; yields its Mooncake metadata URL ``http://127.0.0.1:<port>/metadata``."""
    workdir = tmp_path_factory.mktemp("kvmeta")  # no ./tideserve.yaml is picked up here
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESERVE_")}
    env.update(
        TIDESERVE_GRPC_PORT="0",
        TIDESERVE_METRICS_PORT="0",
        TIDESERVE_METADATA_HTTP_PORT=str(port),
        TIDESERVE_LOG_FORMAT="text",
    )
    log = workdir / "kvmeta.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.kvmeta"],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/metadata"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"kvmeta exited with {proc.returncode}:\n{_tail(log)}")
            with contextlib.suppress(OSError):
                if _get(url, "tideserve/probe")[0] == 404:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"kvmeta metadata HTTP did not answer on {port}:\n{_tail(log)}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Peer:
    """One te_peer.py process and what it reported at start."""

    proc: subprocess.Popen[bytes]
    log: Path
    segment: str
    addr: int
    size: int
    rpc_port: int

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return _read_reply(self.proc, self.log)

    def fill(self, offset: int, data: bytes) -> None:
        assert self.call(op="fill", offset=offset, data=base64.b64encode(data).decode())["ok"]

    def dump(self, offset: int, length: int) -> bytes:
        reply = self.call(op="dump", offset=offset, length=length)
        assert reply["ok"], reply
        return base64.b64decode(reply["data"])

    def quit(self) -> int:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.close()
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def _read_reply(proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], REPLY_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    if not line:
        state = "no reply" if proc.poll() is None else f"exited with {proc.returncode}"
        pytest.fail(f"te_peer {state}; its log:\n{_tail(log)}")
    reply: dict[str, Any] = json.loads(line)
    return reply


def start_peer(metadata_url: str, logdir: Path, size: int) -> Peer:
    """Start a peer named ``127.0.0.1:<free port>`` with a registered buffer of ``size`` bytes."""
    segment = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")  # RPC and data sockets on loopback
    log = logdir / f"te_peer_{segment.replace(':', '_')}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(PEER_SCRIPT), segment, metadata_url, str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
        )
    hello = _read_reply(proc, log)
    if not hello["ok"]:
        proc.wait(timeout=30)
        pytest.fail(f"te_peer failed to start: {hello['error']}\n{_tail(log)}")
    return Peer(proc, log, hello["segment"], hello["addr"], hello["size"], hello["rpc_port"])


@pytest.fixture(scope="module")
def peers(
    metadata_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Peer, Peer]]:
    """(target with a 4 MiB buffer, initiator with a 4 MiB buffer), both on kvmeta."""
    logdir = tmp_path_factory.mktemp("te_peers")
    target = start_peer(metadata_url, logdir, TARGET_BYTES)
    try:
        initiator = start_peer(metadata_url, logdir, TARGET_BYTES)
        try:
            yield target, initiator
        finally:
            initiator.quit()
    finally:
        target.quit()


def test_engines_register_in_kvmeta(metadata_url: str, peers: tuple[Peer, Peer]) -> None:
    for peer in peers:
        status, body = _get(metadata_url, f"mooncake/rpc_meta/{peer.segment}")
        assert status == 200, body
        rpc = json.loads(body)
        assert (rpc["ip_or_host_name"], rpc["rpc_port"]) == ("127.0.0.1", peer.rpc_port)

        status, body = _get(metadata_url, f"mooncake/ram/{peer.segment}")
        assert status == 200, body
        desc = json.loads(body)
        assert (desc["name"], desc["protocol"], desc["tcp_data_host"]) == (
            peer.segment,
            "tcp",
            "127.0.0.1",
        )
        assert [(b["addr"], b["length"]) for b in desc["buffers"]] == [(peer.addr, peer.size)]


TRANSFERS = [
    # (op, length, initiator offset, target offset)
    ("read", 1, 0, 0),
    ("read", BIG, 999, 12345),
    ("write", 1, 0, TARGET_BYTES - 1),
    ("write", BIG, 5, 7),
]


@pytest.mark.parametrize(
    ("op", "length", "local_offset", "remote_offset"),
    TRANSFERS,
    ids=["read-1-byte", "read-3MiB-unaligned", "write-last-byte", "write-3MiB-unaligned"],
)
def test_transfer_moves_exact_bytes(
    peers: tuple[Peer, Peer], op: str, length: int, local_offset: int, remote_offset: int
) -> None:
    target, initiator = peers
    rng = random.Random(f"{op}-{length}")
    payload = rng.randbytes(length)
    # known, different bytes on both sides, so a no-op or a shifted copy cannot pass
    target.fill(0, rng.randbytes(TARGET_BYTES))
    initiator.fill(0, rng.randbytes(TARGET_BYTES))
    source, sink = (target, initiator) if op == "read" else (initiator, target)
    src_off, dst_off = (
        (remote_offset, local_offset) if op == "read" else (local_offset, remote_offset)
    )
    source.fill(src_off, payload)
    sink_before = sink.dump(0, TARGET_BYTES)

    reply = initiator.call(
        op=op,
        peer=target.segment,
        peer_addr=target.addr + remote_offset,
        offset=local_offset,
        length=length,
    )
    assert reply == {"ok": True, "rc": 0}, f"{reply}\n{_tail(initiator.log)}"

    sink_after = sink.dump(0, TARGET_BYTES)
    assert sink_after[dst_off : dst_off + length] == payload
    # nothing outside the destination range changed
    assert sink_after[:dst_off] == sink_before[:dst_off]
    assert sink_after[dst_off + length :] == sink_before[dst_off + length :]


def test_transfer_to_segment_unknown_to_kvmeta_fails_cleanly(
    metadata_url: str, peers: tuple[Peer, Peer]
) -> None:
    _, initiator = peers
    ghost = f"127.0.0.1:{free_port()}"
    assert _get(metadata_url, f"mooncake/ram/{ghost}")[0] == 404
    reply = initiator.call(op="read", peer=ghost, peer_addr=4096, offset=0, length=16)
    assert reply["ok"] is False and reply["rc"] != 0
    assert initiator.proc.poll() is None  # the engine is still alive and usable
    assert initiator.call(op="dump", offset=0, length=1)["ok"]


def test_engine_shutdown_deletes_its_keys(metadata_url: str, tmp_path: Path) -> None:
    peer = start_peer(metadata_url, tmp_path, 4096)
    keys = [f"mooncake/rpc_meta/{peer.segment}", f"mooncake/ram/{peer.segment}"]
    assert [_get(metadata_url, k)[0] for k in keys] == [200, 200]
    assert peer.quit() == 0, _tail(peer.log)
    assert [_get(metadata_url, k)[0] for k in keys] == [404, 404]


def test_second_engine_cannot_claim_a_live_segment_name(metadata_url: str, tmp_path: Path) -> None:
    first = start_peer(metadata_url, tmp_path, 4096)
    try:
        env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
        second = subprocess.run(
            [sys.executable, str(PEER_SCRIPT), first.segment, metadata_url, "4096"],
            input=b'{"op": "quit"}\n',
            capture_output=True,
            env=env,
            timeout=60,
            check=False,
        )
        hello = json.loads(second.stdout.splitlines()[0])
        # kvmeta refuses the duplicate rpc_meta PUT with 400, as mooncake_master does, so the
        # second engine's initialize() fails. (Its teardown then DELETEs the shared name's
        # keys; mooncake_master's own metadata server ends in the same state.)
        assert hello == {"ok": False, "error": "TransferEngine.initialize returned -1"}
    finally:
        first.quit()
