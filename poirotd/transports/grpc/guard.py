"""Every RPC's last line of defence: a request larger than its method takes is refused before it
is decoded, one grpc cannot decode is INVALID_ARGUMENT, a fault of the daemon's own is INTERNAL
with a short id that names its logged traceback, never UNKNOWN; and a refused call leaves
nothing of itself in memory.

grpc decodes a unary request before any handler runs and answers a failure UNKNOWN, unlogged;
an exception a handler lets escape is UNKNOWN too. The interceptor wraps each unary method's
deserializer, bounded by the method's `MAX_REQUEST_BYTES`, and each method's behaviour so that
neither reaches grpc. Streamed requests are decoded while the handler reads them: the ingest
stream answers those itself.

A refusal is `context.abort`, which raises an AbortError that grpc also keeps on the call's
state. Its traceback holds the handler's frames, which hold the call's context, which holds that
state: a reference cycle, holding the request, that only the cyclic collector frees, and the
daemon runs that one rarely (observability.gc_tuning). `release` cuts the cycle where the error
leaves our code, so a refused call is freed when it ends, like an answered one.

A streaming behaviour comes in two shapes: an async generator that yields its replies (ours),
or a coroutine that sends them with `context.write` (grpc's own health Watch). Each is wrapped
in its own shape (`writes_replies`): grpc tells them apart by the handler's shape, and a
coroutine iterated as a generator fails before its first reply.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from poirotd.api.limits import MAX_REQUEST_BYTES
from poirotd.errors import InvalidArgument, ResourceExhausted, ServiceError
from poirotd.observability.metrics import Metrics
from poirotd.transports.grpc.status import abort

log = structlog.get_logger(__name__)

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


class _Refused:
    """What the wrapped deserializer gives instead of a request it will not or cannot decode:
    the refusal, never raised (so it carries no traceback), for the behaviour to answer."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error


def writes_replies(behaviour: Behaviour) -> bool:
    """Whether a streaming behaviour is a coroutine that answers with `context.write` rather
    than an async generator that yields its replies."""
    return not inspect.isasyncgenfunction(behaviour)


def release(aborted: grpc.aio.AbortError) -> None:
    """Drops what ties the AbortError grpc keeps to the frames it passed (and, through the error
    it was raised while handling, to the frames that raised that one). grpc only needs the
    error itself: it raises it again once the handler returns, and ends the call."""
    aborted.__traceback__ = None
    aborted.__context__ = None
    aborted.__cause__ = None


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
        method = handler_call_details.method
        rpc = rpc_name(method)
        deserializer = _bounded(rpc, handler.request_deserializer, MAX_REQUEST_BYTES.get(method))
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(rpc, handler.unary_unary),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(rpc, handler.unary_stream),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(rpc, handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _unary(self, rpc: str, behaviour: Behaviour) -> Behaviour:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if isinstance(request, _Refused):
                    await abort(context, self._metrics, rpc, request.error)
                try:
                    return await behaviour(request, context)
                except grpc.aio.BaseError:
                    raise
                except Exception:
                    await self._internal(rpc, context)
            except grpc.aio.AbortError as aborted:
                release(aborted)
                return None

        return guarded

    def _streaming(self, rpc: str, behaviour: Behaviour) -> Behaviour:
        """A behaviour that answers with a stream; it is given a request or, for a streamed
        request, the iterator of requests. One that writes its replies is awaited like a unary
        one (its result is None)."""
        if writes_replies(behaviour):
            return self._unary(rpc, behaviour)

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                if isinstance(request, _Refused):
                    await abort(context, self._metrics, rpc, request.error)
                try:
                    async for reply in behaviour(request, context):
                        yield reply
                except grpc.aio.BaseError:
                    raise
                except Exception:
                    await self._internal(rpc, context)
            except grpc.aio.AbortError as aborted:
                release(aborted)

        return guarded

    async def _internal(self, rpc: str, context: grpc.aio.ServicerContext) -> None:
        error_id = uuid.uuid4().hex[:12]
        self._metrics.requests_rejected.labels(rpc, "internal").inc()
        log.exception("request failed", rpc=rpc, error_id=error_id)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error {error_id} (logged)")


def _bounded(
    rpc: str, deserializer: Callable[[bytes], Any] | None, limit: int | None
) -> Callable[[bytes], Any] | None:
    """The deserializer, refusing instead of raising: bytes over `limit` (None: the transport's
    alone) unread, bytes that are not the method's request as undecodable."""
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        if limit is not None and len(raw) > limit:
            return _Refused(
                ResourceExhausted(
                    f"the request is {len(raw)} bytes; {rpc} takes at most {limit}",
                    reason="request_size",
                )
            )
        try:
            return deserializer(raw)
        except Exception:
            return _Refused(
                InvalidArgument(f"the request is not a valid {rpc} request", reason="undecodable")
            )

    return deserialize


def rpc_name(method: str) -> str:
    """`/poirot.v1.Investigations/Get` -> `Investigations.Get`, the rejects metric's label."""
    service, _, name = method.rpartition("/")
    return f"{service.rpartition('.')[2]}.{name}"
