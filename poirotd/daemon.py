"""Wiring and lifecycle: what starts in which order, and how it drains on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import psycopg
import structlog

from poirotd.config import Settings, SystemSpec
from poirotd.config.loader import load_spec
from poirotd.ingest.pipeline import IngestPipeline
from poirotd.ingest.session_reads import SessionReads
from poirotd.investigations.admission import QueueShares
from poirotd.investigations.bus import EventBus
from poirotd.investigations.replica import Replica
from poirotd.investigations.runner import InvestigationRunner
from poirotd.investigations.service import InvestigationService
from poirotd.investigations.triggers import HazardTriggers
from poirotd.llm import LLMBackend
from poirotd.llm.factory import open_backend
from poirotd.llm.health import Server, ServerPool
from poirotd.model import Door
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
from poirotd.transports.otlp.http import OtlpHttp
from poirotd.transports.otlp.receiver import OtlpReceiver
from poirotd.transports.otlp.trace_service import TraceService
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
) -> Core:
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


class StoreUnavailableError(Exception):
    """The configured store cannot be opened: a bad URL, an unreachable server, a password file
    that cannot be read, a database from a newer poirotd (the message names the setting and
    never holds the password)."""


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
    def __init__(
        self, settings: Settings, spec: SystemSpec, *, backend: LLMBackend | None = None
    ) -> None:
        self.settings = settings
        self.spec = spec
        self._backend = backend
        self._store: Store | None = None
        self._core: Core | None = None
        self._checkpoints: ChainCheckpoints | None = None
        self._transports: list[Transport] = []
        self._denials: DenialRecorder | None = None
        self._background: list[asyncio.Task[None]] = []
        self.metrics = Metrics(spec.system.name)
        self.grpc_port = 0
        self.metrics_port = 0

    async def start(self) -> None:
        """Raises InsecureBindError, TlsError or AccessFileError before opening anything when
        the doors' settings cannot be used."""
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
        self._store = await open_store(s)
        if self._backend is None:
            self._backend = await open_backend(self.spec.llm)
        self._publish_parts(self._store, self._backend)
        bus = EventBus()
        core = self._core = build_core(self.spec, self._store, self._backend, self.metrics, s, bus)
        await core.runner.recover()
        core.runner.start()
        if self._store.shared:
            follow = bus.follow(self._store, s.shared_poll_seconds)
            self._background.append(asyncio.create_task(follow, name="events-follow"))
        checkpoints = self._checkpoints = ChainCheckpoints(
            self._store,
            s.audit_checkpoint_path or s.db_path.with_name(s.db_path.name + ".checkpoints.jsonl"),
            self.metrics,
            interval=s.audit_checkpoint_seconds,
        )
        self._background.append(
            asyncio.create_task(checkpoints.run_forever(), name="audit-checkpoints")
        )
        if self.spec.rules:
            tick = asyncio.create_task(core.pipeline.tick_forever(), name="rules-tick")
            self._background.append(tick)
        otlp = OtlpReceiver(
            self.spec,
            core.pipeline,
            self.metrics,
            session_by=s.otlp_session,
            max_pending=s.otlp_max_pending_messages,
        )
        denials = None
        if access is not None:
            loop = asyncio.get_running_loop()
            denials = self._denials = DenialRecorder(
                self._store,
                self.metrics,
                loop,
                window_seconds=s.audit_denial_window_seconds,
                max_summaries=s.audit_denial_max_summaries,
            )
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
            extra_services=[TraceService(otlp, self.metrics)],
            tls=tls,
            auth=None if access is None or denials is None else AuthInterceptor(access, denials),
            reflection=s.grpc_reflection,
            store=self._store.faults.availability,
            model=self._backend.availability,
        )

        def http_access(door: Door, call: str) -> HttpAccess | None:
            return (
                None
                if access is None or denials is None
                else HttpAccess(access, denials, door, call)
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
        # Last: telemetry flows only once everything that handles it and its metrics is up.
        doors: list[Transport] = [grpc, metrics_http]
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
            )
            doors.append(otlp_http)
        inputs = mqtt_input_spec(self.spec)
        if inputs is not None:
            mqtt = MqttInput(inputs, self.spec.system.name, core.pipeline, self.metrics.registry)
            doors.append(mqtt)
        for door in doors:
            await door.start()
            self._transports.append(door)
        self.grpc_port, self.metrics_port = grpc.port, metrics_http.port
        log.info(
            "daemon ready",
            system=self.spec.system.name,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            llm_backend=self._backend.name,
            replica_id=core.runner.replica.replica_id,
            store=store_name(s),
            tls=tls is not None,
            client_certificates=tls is not None and tls.requires_client_certificate,
            access_file=str(s.auth_file) if s.auth_file else None,
        )

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
        the store are released."""
        log.info("daemon draining", drain_seconds=self.settings.drain_seconds)
        for door in self._transports:
            await door.drain()
        for task in self._background:
            task.cancel()
        if self._core is not None:
            await self._core.runner.drain(self.settings.drain_seconds)
        for door in reversed(self._transports):
            await door.stop(RPC_GRACE_SECONDS)
        if self._denials is not None:
            await self._denials.flush()  # refusals the doors saw are chained before the close
        if self._core is not None:
            await self._core.pipeline.drain()
        if self._checkpoints is not None:
            await self._checkpoints.write()  # the head everything above left
        if self._backend is not None:
            await self._backend.aclose()
        if self._store is not None:
            await self._store.close()
        log.info("daemon stopped")

    async def run_until_signalled(self, ready_file: Path | None = None) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        tune_for_daemon(self.settings.gc_young_threshold)
        if ready_file is not None:
            _write_ready_file(ready_file, self.grpc_port, self.metrics_port)
        await stop.wait()
        await self.stop()


def _closed(server: Server) -> float:
    return float(server.closed)


def _is_last_error(faults: Availability, kind: str) -> float:
    return float(faults.last_error_kind == kind)


def _write_ready_file(path: Path, grpc_port: int, metrics_port: int) -> None:
    """Atomically announces the bound ports (useful when they were chosen by the OS)."""
    payload = {
        "pid": os.getpid(),
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "ready_at": datetime.now(UTC).isoformat(),
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)
