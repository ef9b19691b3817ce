"""Sends OTLP trace exports to a receiver (a Collector, Phoenix, Langfuse...) over OTLP/HTTP
(protobuf) or OTLP/gRPC, and says of each failure whether the OTLP specification lets it be
retried, and after how long the receiver asked for.

Retried: HTTP 429, 502, 503, 504 (with Retry-After when given); gRPC UNAVAILABLE,
DEADLINE_EXCEEDED, ABORTED, CANCELLED, OUT_OF_RANGE, DATA_LOSS, and RESOURCE_EXHAUSTED when the
receiver sent a RetryInfo; a timeout or a connection that fails. Anything else is the receiver's
refusal of this export (a bad request, a missing credential), which sending again would not
change.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import aiohttp
import grpc
from google.protobuf.message import DecodeError
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from poirotd.errors import StartupError

ExportProtocol = Literal["http/protobuf", "grpc"]
# Why an export is sent again: a bounded label of poirot_otlp_export_retries_total.
RETRY_REASONS = ("throttled", "unavailable", "timeout", "connection", "store")

_RETRY_HTTP = {429: "throttled", 502: "unavailable", 503: "unavailable", 504: "unavailable"}
_RETRY_GRPC = {
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
    grpc.StatusCode.ABORTED: "unavailable",
    grpc.StatusCode.CANCELLED: "unavailable",
    grpc.StatusCode.OUT_OF_RANGE: "unavailable",
    grpc.StatusCode.DATA_LOSS: "unavailable",
}
_PROTOBUF = "application/x-protobuf"
# The longest receiver's text kept in an error (logged).
_DETAIL_CHARS = 300


class ExportSetupError(StartupError):
    """The exporter's TLS files cannot be used (missing, unreadable, not PEM)."""


