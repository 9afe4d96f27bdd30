"""Token auth, list bounds and reflection through the real service runner (in-process gRPC)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tideserve.v1 import events_pb2, telemetry_pb2, telemetry_pb2_grpc

from services.common.security.access import AccessTable, Role
from services.common.security.channels import ClientSecurity, aio_channel
from services.common.security.tokens import format_entry, new_token
from tests.helpers.secured import SERVICE, secured

pytestmark = pytest.mark.asyncio

TABLE = AccessTable(
    SERVICE, {"QueryWindow": Role.READ, "ReportRecords": Role.OPERATOR, "GetPerfModel": Role.READ}
)
"""GetRecommendation and GetSession are left out on purpose: refused to everyone."""

TOKENS = {"admin": new_token(), "operator": new_token(), "read-only": new_token()}


def _tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    lines = [format_entry(f"t-{r}", Role.parse(r), tok) for r, tok in TOKENS.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _auth(tmp_path: Path, open_reads: bool = False) -> dict[str, Any]:
    return {
        "auth": {"enabled": True, "tokens_file": _tokens_file(tmp_path), "open_reads": open_reads}
    }


async def _records(n: int, scores: int = 0) -> AsyncIterator[events_pb2.RequestRecord]:
    for i in range(n):
        yield events_pb2.RequestRecord(
            request_id=f"r{i}", scores=[events_pb2.PluginScore() for _ in range(scores)]
        )


async def _call(port: int, method: str, token: str | None) -> grpc.StatusCode:
    async with aio_channel(f"127.0.0.1:{port}", ClientSecurity(token=token)) as ch:
        stub = telemetry_pb2_grpc.TelemetryServiceStub(ch)
        try:
            if method == "ReportRecords":
                await stub.ReportRecords(_records(2))
            else:
                await getattr(stub, method)(getattr(telemetry_pb2, f"{method}Request")())
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
UNIMPL = grpc.StatusCode.UNIMPLEMENTED

CALLS: Sequence[tuple[str, str | None, bool, grpc.StatusCode]] = [
    ("QueryWindow", None, False, UNAUTH),
    ("QueryWindow", "bogus", False, UNAUTH),
    ("QueryWindow", None, True, OK),
    ("QueryWindow", "read-only", False, OK),
    ("ReportRecords", None, True, UNAUTH),
    ("ReportRecords", "read-only", True, DENIED),
    ("ReportRecords", "operator", False, OK),
    ("ReportRecords", "admin", False, OK),
    ("GetPerfModel", "admin", False, UNIMPL),  # allowed, then the generated base answers
    ("GetSession", "admin", True, DENIED),  # in no table: refused, even to admin, even open
]


@pytest.mark.parametrize(
    ("method", "who", "open_reads", "expected"),
    CALLS,
    ids=[f"{m}-{w or 'none'}-open{o}" for m, w, o, _ in CALLS],
)
async def test_roles(
    tmp_path: Path, method: str, who: str | None, open_reads: bool, expected: grpc.StatusCode
) -> None:
    token = TOKENS.get(who, who) if who is not None else None
    async with secured(_auth(tmp_path, open_reads), [TABLE]) as port:
        assert await _call(port, method, token) == expected


async def test_refusal_says_what_is_needed(tmp_path: Path) -> None:
    async with secured(_auth(tmp_path), [TABLE]) as port:
        async with aio_channel(
            f"127.0.0.1:{port}", ClientSecurity(token=TOKENS["read-only"])
        ) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await telemetry_pb2_grpc.TelemetryServiceStub(ch).ReportRecords(_records(1))
    assert err.value.code() == DENIED
    assert "needs role operator" in (err.value.details() or "")
    assert "t-read-only" in (err.value.details() or "")


async def test_health_stays_open_and_tokens_reload(tmp_path: Path) -> None:
    async with secured(_auth(tmp_path), [TABLE]) as port:
        async with aio_channel(f"127.0.0.1:{port}") as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        fresh = new_token()
        path = tmp_path / "tokens"
        path.write_text(path.read_text() + format_entry("late", Role.OPERATOR, fresh) + "\n")

        async def accepted() -> bool:
            return await _call(port, "ReportRecords", fresh) == OK

        from tests.helpers.waits import eventually

        await eventually(accepted)


@pytest.mark.parametrize("enabled", [True, False], ids=["reflection-on", "reflection-off"])
async def test_reflection_by_setting(enabled: bool) -> None:
    async with secured({"reflection": enabled}, [TABLE]) as port:
        async with aio_channel(f"127.0.0.1:{port}") as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)

            async def one() -> AsyncIterator[Any]:
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            try:
                names = [
                    s.name
                    async for r in stub.ServerReflectionInfo(one())
                    for s in r.list_services_response.service
                ]
                code = OK
            except grpc.aio.AioRpcError as err:
                names, code = [], err.code()
    if enabled:
        assert SERVICE in names
    else:
        assert code == UNIMPL


LIMITS = [
    ("stream within bounds", 2, 3, OK),
    ("stream over the bound", 4, 3, grpc.StatusCode.INVALID_ARGUMENT),
]


@pytest.mark.parametrize(
    ("scores", "bound", "expected"), [c[1:] for c in LIMITS], ids=[c[0] for c in LIMITS]
)
async def test_list_lengths_are_bounded(scores: int, bound: int, expected: grpc.StatusCode) -> None:
    async with secured({"grpc_limits": {"max_list_length": bound}}, [TABLE]) as port:
        async with aio_channel(f"127.0.0.1:{port}") as ch:
            stub = telemetry_pb2_grpc.TelemetryServiceStub(ch)
            try:
                await stub.ReportRecords(_records(2, scores))
                code, details = OK, ""
            except grpc.aio.AioRpcError as err:
                code, details = err.code(), err.details() or ""
    assert code == expected
    if expected != OK:
        assert "scores has 4 entries" in details


async def test_message_size_is_bounded() -> None:
    async with secured({"grpc_limits": {"max_receive_message_bytes": 1024}}, [TABLE]) as port:
        async with aio_channel(f"127.0.0.1:{port}") as ch:
            stub = telemetry_pb2_grpc.TelemetryServiceStub(ch)
            big = telemetry_pb2.QueryWindowRequest(deployment="d" * 4096)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.QueryWindow(big)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await stub.QueryWindow(telemetry_pb2.QueryWindowRequest(deployment="d"))


@pytest.mark.parametrize(
    ("who", "expected"),
    [("operator", OK), (None, UNAUTH)],
    ids=["engine-token-file", "engine-no-token"],
)
async def test_engine_channel_to_kvmeta_sends_its_token(
    tmp_path: Path, who: str | None, expected: grpc.StatusCode
) -> None:
    """The engine's kvmeta channel (kvcache role, write-through tier) carries the token in
    ``kvmeta_token_file``: an operator RPC passes with it and is refused without it."""
    from services.engine.settings import EngineSettings
    from services.engine.tier_io import kvmeta_channel

    token_file = None
    if who is not None:
        token_file = tmp_path / "engine-token"
        token_file.write_text(TOKENS[who] + "\n")
    async with secured(_auth(tmp_path), [TABLE]) as port:
        settings = EngineSettings(kvmeta_address=f"127.0.0.1:{port}", kvmeta_token_file=token_file)
        async with kvmeta_channel(settings) as ch:
            try:
                await telemetry_pb2_grpc.TelemetryServiceStub(ch).ReportRecords(_records(1))
                got = OK
            except grpc.aio.AioRpcError as err:
                got = err.code()
    assert got == expected
