"""routing_compare's closed loop: the stand-in model process (``_model_server.py``) it
starts for a run, and the fit it reads back over ``GetPerfModel``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from _harness import ProcGroup, free_port

__all__ = ["perf_model_of", "start_model_server"]


def start_model_server(group: ProcGroup, v: dict[str, Any], tag: str) -> str:
    """The model stand-in process for this run (``benchmarks/_model_server.py``); returns
    its gRPC address (also stored in ``v["model_address"]``)."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "_model_server.py"),
           "--redis-url", v["redis_url"], "--prefix", v["prefix"], "--port", str(port),
           "--profile", v.get("perf_profile") or "h200-llama3.1-8b"]  # fmt: skip
    group.start(f"{tag}-model", cmd)
    addr = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        group.check()
        if perf_model_of(addr) is not None:
            v["model_address"] = addr
            return addr
        time.sleep(0.5)
    raise RuntimeError("model server did not answer GetPerfModel within 60s")


def perf_model_of(address: str) -> dict[str, Any] | None:
    """The model process's current fit (prefill part), or None when it does not answer."""
    import grpc
    from google.protobuf.json_format import MessageToDict
    from tideserve.v1 import telemetry_pb2

    with grpc.insecure_channel(address) as ch:
        call = ch.unary_unary(
            "/tideserve.v1.TelemetryService/GetPerfModel",
            request_serializer=telemetry_pb2.GetPerfModelRequest.SerializeToString,
            response_deserializer=telemetry_pb2.GetPerfModelResponse.FromString,
        )
        try:
            resp = call(telemetry_pb2.GetPerfModelRequest(deployment="default"), timeout=2.0)
        except grpc.RpcError:
            return None
    return MessageToDict(resp.model, preserving_proto_field_name=True)
