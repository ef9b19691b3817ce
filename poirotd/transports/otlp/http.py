"""OTLP/HTTP: `POST /v1/traces` and `POST /v1/logs` on their own port (conventionally 4318),
protobuf or JSON bodies, gzip or not, answered in the request's encoding as the OTLP
specification says.

Served by aiohttp in the daemon's event loop, so a request calls the ingest pipeline directly
(uvicorn installs its own signal handlers), within the HTTP transports' request deadline and
connection caps (`transports.http_server`). Bodies are decompressed here, not by aiohttp, to
bound what a small gzip body may expand to. Locked like the other transports: TLS from the daemon's
certificate (followed on rotation), and with an access policy the `ingest` role.
"""

from __future__ import annotations

import base64
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import orjson
import structlog
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from poirotd.errors import InvalidArgument, ResourceExhausted, ServiceError, Unavailable, quote
from poirotd.observability.metrics import Metrics
from poirotd.transports.http_server import HttpLimits, HttpServer
from poirotd.transports.otlp.receiver import RETRY_AFTER_SECONDS, OtlpReceiver, Throttled
from poirotd.transports.security.http import HttpAccess
from poirotd.transports.security.tls import ServerTls

log = structlog.get_logger(__name__)

PATH = "/v1/traces"
LOGS_PATH = "/v1/logs"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_RPC = "otlp_http"
# OTLP/JSON writes ids as hex, where protobuf's JSON mapping has base64.
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")
_GZIP_WBITS = 16 + zlib.MAX_WBITS

Export = TypeVar("Export", ExportTraceServiceRequest, ExportLogsServiceRequest)


class _Result(Protocol):
    def response(self) -> Message: ...


class UnsupportedMediaType(InvalidArgument):
    """A Content-Type or Content-Encoding this receiver does not read (HTTP 415)."""


class _AbandonedError(Exception):
    """The connection ended before the body was in: the client left, or the request deadline
    aborted it (counted there). No one is left to answer."""


class OtlpHttp:
    """The OTLP/HTTP transport; its lifecycle is the daemon's (transports.lifecycle)."""

    def __init__(
        self,
        receiver: OtlpReceiver,
        metrics: Metrics,
        limits: HttpLimits,
        *,
        host: str,
        port: int,
        max_body_bytes: int,
        tls: ServerTls | None = None,
        access: HttpAccess | None = None,
        logs_access: HttpAccess | None = None,
    ) -> None:
        """`access`, `logs_access`: who may export traces, logs (None: anyone)."""
        self._receiver = receiver
        self._access = access
        self._logs_access = logs_access
        self._metrics = metrics
        self._max_body_bytes = max_body_bytes
        self._draining = False
        app = web.Application(client_max_size=max_body_bytes)
        app.router.add_post(PATH, self._traces)
        app.router.add_post(LOGS_PATH, self._logs)
        self._server = HttpServer(
            app, "otlp_http", metrics, limits, host=host, port=port, tls=tls, auto_decompress=False
        )

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self) -> None:
        await self._server.start()

    async def drain(self) -> None:
        """New exports are answered 503 with Retry-After (the exporter resends them elsewhere
        or later); those in flight are still committed and answered."""
        self._draining = True

    async def stop(self, grace: float) -> None:
        await self._server.stop()

    async def _traces(self, request: web.Request) -> web.Response:
        return await self._export(
            request, ExportTraceServiceRequest, self._receiver.export, self._access
        )

    async def _logs(self, request: web.Request) -> web.Response:
        return await self._export(
            request, ExportLogsServiceRequest, self._receiver.export_logs, self._logs_access
        )

    async def _export(
        self,
        request: web.Request,
        kind: type[Export],
        call: Callable[[Export, str, str], Awaitable[_Result]],
        access: HttpAccess | None,
    ) -> web.Response:
        answer_as = request.content_type if request.content_type in (PROTOBUF, JSON) else JSON
        exporter = ""
        if access is not None:
            admitted = access.admit(request)
            if isinstance(admitted, web.Response):
                return admitted
            exporter = admitted.qualified_name
        try:
            if self._draining:
                raise Unavailable("the daemon is draining", reason="draining")
            export = _decode(
                kind,
                await _body(request, self._max_body_bytes),
                request.content_type,
                request.headers.get("Content-Encoding", "identity"),
                self._max_body_bytes,
            )
            result = await call(export, "http", exporter)
        except ServiceError as error:
            return self._refuse(error, answer_as)
        except _AbandonedError:
            log.info("request abandoned before its body was in", rpc=_RPC, peer=request.remote)
            return web.Response(status=400)
        except Exception:  # a fault of ours: answered and logged like the gRPC guard's INTERNAL
            error_id = uuid.uuid4().hex[:12]
            self._metrics.requests_rejected.labels(_RPC, "internal").inc()
            log.exception("request failed", rpc=_RPC, error_id=error_id)
            body = Status(code=13, message=f"internal error {error_id} (logged)")
            return _response(500, body, answer_as)
        return _response(200, result.response(), answer_as)

    def _refuse(self, error: ServiceError, answer_as: str) -> web.Response:
        status = _http_status(error)
        self._metrics.requests_rejected.labels(_RPC, error.reason).inc()
        log.warning(
            "request refused", rpc=_RPC, status=status, reason=error.reason, detail=str(error)
        )
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in (429, 503) else {}
        body = Status(code=_GRPC_CODES.get(status, 13), message=str(error)[:1024])
        return _response(status, body, answer_as, headers)


