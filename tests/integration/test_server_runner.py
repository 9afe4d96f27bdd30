"""The grpc.aio runner in-process: health, reflection, UNIMPLEMENTED, metrics, graceful stop,
port-in-use errors."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from tideserve.v1 import events_pb2, kvmeta_pb2, kvmeta_pb2_grpc

from services.common.errors import PortInUseError, StartupError
from services.common.security import channels
from services.common.server import serve
from services.kvmeta.settings import KVMetaSettings
from tests.helpers.ports import free_port

SERVICE_NAME = "tideserve.v1.KVMetaService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@contextmanager
def occupied_port() -> Iterator[int]:
    """A port held by a listening socket for the duration of the block."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def settings(grpc_port: int, metrics_port: int = 0) -> KVMetaSettings:
    return KVMetaSettings(
        grpc_port=grpc_port, metrics_port=metrics_port, shutdown_grace_s=30.0, log_format="text"
    )


class BareKVMeta(kvmeta_pb2_grpc.KVMetaServiceServicer):  # type: ignore[misc]
    """The generated base: every RPC unimplemented (independent of the real kvmeta servicer)."""


def add_to_server(servicer: BareKVMeta, server: grpc.aio.Server) -> str:
    kvmeta_pb2_grpc.add_KVMetaServiceServicer_to_server(servicer, server)
    return SERVICE_NAME


