"""Every RPC's last line of defence: a request grpc cannot decode is INVALID_ARGUMENT, and a fault
of the daemon's own is INTERNAL with a short id that names its logged traceback, never UNKNOWN.

grpc decodes a unary request before any handler runs and answers a failure UNKNOWN, unlogged;
an exception a handler lets escape is UNKNOWN too. The interceptor wraps each method's
deserializer and behaviour so that neither reaches grpc. Streamed requests are decoded while the
handler reads them: the ingest stream answers those itself.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from poirotd.observability.metrics import Metrics

log = structlog.get_logger(__name__)

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


class _Undecodable:
    """What the wrapped deserializer gives for bytes that are not the method's request."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class GuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        rpc = rpc_name(handler_call_details.method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(rpc, handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(rpc, handler.unary_stream),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, rpc: str, behaviour: Behaviour) -> Behaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._refuse_undecodable(rpc, request, context)
            try:
                return await behaviour(request, context)
            except (grpc.aio.AbortError, grpc.aio.BaseError):
                raise
            except Exception:
                await self._internal(rpc, context)

        return guarded

    def _unary_stream(self, rpc: str, behaviour: Behaviour) -> Behaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await self._refuse_undecodable(rpc, request, context)
            try:
                async for reply in behaviour(request, context):
                    yield reply
            except (grpc.aio.AbortError, grpc.aio.BaseError):
                raise
            except Exception:
                await self._internal(rpc, context)

        return guarded

    async def _refuse_undecodable(
        self, rpc: str, request: Any, context: grpc.aio.ServicerContext
    ) -> None:
        if isinstance(request, _Undecodable):
            self._metrics.requests_rejected.labels(rpc, "undecodable").inc()
            log.warning("request undecodable", rpc=rpc, error=str(request.error)[:200])
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {rpc} request"
            )

    async def _internal(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        error_id = uuid.uuid4().hex[:12]
        self._metrics.requests_rejected.labels(rpc, "internal").inc()
        log.exception("request failed", rpc=rpc, error_id=error_id)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error {error_id} (logged)")


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:
            return _Undecodable(exc)

    return deserialize


def rpc_name(method: str) -> str:
    """`/poirot.v1.Investigations/Get` -> `Investigations.Get`, the rejects metric's label."""
    service, _, name = method.rpartition("/")
    return f"{service.rpartition('.')[2]}.{name}"
