"""Plain OTLP trace receivers for the exporter's tests: an aiohttp server on POST /v1/traces and a
grpc.aio TraceService, each on a loopback port of its own, keeping every export it is sent (with
the headers it came with) and answering from a script: a status per export, then success."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from poirotd.observability.metrics import Metrics


@dataclass
class Received:
    """What a receiver was sent. `answers`: the HTTP status of each export in turn (gRPC: 503 is
    UNAVAILABLE, 400 INVALID_ARGUMENT), 200 once they run out; `hold`, while clear, keeps every
    export waiting for its answer."""

    answers: list[int] = field(default_factory=list)
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    # Every export in the order it came, with its headers (gRPC: metadata), and its answer.
    exports: list[tuple[ExportTraceServiceRequest, dict[str, str], int]] = field(
        default_factory=list
    )
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    endpoint: str = ""

    def __post_init__(self) -> None:
        self.hold.set()

    async def answer(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> int:
        status = self.answers.pop(0) if self.answers else 200
        self.exports.append((request, headers, status))
        self.arrived.set()
        await self.hold.wait()
        return status

    def delivered_spans(self) -> list[Span]:
        """The spans of the exports answered with success."""
        return [
            span
            for request, _, status in self.exports
            if status == 200
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    async def wait_for_exports(self, count: int, seconds: float = 30) -> None:
        async with asyncio.timeout(seconds):
            while len(self.exports) < count:
                self.arrived.clear()
                await self.arrived.wait()


@asynccontextmanager
async def http_receiver(
    answers: Sequence[int] = (), tls: ssl.SSLContext | None = None
) -> AsyncIterator[Received]:
    """`tls`: served over HTTPS with this context."""
    received = Received(list(answers))

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        headers = {key.lower(): value for key, value in request.headers.items()}
        status = await received.answer(export, headers)
        body = ExportTraceServiceResponse().SerializeToString() if status == 200 else b"no"
        return web.Response(status=status, body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    received.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        yield received
    finally:
        received.hold.set()
        await runner.cleanup()


_GRPC_CODES = {503: grpc.StatusCode.UNAVAILABLE, 400: grpc.StatusCode.INVALID_ARGUMENT}


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, received: Received) -> None:
        self._received = received

    async def Export(
        self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> ExportTraceServiceResponse:
        metadata = {key: str(value) for key, value in context.invocation_metadata() or ()}
        status = await self._received.answer(request, metadata)
        if status != 200:
            await context.abort(_GRPC_CODES[status], f"answered {status} by the test's script")
        return ExportTraceServiceResponse()


@asynccontextmanager
async def grpc_receiver(
    answers: Sequence[int] = (), tls: grpc.ServerCredentials | None = None
) -> AsyncIterator[Received]:
    """`tls`: served over TLS with these credentials."""
    received = Received(list(answers))
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(received), server)
    port = (
        server.add_secure_port("127.0.0.1:0", tls)
        if tls is not None
        else server.add_insecure_port("127.0.0.1:0")
    )
    await server.start()
    received.endpoint = f"127.0.0.1:{port}"
    try:
        yield received
    finally:
        received.hold.set()
        await server.stop(0)


def attributions(metrics: Metrics, outcome: str) -> float:
    """poirot_otlp_export_attributions_total{outcome}."""
    return float(metrics.otlp_export_attributions.labels(outcome)._value.get())


async def counted(metrics: Metrics, outcome: str, count: int, seconds: float = 10) -> None:
    """Waits until `count` attributions had `outcome` (the receiver has answered by then)."""
    for _ in range(int(seconds * 50)):
        if attributions(metrics, outcome) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} attributions were not {outcome} within {seconds} s")
