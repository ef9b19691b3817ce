"""The gRPC server: our three services plus standard health checking and reflection, over TLS
when the daemon has a certificate, behind the authentication interceptor when it has an access
policy.

Health names each part the daemon depends on: `poirotd.store` and `poirotd.llm` are SERVING
while they answer. Readiness (the server, "", and each of our services) follows the store, which
every call needs; a model that is down leaves the daemon ready: it keeps ingesting, and its
investigations wait for the model. `poirotd.live` is SERVING until the daemon drains, whatever
its parts do: what a liveness probe asks (restarting cures no outage of theirs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection as grpc_reflection

from poirotd.api.limits import BATCH_BYTES, MAX_REPLY_BYTES
from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.api.poirot.v1 import poirot_pb2_grpc as pb_grpc
from poirotd.errors import TransportBindError
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.ingest.session_reads import SessionReads
from poirotd.investigations.service import InvestigationService
from poirotd.observability.outages import PartState
from poirotd.transports.grpc.auth import AuthInterceptor
from poirotd.transports.grpc.clients import ClientLimits
from poirotd.transports.grpc.guard import GuardInterceptor
from poirotd.transports.grpc.ingest import IngestServicer
from poirotd.transports.grpc.investigations import InvestigationsServicer
from poirotd.transports.grpc.sessions import SessionsServicer
from poirotd.transports.security.tls import ServerTls, TlsMaterial

SERVICES = tuple(
    pb.DESCRIPTOR.services_by_name[name].full_name
    for name in ("Ingest", "Investigations", "Sessions")
)
# gRPC's own hard limit sits above the per-item limit the core checks, so that ordinary oversized
# items get the core's precise, counted error; only grossly oversized ones meet gRPC's generic one.
# A batch of items (see BATCH_BYTES) fits on top.
_TRANSPORT_LIMIT_FACTOR = 4
# How long draining waits for open Ingest streams to commit, ack and end: a commit takes
# milliseconds, so this bounds only a stuck store (the streams are then cut at stop).
INGEST_DRAIN_SECONDS = 4.0
# A client's own keepalive may ping every 10 s during calls; a client that pings more often
# gets strikes, and its connection is closed at the third (GOAWAY too_many_pings): pings cost
# the server a write each. gRPC's 5 minutes would refuse a client that keeps a long stream alive
# through a load balancer or NAT that drops connections quiet for a few minutes.
_MIN_CLIENT_PING_SECONDS = 10
_MAX_PING_STRIKES = 2
# A connection without any call for this long is closed; its client reconnects on its next call.
# Connections are not closed by age (grpc.max_connection_age_ms): that would cut the long-lived
# Ingest and Watch streams, which end only when their client or the daemon ends them.
_MAX_CONNECTION_IDLE_SECONDS = 300
# The health service names of the parts the daemon depends on, and of the process itself:
# SERVING until it drains, whatever its parts do (what a liveness probe asks).
STORE_PART, LLM_PART, LIVE = "poirotd.store", "poirotd.llm", "poirotd.live"


class ExtraService(Protocol):
    """A service another transport serves on this server (OTLP's TraceService)."""

    name: str

    def add_to(self, server: grpc.aio.Server) -> None: ...


class GrpcServer:
    def __init__(
        self,
        pipeline: IngestPipeline,
        investigations: InvestigationService,
        sessions: SessionReads,
        limits: ClientLimits,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        batch_max: int,
        ingest_idle_seconds: float,
        keepalive_seconds: float,
        keepalive_timeout_seconds: float,
        tls: ServerTls | None = None,
        auth: AuthInterceptor | None = None,
        reflection: bool = True,
        extra_services: Sequence[ExtraService] = (),
        store: PartState | None = None,
        model: PartState | None = None,
    ) -> None:
        """`store`, `model`: the parts health reports on (`model` None: an LLM in process)."""
        self._host, self.port = host, port
        self._store, self._model = store, model
        self._reporting: set[asyncio.Task[None]] = set()
        self._tls = tls
        self._served = (*SERVICES, *(service.name for service in extra_services))
        limit = max_message_bytes * _TRANSPORT_LIMIT_FACTOR + BATCH_BYTES
        # The first interceptor runs first: who the caller is before anything of its request.
        guard = GuardInterceptor(investigations.metrics)
        self._server = grpc.aio.server(
            interceptors=[guard] if auth is None else [auth, guard],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", MAX_REPLY_BYTES),
                *_keepalive(keepalive_seconds, keepalive_timeout_seconds),
            ],
        )
        self._health = health.aio.HealthServicer()
        ingest = self._ingest = IngestServicer(
            pipeline,
            investigations.metrics,
            limits,
            max_item_bytes=max_message_bytes,
            batch_max=batch_max,
            idle_seconds=ingest_idle_seconds,
        )
        pb_grpc.add_IngestServicer_to_server(ingest, self._server)
        pb_grpc.add_InvestigationsServicer_to_server(
            InvestigationsServicer(investigations, limits), self._server
        )
        pb_grpc.add_SessionsServicer_to_server(
            SessionsServicer(sessions, investigations.metrics), self._server
        )
        for service in extra_services:
            service.add_to(self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        if reflection:
            grpc_reflection.enable_server_reflection(
                (*self._served, health.SERVICE_NAME, grpc_reflection.SERVICE_NAME), self._server
            )

    async def start(self) -> None:
        address = f"{self._host}:{self.port}"
        try:
            if self._tls is None:
                port = self._server.add_insecure_port(address)
            else:
                port = self._server.add_secure_port(address, _credentials(self._tls))
        except RuntimeError:  # grpc's "Failed to bind", in the versions that raise it
            port = 0
        if port == 0:
            raise TransportBindError(
                f"cannot listen for gRPC on {address} (POIROTD_GRPC_HOST, POIROTD_GRPC_PORT): "
                "the port is taken, or the host is not an address of this machine"
            )
        self.port = port
        await self._server.start()
        await self._health.set(LIVE, health_pb2.HealthCheckResponse.SERVING)
        await self._report_health()
        for part in (self._store, self._model):
            if part is not None:
                part.subscribe(self._health_changed)

    def _health_changed(self) -> None:
        task = asyncio.create_task(self._report_health())
        self._reporting.add(task)
        task.add_done_callback(self._reporting.discard)

    async def _report_health(self) -> None:
        ready = self._store is None or self._store.up
        for name in ("", *self._served):
            await self._health.set(name, _status(ready))
        await self._health.set(STORE_PART, _status(ready))
        if self._model is not None:
            await self._health.set(LLM_PART, _status(self._model.up))

    async def drain(self) -> None:
        """Health turns NOT_SERVING so load balancers and probes stop sending work, and open
        Ingest streams end once what they read is committed and acked, with UNAVAILABLE
        telling their clients to reconnect to another replica."""
        await self._health.enter_graceful_shutdown()
        await self._ingest.drain(INGEST_DRAIN_SECONDS)

    async def stop(self, grace: float) -> None:
        await self._server.stop(grace)


def _keepalive(seconds: float, timeout_seconds: float) -> list[tuple[str, int]]:
    """The server pings each connection that received nothing for `seconds` and closes it (its
    calls cancelled) when the ping is not answered within `timeout_seconds`: a peer that vanished
    frees what its calls held. Pings go on while calls stay silent (gRPC stops after two pings
    without data otherwise), and clients' own pings are held to `_MIN_CLIENT_PING_SECONDS`.
    gRPC core waits for a ping's ack `grpc.http2.ping_timeout_ms` (a minute by default, not in
    its public headers) before the keepalive timeout counts: both are set."""
    return [
        ("grpc.keepalive_time_ms", _ms(seconds)),
        ("grpc.keepalive_timeout_ms", _ms(timeout_seconds)),
        ("grpc.http2.ping_timeout_ms", _ms(timeout_seconds)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", _ms(_MIN_CLIENT_PING_SECONDS)),
        ("grpc.http2.max_ping_strikes", _MAX_PING_STRIKES),
        ("grpc.max_connection_idle_ms", _ms(_MAX_CONNECTION_IDLE_SECONDS)),
    ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _status(up: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    answer = health_pb2.HealthCheckResponse
    return answer.SERVING if up else answer.NOT_SERVING


def _credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """grpc asks the fetcher on every new connection: replaced files are loaded then, and
    connections already open keep the certificate they started with."""

    def configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert_chain)], root_certificates=material.client_ca
        )

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        material = tls.refresh()
        return None if material is None else configuration(material)

    return grpc.dynamic_ssl_server_credentials(
        configuration(tls.material),
        fetch,
        require_client_authentication=tls.requires_client_certificate,
    )