# HTTP status -> the google.rpc.Code an OTLP/HTTP error body carries.
_GRPC_CODES = {400: 3, 413: 8, 415: 3, 429: 8, 503: 14}


# The first that matches; the more specific refusals first.
_HTTP_STATUSES: tuple[tuple[type[ServiceError], int], ...] = (
    (Throttled, 429),
    (UnsupportedMediaType, 415),
    (ResourceExhausted, 413),
    (InvalidArgument, 400),
    (Unavailable, 503),
)


def _http_status(error: ServiceError) -> int:
    return next((status for kind, status in _HTTP_STATUSES if isinstance(error, kind)), 500)


async def _body(request: web.Request, limit: int) -> bytes:
    try:
        return await request.read()
    except ConnectionError:
        raise _AbandonedError from None
    except web.HTTPRequestEntityTooLarge:
        raise ResourceExhausted(
            f"the body is over {limit} bytes; export smaller batches", reason="oversized"
        ) from None


def _decode(
    kind: type[Export], body: bytes, content_type: str, encoding: str, limit: int
) -> Export:
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit)
    elif encoding not in ("identity", ""):
        raise UnsupportedMediaType(
            f"Content-Encoding {quote(encoding)} is not gzip or identity", reason="wrong_encoding"
        )
    if content_type == PROTOBUF:
        try:
            return kind.FromString(body)
        except DecodeError as exc:
            raise InvalidArgument(
                f"the body is not an {kind.__name__}: {exc}", reason="undecodable"
            ) from None
    if content_type == JSON:
        return _from_json(kind, body)
    raise UnsupportedMediaType(
        f"Content-Type {quote(content_type)} is not {PROTOBUF} or {JSON}",
        reason="wrong_content_type",
    )


def _gunzip(body: bytes, limit: int) -> bytes:
    inflate = zlib.decompressobj(_GZIP_WBITS)
    try:
        data = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgument(f"the body is not gzip: {exc}", reason="undecodable") from None
    if len(data) > limit:
        raise ResourceExhausted(
            f"the body is over {limit} bytes once decompressed", reason="oversized"
        )
    if not inflate.eof:
        raise InvalidArgument("the gzip body is truncated", reason="undecodable")
    return data


def _from_json(kind: type[Export], body: bytes) -> Export:
    try:
        document = orjson.loads(body)
        _hex_ids_to_base64(document)
        export = kind()
        json_format.ParseDict(document, export, ignore_unknown_fields=True)
    except (orjson.JSONDecodeError, json_format.ParseError, ValueError, TypeError) as exc:
        message = f"the body is not an OTLP/JSON {kind.__name__}: {str(exc)[:200]}"
        raise InvalidArgument(message, reason="undecodable") from None
    return export


def _hex_ids_to_base64(document: Any) -> None:
    """Rewrites the ids of spans, their links and log records in place; other shapes are left
    for the protobuf parser to refuse."""
    for holder in _id_holders(document):
        for name in _ID_FIELDS:
            value = holder.get(name)
            if isinstance(value, str):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise ValueError(f"{name} {quote(value)} is not hex") from None
                holder[name] = base64.b64encode(raw).decode()


def _id_holders(document: Any) -> Iterator[dict[str, Any]]:
    for resource_spans in _list(document, "resourceSpans", "resource_spans"):
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans"):
                yield span
                yield from _list(span, "links")
    for resource_logs in _list(document, "resourceLogs", "resource_logs"):
        for scope_logs in _list(resource_logs, "scopeLogs", "scope_logs"):
            yield from _list(scope_logs, "logRecords", "log_records")


def _list(holder: Any, *names: str) -> list[dict[str, Any]]:
    if not isinstance(holder, dict):
        return []
    for name in names:
        value = holder.get(name)
        if isinstance(value, list):
            return [item for item in value if isinstance(item, dict)]
    return []


def _response(
    status: int, message: Message, content_type: str, headers: dict[str, str] | None = None
) -> web.Response:
    if content_type == PROTOBUF:
        body = message.SerializeToString()
    else:
        body = json_format.MessageToJson(message, indent=None).encode()
    return web.Response(status=status, body=body, content_type=content_type, headers=headers)