class ExportError(Exception):
    """An export the receiver did not take. `retry`: the reason it may be sent again (one of
    RETRY_REASONS), "" when it may not; `retry_after`: the delay the receiver asked for."""

    def __init__(self, message: str, *, retry: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.retry = retry
        self.retry_after = retry_after


@dataclass(frozen=True)
class ClientTls:
    """Trust roots for the receiver's certificate (None: the system's), and this daemon's own
    certificate and key when the receiver asks for one (mutual TLS)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


class OtlpClient(Protocol):
    async def send(self, request: ExportTraceServiceRequest) -> int:
        """Returns the spans the receiver rejected (OTLP partial success: it took the others);
        raises ExportError when it took none."""

    async def close(self) -> None: ...


def open_client(
    protocol: ExportProtocol,
    endpoint: str,
    *,
    headers: Mapping[str, str],
    tls: ClientTls,
    timeout: float,
) -> OtlpClient:
    """Raises ExportSetupError when the TLS files cannot be used."""
    try:
        if protocol == "grpc":
            return GrpcClient(endpoint, headers=headers, tls=tls, timeout=timeout)
        return HttpClient(endpoint, headers=headers, tls=tls, timeout=timeout)
    except (OSError, ssl.SSLError) as exc:
        raise ExportSetupError(f"POIROTD_OTLP_EXPORT_*_FILE: {exc}") from None


class HttpClient:
    """OTLP/HTTP with protobuf bodies: POST the export to the endpoint (a URL without a path
    gets OTLP's /v1/traces)."""

    def __init__(
        self, endpoint: str, *, headers: Mapping[str, str], tls: ClientTls, timeout: float
    ) -> None:
        self.url = traces_url(endpoint)
        self._headers = {**headers, "Content-Type": _PROTOBUF}
        self._ssl = _ssl_context(tls) if self.url.startswith("https:") else None
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, request: ExportTraceServiceRequest) -> int:
        if self._session is None:  # made on the event loop it serves
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        body = request.SerializeToString()
        try:
            async with self._session.post(
                self.url, data=body, headers=self._headers, ssl=self._ssl or True
            ) as response:
                payload = await response.read()
                status = response.status
                retry_after = _seconds(response.headers.get("Retry-After"))
        except TimeoutError:
            raise ExportError(f"POST {self.url}: no answer in time", retry="timeout") from None
        except aiohttp.ClientError as exc:
            raise ExportError(f"POST {self.url}: {exc}", retry="connection") from None
        if status == 200:
            return _rejected_spans(payload)
        detail = _http_detail(payload)
        raise ExportError(
            f"POST {self.url}: HTTP {status}{': ' + detail if detail else ''}",
            retry=_RETRY_HTTP.get(status, ""),
            retry_after=retry_after,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class GrpcClient:
    """OTLP/gRPC: TraceService/Export on host:port (a URL's https:// scheme asks for TLS, as
    does a CA file or a client certificate; http:// or none, plaintext)."""

    def __init__(
        self, endpoint: str, *, headers: Mapping[str, str], tls: ClientTls, timeout: float
    ) -> None:
        scheme, _, rest = endpoint.rpartition("://")
        self.target = rest.rstrip("/")
        secure = scheme == "https" or tls.ca_file is not None or tls.cert_file is not None
        self._credentials = _grpc_credentials(tls) if secure else None
        self._metadata = tuple((key.lower(), value) for key, value in headers.items())
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: trace_service_pb2_grpc.TraceServiceStub | None = None

    async def send(self, request: ExportTraceServiceRequest) -> int:
        if self._stub is None:  # made on the event loop it serves
            self._channel = (
                grpc.aio.secure_channel(self.target, self._credentials)
                if self._credentials is not None
                else grpc.aio.insecure_channel(self.target)
            )
            self._stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        try:
            response: ExportTraceServiceResponse = await self._stub.Export(
                request, metadata=self._metadata, timeout=self._timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise _grpc_error(self.target, exc) from None
        return response.partial_success.rejected_spans

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


def traces_url(endpoint: str) -> str:
    """The endpoint as the URL to POST to: OTLP's /v1/traces when it names no path."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"{endpoint!r} is not a URL (http://host:4318/v1/traces)")
    host, slash, path = rest.partition("/")
    return endpoint if slash and path else f"{scheme}://{host}/v1/traces"


def _ssl_context(tls: ClientTls) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def _grpc_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
        private_key=tls.key_file.read_bytes() if tls.key_file else None,
        certificate_chain=tls.cert_file.read_bytes() if tls.cert_file else None,
    )


def _rejected_spans(payload: bytes) -> int:
    response = ExportTraceServiceResponse()
    try:
        response.ParseFromString(payload)
    except DecodeError:
        return 0  # a 200 with a body that is not OTLP's: taken, it says nothing more
    return response.partial_success.rejected_spans


def _http_detail(payload: bytes) -> str:
    """The receiver's reason: OTLP's google.rpc.Status, else its text."""
    status = Status()
    try:
        status.ParseFromString(payload)
        text = status.message
    except DecodeError:
        text = ""
    if not text:
        text = payload.decode("utf-8", "replace")
    return " ".join(text.split())[:_DETAIL_CHARS]


def _seconds(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is not used by OTLP receivers)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def _grpc_error(target: str, exc: grpc.aio.AioRpcError) -> ExportError:
    code = exc.code()
    retry = _RETRY_GRPC.get(code, "")
    delay = _retry_delay(exc)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None:
        retry = "throttled"
    detail = " ".join((exc.details() or "").split())[:_DETAIL_CHARS]
    return ExportError(f"{target}: {code.name}: {detail}", retry=retry, retry_after=delay)


def _retry_delay(exc: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo in the status details the receiver sent, if any."""
    for key, value in exc.trailing_metadata() or ():
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = Status()
        try:
            status.ParseFromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            retry = RetryInfo()
            if detail.Unpack(retry):
                delay: float = retry.retry_delay.ToTimedelta().total_seconds()
                return delay
    return None
