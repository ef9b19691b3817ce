"""Maps the core's refusals to gRPC status codes, counting each one."""

from __future__ import annotations

from typing import NoReturn

import grpc
import structlog

from poirotd.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)
from poirotd.observability.metrics import Metrics

log = structlog.get_logger(__name__)

_DETAIL_CHARS = 1024

_CODES: dict[type[ServiceError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    Internal: grpc.StatusCode.INTERNAL,
}


async def abort(
    context: grpc.aio.ServicerContext, metrics: Metrics, rpc: str, error: ServiceError
) -> NoReturn:
    # A refusal's subclass (a transport's own, like OTLP's Throttled) has its base's code.
    code = next(
        (code for kind, code in _CODES.items() if isinstance(error, kind)),
        grpc.StatusCode.INTERNAL,
    )
    metrics.requests_rejected.labels(rpc, error.reason).inc()
    if isinstance(error, ResourceExhausted):  # every one is a limit
        metrics.limit_rejections.labels(error.reason).inc()
    # Messages quote clients' text capped (errors.quote); this bounds whatever else they hold.
    detail = str(error)[:_DETAIL_CHARS]
    log.warning("request refused", rpc=rpc, code=code.name, reason=error.reason, detail=detail)
    await context.abort(code, detail)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises
