"""OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export` and
`opentelemetry.proto.collector.logs.v1.LogsService/Export` on the daemon's own gRPC server (one
port to secure and expose); the gRPC server's guard answers undecodable bytes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from poirotd.errors import ServiceError
from poirotd.observability.metrics import Metrics
from poirotd.transports.grpc.auth import caller
from poirotd.transports.grpc.status import abort
from poirotd.transports.otlp.receiver import OtlpReceiver, Throttled

Request = TypeVar("Request")
Response = TypeVar("Response", covariant=True)


class _Result(Protocol[Response]):
    def response(self) -> Response: ...


async def _export(
    call: Callable[[Request, str, str], Awaitable[_Result[Response]]],
    request: Request,
    context: grpc.aio.ServicerContext,
    metrics: Metrics,
    rpc: str,
) -> Response:
    """One export through the receiver, its refusals answered with their gRPC status."""
    identity = caller()
    exporter = "" if identity is None else identity.qualified_name
    try:
        result = await call(request, "grpc", exporter)
    except Throttled as throttled:
        # OTLP: RESOURCE_EXHAUSTED is retried only with a RetryInfo (the Python exporter
        # reads it from its own trailer, the Collector from the status details).
        context.set_trailing_metadata(_retry_trailers(throttled))
        await abort(context, metrics, rpc, throttled)
    except ServiceError as error:
        await abort(context, metrics, rpc, error)
    return result.response()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    name = "opentelemetry.proto.collector.trace.v1.TraceService"

    def __init__(self, receiver: OtlpReceiver, metrics: Metrics) -> None:
        self._receiver = receiver
        self._metrics = metrics

    def add_to(self, server: grpc.aio.Server) -> None:
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, server)

    async def Export(
        self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> ExportTraceServiceResponse:
        return await _export(
            self._receiver.export, request, context, self._metrics, "TraceService.Export"
        )


class LogsService(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
    name = "opentelemetry.proto.collector.logs.v1.LogsService"

    def __init__(self, receiver: OtlpReceiver, metrics: Metrics) -> None:
        self._receiver = receiver
        self._metrics = metrics

    def add_to(self, server: grpc.aio.Server) -> None:
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(self, server)

    async def Export(
        self, request: ExportLogsServiceRequest, context: grpc.aio.ServicerContext
    ) -> ExportLogsServiceResponse:
        return await _export(
            self._receiver.export_logs, request, context, self._metrics, "LogsService.Export"
        )


def _retry_trailers(throttled: Throttled) -> tuple[tuple[str, bytes], ...]:
    retry = RetryInfo(retry_delay=Duration(seconds=throttled.retry_after))
    detail = AnyProto()
    detail.Pack(retry)
    status = Status(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message=str(throttled), details=[detail]
    )
    return (
        ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ("grpc-status-details-bin", status.SerializeToString()),
    )
