"""Wiring and lifecycle: what starts in which order, and how it drains on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import psycopg
import structlog

from poirotd.campaigns.canary import Canaries, load_cases
from poirotd.config import LLMSpec, Settings, SystemSpec
from poirotd.config.loader import load_spec
from poirotd.errors import StartupError
from poirotd.exporters.exporter import AttributionExporter, exporter_from_settings
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.ingest.session_reads import SessionReads
from poirotd.investigations.admission import QueueShares
from poirotd.investigations.bus import EventBus
from poirotd.investigations.recorder import OnFinished
from poirotd.investigations.replica import Replica
from poirotd.investigations.runner import InvestigationRunner
from poirotd.investigations.service import InvestigationService
from poirotd.investigations.triggers import HazardTriggers
from poirotd.llm import LLMBackend
from poirotd.llm.base import LLMError
from poirotd.llm.factory import open_backend
from poirotd.llm.health import Server, ServerPool
from poirotd.model import TransportName
from poirotd.observability.gc_tuning import tune_for_daemon
from poirotd.observability.metrics import Metrics
from poirotd.observability.outages import Availability
from poirotd.protocol.engine import InvestigationEngine
from poirotd.store import PostgresStore, SqliteStore, Store
from poirotd.store.checkpoints import ChainCheckpoints
from poirotd.store.faults import FAULT_KINDS
from poirotd.store.pg_schema import NewerSchemaError
from poirotd.store.pg_url import check_url, read_password, redacted, scrubbed
from poirotd.transports.grpc.auth import AuthInterceptor
from poirotd.transports.grpc.clients import ClientLimits
from poirotd.transports.grpc.server import GrpcServer
from poirotd.transports.http_server import HttpLimits
from poirotd.transports.lifecycle import Transport
from poirotd.transports.metrics_http import MetricsHttp
from poirotd.transports.mqtt import MqttInput, mqtt_input_spec
from poirotd.transports.otlp.grpc_services import LogsService, TraceService
from poirotd.transports.otlp.http import OtlpHttp
from poirotd.transports.otlp.log_join import LogJoin
from poirotd.transports.otlp.log_parking import LogParking
from poirotd.transports.otlp.receiver import SWEEP_SECONDS, OtlpReceiver
from poirotd.transports.page.access import PageAccess
from poirotd.transports.page.server import PageHttp
from poirotd.transports.security.access import AccessControl
from poirotd.transports.security.denials import DenialRecorder
from poirotd.transports.security.exposure import Exposure, check_exposure, exposures
from poirotd.transports.security.http import HttpAccess
from poirotd.transports.security.tls import ServerTls

log = structlog.get_logger(__name__)

# How long open RPCs (Watch streams, ingest streams) get to finish once investigations are drained.
RPC_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class Core:
    """The daemon without transports or lifecycle: the eval runner builds one per case."""

    pipeline: IngestPipeline
    investigations: InvestigationService
    runner: InvestigationRunner
    sessions: SessionReads


def build_core(
    spec: SystemSpec,
    store: Store,
    backend: LLMBackend,
    metrics: Metrics,
    settings: Settings,
    bus: EventBus | None = None,
    on_finished: OnFinished | None = None,
) -> Core:
    """`on_finished`: told of each investigation the runner finished (the OTLP exporter)."""
    engine = InvestigationEngine(
        spec, backend, store, token_budget=settings.llm_token_budget, memory=store
    )
    bus = bus or EventBus()
    runner = InvestigationRunner(
        spec,
        store,
        engine,
        bus,
        metrics,
        backend_name=backend.name,
        shares=QueueShares.from_settings(settings),
        workers=settings.concurrent_investigations,
        replica=Replica.from_settings(settings, shared=store.shared),
        model=backend.availability,
        on_finished=on_finished,
    )
    triggers = HazardTriggers(spec, runner, metrics)
    pipeline = IngestPipeline(
        spec,
        store,
        triggers,
        metrics,
        batch_max=settings.ingest_batch_max,
        signals_per_component=settings.max_signals_per_component,
        max_abs_value=settings.telemetry_max_abs_value,
    )
    investigations = InvestigationService(spec, store, runner, bus, metrics)
    return Core(pipeline, investigations, runner, SessionReads(store))


class StoreUnavailableError(StartupError):
    """The configured store cannot be opened: a bad URL, an unreachable server, a password file
    that cannot be read, a database from a newer poirotd (the message names the setting and
    never holds the password)."""


class ModelStartError(StartupError):
    """The LLM backend cannot be built: an API key, TLS material or model file it needs."""


def store_name(settings: Settings) -> str:
    """The store as logs name it: the SQLite file, or the URL without its password."""
    if settings.db_url is None:
        return str(settings.db_path)
    return redacted(settings.db_url.get_secret_value())


async def open_store(settings: Settings) -> Store:
    """The one place the adapter is chosen: PostgreSQL when POIROTD_DB_URL is set, else SQLite
    at POIROTD_DB_PATH (no server needed: the default)."""
    window = settings.idempotency_window_seconds
    if settings.db_url is None:
        return await SqliteStore.open(settings.db_path, idempotency_window=window)
    url = settings.db_url.get_secret_value()
    where = redacted(url)
    try:
        password = read_password(settings.db_password_file)
    except OSError as exc:
        raise StoreUnavailableError(
            f"POIROTD_DB_PASSWORD_FILE: cannot read {settings.db_password_file}: {exc.strerror}"
        ) from None
    try:
        return await PostgresStore.open(
            check_url(url), where=where, password=password, idempotency_window=window
        )
    except ValueError as exc:
        raise StoreUnavailableError(f"POIROTD_DB_URL: {exc}") from None
    except NewerSchemaError as exc:
        raise StoreUnavailableError(f"POIROTD_DB_URL: {exc}") from None
    except psycopg.Error as exc:
        problem = scrubbed(" ".join(str(exc).split()), url, password)
        raise StoreUnavailableError(
            f"POIROTD_DB_URL: cannot use the database {where}: {problem}"
        ) from None


def load_system_spec(path: Path) -> SystemSpec:
    """The spec with every section checked, the transports' own included (SpecError lists
    each problem with its line)."""
    return load_spec(path, checks=[mqtt_input_spec])


class Daemon:
    """Start-up opens the parts in order (store, model, investigations, background tasks,
    transports), each registered on an exit stack as it starts, so that a start that fails part-way
    (a port taken) stops what had started, in reverse order, before its StartupError leaves.
    `stop` drains in the order its docstring gives, then closes the same stack."""

    def __init__(
        self, settings: Settings, spec: SystemSpec, *, backend: LLMBackend | None = None
    ) -> None:
        self.settings = settings
        self.spec = spec
        self._backend = backend
        self._store: Store | None = None
        self._core: Core | None = None
        self._exporter: AttributionExporter | None = None
        self._transports: list[Transport] = []
        self._denials: DenialRecorder | None = None
        self._background: list[asyncio.Task[None]] = []
        self._investigations_drained = False
        # What start opened, closed in reverse order by stop (None: nothing is running).
        self._started: AsyncExitStack | None = None
        self.metrics = Metrics(spec.system.name)
        self.grpc_port = 0
        self.metrics_port = 0
        self.page_port = 0

    async def start(self) -> None:
        """Raises a StartupError: InsecureBindError, TlsError, AccessFileError or
        ExportSetupError before opening anything when the transports' or the exporter's
        settings
        cannot be used; StoreUnavailableError,
        ModelStartError or TransportBindError once what had started is stopped again."""
        s = self.settings
        self._publish_exposure(check_exposure(s))
        tls = (
            ServerTls(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file)
            if s.tls_cert_file is not None and s.tls_key_file is not None
            else None
        )
        access = None
        if s.auth_file is not None or s.tls_client_ca_file is not None:
            reloads = self.metrics.auth_file_reloads
            access = AccessControl(s.auth_file, lambda outcome: reloads.labels(outcome).inc())
            self.metrics.auth_file_loaded.set_function(lambda: float(access.loaded))
        self._exporter = exporter_from_settings(s, self.metrics, self.spec.system.name)
        async with AsyncExitStack() as started:
            core, otlp, denials = await self._start_parts(started, access)
            grpc, metrics_http, page, transports = self._build_transports(
                core, otlp, tls, access, denials
            )
            # Last: telemetry flows only once everything that handles it and its metrics is up.
            for transport in transports:
                await transport.start()
                started.push_async_callback(transport.stop, RPC_GRACE_SECONDS)
                self._transports.append(transport)
            self._started = started.pop_all()
        assert self._backend is not None, "started above"
        self.grpc_port, self.metrics_port = grpc.port, metrics_http.port
        self.page_port = page.port if page is not None else 0
        log.info(
            "daemon ready",
            system=self.spec.system.name,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            page_port=self.page_port,
            llm_backend=self._backend.name,
            replica_id=core.runner.replica.replica_id,
            store=store_name(s),
            tls=tls is not None,
            client_certificates=tls is not None and tls.requires_client_certificate,
            access_file=str(s.auth_file) if s.auth_file else None,
            otlp_export=s.otlp_export_protocol if self._exporter is not None else None,
        )

    async def _start_parts(
        self, started: AsyncExitStack, access: AccessControl | None
    ) -> tuple[Core, OtlpReceiver, DenialRecorder | None]:
        """Everything behind the transports, each part registered on `started` as it starts so that
        closing the stack stops them in the drain order (see `stop`)."""
        s = self.settings
        store = self._store = await open_store(s)
        started.push_async_callback(store.close)
        backend = self._backend = self._backend or await _open_backend(self.spec.llm)
        started.push_async_callback(backend.aclose)
        self._publish_parts(store, backend)
        bus = EventBus()
        exporter = self._exporter
        if exporter is not None:  # stopped once the drain's attributions are offered too
            await exporter.start(store)
            started.push_async_callback(exporter.stop, RPC_GRACE_SECONDS)
        core = self._core = build_core(
            self.spec,
            store,
            backend,
            self.metrics,
            s,
            bus,
            on_finished=None if exporter is None else exporter.offer,
        )
        checkpoints = ChainCheckpoints(
            store,
            s.audit_checkpoint_path or s.db_path.with_name(s.db_path.name + ".checkpoints.jsonl"),
            self.metrics,
            interval=s.audit_checkpoint_seconds,
        )
        started.push_async_callback(checkpoints.write)  # the head everything below left
        started.push_async_callback(core.pipeline.drain)
        await core.runner.recover()
        core.runner.start()
        started.push_async_callback(self._drain_investigations)
        if self.spec.canary is not None:
            canaries = Canaries(
                self.spec, store, backend, self.metrics, load_cases(self.spec, self.metrics)
            )
            self._background.append(asyncio.create_task(canaries.run_forever(), name="canaries"))
        if store.shared:
            follow = bus.follow(store, s.shared_poll_seconds)
            self._background.append(asyncio.create_task(follow, name="events-follow"))
        self._background.append(
            asyncio.create_task(checkpoints.run_forever(), name="audit-checkpoints")
        )
        if self.spec.rules:
            tick = asyncio.create_task(core.pipeline.tick_forever(), name="rules-tick")
            self._background.append(tick)
        started.push_async_callback(self._end_background)
        otlp = OtlpReceiver(
            self.spec,
            core.pipeline,
            self.metrics,
            session_by=s.otlp_session,
            max_pending=s.otlp_max_pending_messages,
            join=LogJoin(
                self.spec.agents_by_alias(),
                s.otlp_session,
                max_spans=s.otlp_log_remembered_spans,
                max_waiting=s.otlp_log_wait_records,
                wait_seconds=s.otlp_log_wait_seconds,
            ),
            parking=_log_parking(s, store, core.runner.replica.replica_id),
        )
        await otlp.reload(store)
        sweep = otlp.sweep_forever(store, min(s.otlp_log_wait_seconds / 4, SWEEP_SECONDS))
        self._background.append(asyncio.create_task(sweep, name="otlp-log-sweep"))
        denials = None
        if access is not None:
            denials = self._denials = DenialRecorder(
                store,
                self.metrics,
                asyncio.get_running_loop(),
                window_seconds=s.audit_denial_window_seconds,
                max_summaries=s.audit_denial_max_summaries,
            )
            # refusals the transports saw are chained before the store closes
            started.push_async_callback(denials.flush)
        return core, otlp, denials

    def _build_transports(
        self,
        core: Core,
        otlp: OtlpReceiver,
        tls: ServerTls | None,
        access: AccessControl | None,
        denials: DenialRecorder | None,
    ) -> tuple[GrpcServer, MetricsHttp, PageHttp | None, list[Transport]]:
        """The transports, built (nothing bound yet), in the order they start: gRPC and metrics
        (also returned alone, for their ports, with the page), then OTLP/HTTP, the page and
        the MQTT input when configured."""
        s = self.settings
        assert self._store is not None and self._backend is not None, "started before"
        grpc = GrpcServer(
            core.pipeline,
            core.investigations,
            core.sessions,
            ClientLimits.from_settings(s),
            host=s.grpc_host,
            port=s.grpc_port,
            max_message_bytes=s.max_message_bytes,
            batch_max=s.ingest_batch_max,
            ingest_idle_seconds=s.ingest_idle_seconds,
            keepalive_seconds=s.grpc_keepalive_seconds,
            keepalive_timeout_seconds=s.grpc_keepalive_timeout_seconds,
            extra_services=[TraceService(otlp, self.metrics), LogsService(otlp, self.metrics)],
            tls=tls,
            auth=None if access is None or denials is None else AuthInterceptor(access, denials),
            reflection=s.grpc_reflection,
            store=self._store.faults.availability,
            model=self._backend.availability,
        )

        def http_access(transport: TransportName, call: str) -> HttpAccess | None:
            return (
                None
                if access is None or denials is None
                else HttpAccess(access, denials, transport, call)
            )

        http_limits = HttpLimits.from_settings(s)
        metrics_http = MetricsHttp(
            self.metrics,
            http_limits,
            host=s.metrics_host,
            port=s.metrics_port,
            tls=tls,
            access=http_access("metrics", "GET /metrics"),
        )
        transports: list[Transport] = [grpc, metrics_http]
        if s.otlp_http_port:
            otlp_http = OtlpHttp(
                otlp,
                self.metrics,
                http_limits,
                host=s.otlp_http_host,
                port=s.otlp_http_port,
                max_body_bytes=s.otlp_max_body_bytes,
                tls=tls,
                access=http_access("otlp_http", "POST /v1/traces"),
                logs_access=http_access("otlp_http", "POST /v1/logs"),
            )
            transports.append(otlp_http)
        page = None
        if s.page_port:
            page = PageHttp(
                core.investigations,
                core.sessions,
                self.metrics,
                http_limits,
                PageAccess(
                    access,
                    denials,
                    confirm=s.page_confirm,
                    tls=tls is not None,
                    external_url=s.page_external_url,
                ),
                host=s.page_host,
                port=s.page_port,
                tls=tls,
            )
            transports.append(page)
            if s.page_external_url:
                self.metrics.page.info({"url": s.page_external_url.rstrip("/")})
        inputs = mqtt_input_spec(self.spec)
        if inputs is not None:
            mqtt = MqttInput(inputs, self.spec.system.name, core.pipeline, self.metrics.registry)
            transports.append(mqtt)
        return grpc, metrics_http, page, transports

    def _publish_parts(self, store: Store, backend: LLMBackend) -> None:
        """Gauges read, at each scrape, whether each part the daemon depends on answers."""
        faults = store.faults.availability
        self.metrics.store_up.set_function(lambda: float(faults.up))
        for kind in FAULT_KINDS:
            last = self.metrics.store_last_error.labels(kind)
            last.set_function(partial(_is_last_error, faults, kind))
        model = backend.availability
        if isinstance(model, ServerPool):
            for server in model.servers:
                up = self.metrics.llm_backend_up.labels(server.display)
                up.set_function(partial(_closed, server))

    def _publish_exposure(self, insecure: tuple[Exposure, ...]) -> None:
        for exposure in exposures(self.settings):
            self.metrics.insecure_bind.labels(exposure.port).set(exposure in insecure)
        for exposure in insecure:
            log.warning(
                "SERVING WITHOUT PROTECTION: anyone who can reach this address may call every "
                "RPC (POIROTD_ALLOW_INSECURE_BIND=true)",
                port=exposure.port,
                host=exposure.host,
                problem=exposure.problem(),
            )

    async def stop(self) -> None:
        """Drain order: every transport stops taking work (un-acked telemetry stays with the
        broker, health turns NOT_SERVING), investigations finish or are kept as interrupted,
        transports close their open calls, what was admitted is committed, then the model and
        the store are released. The last steps are the start-up stack's, closed in reverse."""
        started, self._started = self._started, None
        if started is None:
            return
        log.info("daemon draining", drain_seconds=self.settings.drain_seconds)
        for transport in self._transports:
            await transport.drain()
        await self._end_background()
        await self._drain_investigations()
        await started.aclose()
        log.info("daemon stopped")

    async def _drain_investigations(self) -> None:
        """Once: the drain runs before the transports close, and again from the stack."""
        if self._core is None or self._investigations_drained:
            return
        self._investigations_drained = True
        await self._core.runner.drain(self.settings.drain_seconds)

    async def _end_background(self) -> None:
        tasks, self._background = self._background, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run_until_signalled(self, ready_file: Path | None = None) -> None:
        """Serves until SIGTERM or SIGINT, then stops: also when anything in between raises."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
            try:
                tune_for_daemon(self.settings.gc_young_threshold)
                if ready_file is not None:
                    _write_ready_file(ready_file, self.grpc_port, self.metrics_port, self.page_port)
                await stop.wait()
            finally:
                await self.stop()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)


def _log_parking(settings: Settings, store: Store, replica_id: str) -> LogParking:
    """Alone on its store, a daemon's parked log events are all its own, whatever replica id it
    had when it parked them; a replica's are its id's, and it takes over those of replicas gone
    (held for twice the wait: a live replica places or rejects its events within it)."""
    if not store.shared:
        return LogParking("")
    return LogParking(replica_id, take_over_after=2 * settings.otlp_log_wait_seconds)


async def _open_backend(spec: LLMSpec) -> LLMBackend:
    """The spec's LLM backend; one that cannot be built (a key, TLS or model file) is a start-up
    error."""
    try:
        return await open_backend(spec)
    except LLMError as exc:
        raise ModelStartError(f"poirotd could not start its LLM backend: {exc}") from None


def _closed(server: Server) -> float:
    return float(server.closed)


def _is_last_error(faults: Availability, kind: str) -> float:
    return float(faults.last_error_kind == kind)


def _write_ready_file(path: Path, grpc_port: int, metrics_port: int, page_port: int) -> None:
    """Atomically announces the bound ports (useful when they were chosen by the OS)."""
    payload = {
        "pid": os.getpid(),
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "page_port": page_port,
        "ready_at": datetime.now(UTC).isoformat(),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)
