"""What gRPC security costs a call: a real kvmeta process serving ``MatchPrefix`` (a read on
the routing path; a 64-block chain ingested first through ``IngestEvents`` with an operator
token) in four modes: plaintext with no auth (today's default), token auth (the server
hashes the token and looks it up, the access decision, the list-length walk), token auth
over TLS, and over mutual TLS. One client, sequential unary calls on one channel (each mode
its own process and channel; the TLS handshake is paid once, as on a long-lived channel).

    .venv/bin/python benchmarks/grpc_security_cost.py [--calls 3000] [--out FILE]

Prints JSON: per mode p50/p99/mean latency (ms) and calls/s, and each mode's p50/p99 added
over plaintext. Needs ``cryptography`` (the test extras) for the throwaway CA.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
from _harness import ProcGroup, command_line, emit_json, free_port, machine
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.security.access import Role
from services.common.security.channels import ClientSecurity, sync_channel
from services.common.security.settings import TlsSettings
from services.common.security.tokens import format_entry, new_token
from services.stack.health import Health, check_grpc_health
from tests.helpers.certs import TestCA

BLOCKS = 64
MODES = ("plaintext", "auth", "auth+tls", "auth+mtls")


def _files(root: Path) -> dict[str, Any]:
    ca = TestCA()
    (root / "ca.crt").write_bytes(ca.pem)
    ca.issue("kvmeta").write(root / "tls.crt", root / "tls.key")
    operator, reader = new_token(), new_token()
    (root / "tokens").write_text(
        format_entry("bench-op", Role.OPERATOR, operator)
        + "\n"
        + format_entry("bench-ro", Role.READ, reader)
        + "\n"
    )
    return {"operator": operator, "reader": reader}


def _server_env(mode: str, root: Path, port: int) -> dict[str, str]:
    env = {
        "TIDESERVE_GRPC_PORT": str(port),
        "TIDESERVE_METRICS_PORT": "0",
        "TIDESERVE_KVMETA__METADATA_HTTP_PORT": "0",
        "TIDESERVE_LOG_LEVEL": "WARNING",
        "TIDESERVE_STATE_DIR": str(root / "state"),
    }
    if mode != "plaintext":
        env |= {"TIDESERVE_AUTH__ENABLED": "true", "TIDESERVE_AUTH__TOKENS_FILE": f"{root}/tokens"}
    if "tls" in mode:
        env |= {
            "TIDESERVE_TLS__ENABLED": "true",
            "TIDESERVE_TLS__CERT_FILE": f"{root}/tls.crt",
            "TIDESERVE_TLS__KEY_FILE": f"{root}/tls.key",
            "TIDESERVE_TLS__CA_FILE": f"{root}/ca.crt",
            "TIDESERVE_TLS__CLIENT_AUTH": "true" if mode == "auth+mtls" else "false",
        }
    return env


def _client(mode: str, root: Path, token: str | None) -> ClientSecurity:
    if "tls" not in mode:
        return ClientSecurity(token=token)
    cert = {"cert_file": root / "tls.crt", "key_file": root / "tls.key"} if "mtls" in mode else {}
    return ClientSecurity(TlsSettings(enabled=True, ca_file=root / "ca.crt", **cert), token)


def _chain() -> list[int]:
    return [(i * 2654435761 + 17) % (1 << 63) + 1 for i in range(BLOCKS)]


def _run_mode(mode: str, root: Path, tokens: dict[str, str], calls: int) -> dict[str, Any]:
    port = free_port()
    group = ProcGroup(root)
    group.start(
        mode,
        [sys.executable, "-m", "services.kvmeta", "--grpc-port", str(port)],
        _server_env(mode, root, port),
    )
    try:
        address = f"127.0.0.1:{port}"
        health = _client(mode, root, None)
        deadline = time.monotonic() + 60
        while check_grpc_health(address, "", 1.0, health) is not Health.SERVING:
            group.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvmeta ({mode}) not SERVING within 60s")
            time.sleep(0.1)
        auth = mode != "plaintext"
        chain = _chain()
        op = _client(mode, root, tokens["operator"] if auth else None)
        with sync_channel(address, op) as ch:
            batch = events_pb2.KVEventBatch(
                deployment="bench",
                instance_id="engine-1",
                epoch=1,
                seq=1,
                block_size=16,
                events=[events_pb2.KVEvent(kind=1, block_hashes=chain, token_count=16 * BLOCKS)],
            )
            kvmeta_pb2_grpc.KVMetaServiceStub(ch).IngestEvents(iter([batch]), timeout=10)
        ro = _client(mode, root, tokens["reader"] if auth else None)
        request = kvmeta_pb2.MatchPrefixRequest(deployment="bench", block_hashes=chain)
        lat: list[float] = []
        with sync_channel(address, ro) as ch:
            stub = kvmeta_pb2_grpc.KVMetaServiceStub(ch)
            for _ in range(200):  # warm-up (and the TLS handshake)
                stub.MatchPrefix(request, timeout=5)
            t0 = time.perf_counter()
            for _ in range(calls):
                s = time.perf_counter()
                resp = stub.MatchPrefix(request, timeout=5)
                lat.append((time.perf_counter() - s) * 1000)
            elapsed = time.perf_counter() - t0
        matched = max((m.matched_blocks for m in resp.matches), default=0)
        if matched != BLOCKS:
            raise RuntimeError(f"{mode}: MatchPrefix matched {matched} of {BLOCKS} blocks")
    except grpc.RpcError as err:
        raise RuntimeError(f"{mode}: {err}") from err
    finally:
        group.stop()
    lat.sort()
    return {
        "p50_ms": round(lat[len(lat) // 2], 4),
        "p99_ms": round(lat[int(len(lat) * 0.99)], 4),
        "mean_ms": round(statistics.fmean(lat), 4),
        "calls_per_s": round(calls / elapsed, 1),
        "matched_blocks": matched,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="measured calls per mode")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tsgsec-") as tmp:
        root = Path(tmp)
        tokens = _files(root)
        modes = {mode: _run_mode(mode, root, tokens, args.calls) for mode in MODES}
    base = modes["plaintext"]
    added = {
        mode: {
            "p50_ms": round(m["p50_ms"] - base["p50_ms"], 4),
            "p99_ms": round(m["p99_ms"] - base["p99_ms"], 4),
        }
        for mode, m in modes.items()
        if mode != "plaintext"
    }
    out = {
        "benchmark": "grpc_security_cost",
        "command": command_line(),
        "machine": machine(),
        "rpc": f"KVMetaService.MatchPrefix, {BLOCKS}-block chain, sequential, one channel",
        "calls_per_mode": args.calls,
        "modes": modes,
        "added_over_plaintext": added,
    }
    emit_json(out, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
