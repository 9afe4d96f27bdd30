"""gRPC interceptors of the security settings: the server's token check and list bounds, the
client's token.

:class:`AuthInterceptor` answers UNAUTHENTICATED / PERMISSION_DENIED as
:func:`~services.common.security.access.decide` says, before the servicer runs.
:class:`ListLimitInterceptor` answers INVALID_ARGUMENT naming the first repeated field over
its bound (:mod:`~services.common.security.limits`), for streamed requests at the first
message over it. The client side adds ``authorization: Bearer <token>`` to every call
(:func:`token_interceptors` for grpc.aio channels, :func:`token_channel` for sync ones).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from services.common.metrics import call_behavior, iterate_behavior
from services.common.security.access import Denied, Policy, decide
from services.common.security.limits import ListBounds, overlong_field
from services.common.security.tokens import TokenFile

__all__ = [
    "AUTH_HEADER",
    "AuthInterceptor",
    "ListLimitInterceptor",
    "bearer_token",
    "token_channel",
    "token_interceptors",
]

AUTH_HEADER = "authorization"
_BEARER = "bearer "

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


def bearer_token(metadata: Any) -> str | None:
    """The bearer token in call metadata, or None."""
    for key, value in metadata or ():
        if key == AUTH_HEADER and isinstance(value, str):
            if value[: len(_BEARER)].lower() == _BEARER:
                return value[len(_BEARER) :].strip()
            return value.strip()
    return None


def _refusing(handler: grpc.RpcMethodHandler, denied: Denied) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that aborts with ``denied`` and runs nothing."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(denied.code, denied.message)

    async def refuse_stream(
        _request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await context.abort(denied.code, denied.message)
        yield None  # pragma: no cover - abort raises

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, **kw)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kw)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, **kw)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call the policy does not allow for the caller's token."""

    def __init__(self, policy: Policy, tokens: TokenFile, *, open_reads: bool) -> None:
        self._policy = policy
        self._tokens = tokens
        self._open_reads = open_reads

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        entry = self._tokens.role_of(token) if token else None
        denied = decide(
            self._policy,
            str(handler_call_details.method),
            entry.role if entry is not None else None,
            token_given=bool(token),
            open_reads=self._open_reads,
            who=entry.name if entry is not None else "",
        )
        return handler if denied is None else _refusing(handler, denied)


class ListLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """INVALID_ARGUMENT for a request with a repeated field over its bound."""

    def __init__(self, bounds: ListBounds) -> None:
        self._bounds = bounds

    async def _check(self, request: Any, context: Any) -> None:
        found = overlong_field(request, self._bounds) if hasattr(request, "ListFields") else None
        if found is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, found.message())

    def _checked(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            async for request in requests:
                await self._check(request, context)
                yield request

        return gen()

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def uu(request: Any, context: Any) -> Any:
                await self._check(request, context)
                return await call_behavior(inner, request, context)

            return grpc.unary_unary_rpc_method_handler(uu, **kw)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def us(request: Any, context: Any) -> AsyncIterator[Any]:
                await self._check(request, context)
                async for item in iterate_behavior(inner_us, request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(us, **kw)
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def su(requests: Any, context: Any) -> Any:
                return await call_behavior(inner_su, self._checked(requests, context), context)

            return grpc.stream_unary_rpc_method_handler(su, **kw)
        inner_ss = handler.stream_stream

        async def ss(requests: Any, context: Any) -> AsyncIterator[Any]:
            async for item in iterate_behavior(inner_ss, self._checked(requests, context), context):
                yield item

        return grpc.stream_stream_rpc_method_handler(ss, **kw)


# --------------------------------------------------------------------------- client side


def _with_token(details: Any, token: str, make: Callable[..., Any]) -> Any:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != AUTH_HEADER]
    metadata.append((AUTH_HEADER, f"Bearer {token}"))
    return make(
        method=details.method,
        timeout=details.timeout,
        metadata=metadata,
        credentials=details.credentials,
        wait_for_ready=details.wait_for_ready,
    )


class _AioToken:
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        return _with_token(details, self._token, grpc.aio.ClientCallDetails)


class _AioUU(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUS(_AioToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioSU(_AioToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AioSS(_AioToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """grpc.aio client interceptors sending ``token`` with every call: one per call shape
    (grpc.aio files each interceptor under the first shape it has)."""
    return [_AioUU(token), _AioUS(token), _AioSU(token), _AioSS(token)]


class _SyncDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, **kw: Any) -> None:
        self.method = kw["method"]
        self.timeout = kw["timeout"]
        self.metadata = kw["metadata"]
        self.credentials = kw["credentials"]
        self.wait_for_ready = kw["wait_for_ready"]
        self.compression = None


class _SyncToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: Any) -> Any:
        return _with_token(details, self._token, _SyncDetails)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def token_channel(channel: grpc.Channel, token: str) -> grpc.Channel:
    """A sync channel sending ``token`` with every call."""
    out: grpc.Channel = grpc.intercept_channel(channel, _SyncToken(token))
    return out