class SlowKVMeta(BareKVMeta):
    """MatchPrefix blocks until the test releases it; every other RPC is the generated base."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False

    async def MatchPrefix(self, request: Any, context: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        self.finished = True
        return kvmeta_pb2.MatchPrefixResponse()


class Running:
    def __init__(self, port: int, task: asyncio.Task[None], stop: asyncio.Event) -> None:
        self.port = port
        self.task = task
        self.stop = stop
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.kvmeta = kvmeta_pb2_grpc.KVMetaServiceStub(self.channel)


@asynccontextmanager
async def running(
    servicer: BareKVMeta | None = None,
    metrics_port: int = 0,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    registry: CollectorRegistry | None = None,
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[Running]:
    port = free_port()
    ready, stop = asyncio.Event(), asyncio.Event()
    service = servicer if servicer is not None else BareKVMeta()

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(service, server)]

    task = asyncio.create_task(
        serve(
            settings(port, metrics_port),
            "kvmeta",
            register,
            ready=ready,
            stop=stop,
            on_stop=on_stop,
            registry=registry,
            tracer_provider=tracer_provider,
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()  # raises the startup error
    assert ready.is_set(), "service did not become ready"
    run = Running(port, task, stop)
    try:
        yield run
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)
        await run.channel.close()


async def list_services(channel: grpc.aio.Channel) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="*")
    names: set[str] = set()
    async for response in stub.ServerReflectionInfo(iter([request])):
        names.update(s.name for s in response.list_services_response.service)
    return names


async def test_health_serving_for_overall_and_each_service() -> None:
    async with running() as run:
        for name in ["", SERVICE_NAME]:
            response = await run.health.Check(health_pb2.HealthCheckRequest(service=name))
            assert response.status == SERVING, name
        listed = await run.health.List(health_pb2.HealthListRequest())
        assert {k: v.status for k, v in listed.statuses.items()} == {
            "": SERVING,
            SERVICE_NAME: SERVING,
        }
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await run.health.Check(health_pb2.HealthCheckRequest(service="tideserve.v1.Nope"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_registered_services() -> None:
    async with running() as run:
        names = await list_services(run.channel)
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize(
    "call",
    [
        lambda stub: stub.Exist(kvmeta_pb2.ExistRequest()),
        lambda stub: stub.MatchPrefix(kvmeta_pb2.MatchPrefixRequest()),
        lambda stub: stub.IngestEvents(iter([events_pb2.KVEventBatch()])),
    ],
    ids=["unary-exist", "unary-match-prefix", "client-stream-ingest"],
)
async def test_unfilled_rpcs_are_unimplemented(call: Callable[[Any], Awaitable[Any]]) -> None:
    async with running() as run:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(run.kvmeta)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "Method not implemented!" in (info.value.details() or "")


async def test_graceful_shutdown_finishes_in_flight_call() -> None:
    servicer = SlowKVMeta()
    order: list[str] = []

    async def on_stop() -> None:
        order.append(f"on_stop finished={servicer.finished}")

    async with running(servicer, on_stop=on_stop) as run:
        watch = run.health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert (await watch.read()).status == SERVING
        slow = asyncio.ensure_future(run.kvmeta.MatchPrefix(kvmeta_pb2.MatchPrefixRequest()))
        await servicer.entered.wait()

        run.stop.set()
        assert (await watch.read()).status == NOT_SERVING
        assert await watch.read() is grpc.aio.EOF  # watchers end, they do not hold the stop
        assert not run.task.done()  # still waiting for the in-flight call

        servicer.release.set()
        response = await slow
        assert isinstance(response, kvmeta_pb2.MatchPrefixResponse)
        await asyncio.wait_for(run.task, timeout=60)
    assert order == ["on_stop finished=True"]


async def test_metrics_endpoint_serves_a_private_service_registry() -> None:
    metrics_port = free_port()
    async with running(metrics_port=metrics_port), aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
            body = await response.text()
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
    assert "python_info" in body and "process_cpu_seconds_total" in body
    assert "tideserve_grpc_server_in_flight" in body


async def test_grpc_call_metrics() -> None:
    registry = CollectorRegistry()
    async with running(registry=registry) as run:
        await run.health.Check(health_pb2.HealthCheckRequest(service=""))
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError):
                await run.kvmeta.Exist(kvmeta_pb2.ExistRequest())

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    kv = {"grpc_service": SERVICE_NAME, "grpc_method": "Exist"}
    health = {"grpc_service": "grpc.health.v1.Health", "grpc_method": "Check"}
    assert sample("tideserve_grpc_server_handled_total", grpc_code="UNIMPLEMENTED", **kv) == 2
    assert sample("tideserve_grpc_server_handled_total", grpc_code="OK", **health) == 1
    assert sample("tideserve_grpc_server_handling_seconds_count", **kv) == 2
    assert sample("tideserve_grpc_server_in_flight", grpc_service=SERVICE_NAME) == 0


@pytest.mark.parametrize("setting", ["grpc_port", "metrics_port"], ids=["grpc", "metrics"])
async def test_port_in_use_names_service_and_port(setting: str) -> None:
    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(BareKVMeta(), server)]

    with occupied_port() as taken:
        grpc_port = taken if setting == "grpc_port" else free_port()
        metrics_port = taken if setting == "metrics_port" else 0
        with pytest.raises(PortInUseError) as info:
            await serve(settings(grpc_port, metrics_port), "kvmeta", register)
    message = str(info.value)
    assert f"{setting} 127.0.0.1:{taken} is already in use" in message
    assert "kvmeta" in message
    # Nothing is left listening on the gRPC port after the failure.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", grpc_port))


async def test_failing_on_start_stops_the_server() -> None:
    port = free_port()

    async def on_start() -> None:
        raise StartupError("cannot reach redis_url (redis://127.0.0.1:1/0): refused")

    def register(server: grpc.aio.Server) -> list[str]:
        return [add_to_server(BareKVMeta(), server)]

    with pytest.raises(StartupError, match="redis_url"):
        await serve(settings(port), "kvmeta", register, on_start=on_start)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def recording_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_trace_context_flows_from_client_to_server_span() -> None:
    server_provider, server_spans = recording_provider()
    client_provider, client_spans = recording_provider()
    async with running(tracer_provider=server_provider) as run:
        target = f"127.0.0.1:{run.port}"
        async with channels.insecure_channel(target, client_provider) as channel:
            stub = kvmeta_pb2_grpc.KVMetaServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError):
                await stub.Exist(kvmeta_pb2.ExistRequest())
    (client,) = [s for s in client_spans.get_finished_spans() if s.name.endswith("/Exist")]
    (server,) = [s for s in server_spans.get_finished_spans() if s.name.endswith("/Exist")]
    assert server.context is not None and client.context is not None
    assert server.context.trace_id == client.context.trace_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.attributes is not None
    assert server.attributes.get("rpc.grpc.status_code") == grpc.StatusCode.UNIMPLEMENTED.value[0]
