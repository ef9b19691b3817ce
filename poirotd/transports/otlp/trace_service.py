"""OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export` on the daemon's own gRPC
server (one port to secure and expose); the gRPC server's guard answers undecodable bytes."""

from __future__ import annotations

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
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

_RPC = "TraceService.Export"


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
        identity = caller()
        exporter = "" if identity is None else identity.qualified_name
        try:
            result = await self._receiver.export(request, "grpc", exporter)
        except Throttled as throttled:
            # OTLP: RESOURCE_EXHAUSTED is retried only with a RetryInfo (the Python exporter
            # reads it from its own trailer, the Collector from the status details).
            context.set_trailing_metadata(_retry_trailers(throttled))
            await abort(context, self._metrics, _RPC, throttled)
        except ServiceError as error:
            await abort(context, self._metrics, _RPC, error)
        return result.response()


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
