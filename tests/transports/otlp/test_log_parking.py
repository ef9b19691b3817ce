"""GenAI log events that wait for their span are parked in the store before their logs export is
answered (poirotd.transports.otlp.log_parking), on both store adapters, over real OTLP doors:
a daemon stopped while they wait finds them when it starts again, places them once their span
comes and stores each message once; a parked row goes with the commit of what it became, or of
its rejection after its wait; the waiting bound counts what was reloaded; a store that cannot
park them refuses the export (retryable) rather than accepting it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import CONVERSATION, SPEC
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from tests.support.daemon import in_process_daemon
from tests.support.disk import fill
from tests.support.otlp_log_runs import LOG_RUNS, recorded_logs
from tests.support.stores import PostgresDb, StoreDb
from tests.support.waiting import eventually

PROTOBUF = {"Content-Type": "application/x-protobuf"}
# The older conventions' run: every GenAI event of it waits when its logs come first.
RUN = "genai_events"


@pytest.fixture
def exports() -> Iterator[tuple[ExportTraceServiceRequest, ExportLogsServiceRequest]]:
    yield recorded_logs(LOG_RUNS[RUN])


def _events(logs: ExportLogsServiceRequest) -> int:
    return sum(
        len(scope.log_records) for resource in logs.resource_logs for scope in resource.scope_logs
    )


@asynccontextmanager
async def _daemon(tmp_path: Path, store_db: StoreDb, **settings: Any) -> AsyncIterator[Daemon]:
    on_postgres = {"db_url": store_db.target} if store_db.name == "postgres" else {}
    async with in_process_daemon(
        tmp_path,
        SPEC.model_copy(update={"rules": ()}),
        ScriptedBackend(schema_answer),
        otlp_http_port=free_port(),
        **on_postgres,
        **settings,
    ) as daemon:
        yield daemon


async def _send_logs(daemon: Daemon, logs: ExportLogsServiceRequest) -> ExportLogsServiceResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        answer: ExportLogsServiceResponse = await logs_service_pb2_grpc.LogsServiceStub(
            channel
        ).Export(logs, timeout=30)
    return answer


async def _send_spans(daemon: Daemon, spans: ExportTraceServiceRequest) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        await trace_service_pb2_grpc.TraceServiceStub(channel).Export(spans, timeout=30)


def _waiting(daemon: Daemon) -> float:
    return daemon.metrics.otlp_waiting_log_records._value.get()  # type: ignore[no-any-return]


def _rejected(daemon: Daemon, reason: str) -> float:
    return daemon.metrics.otlp_rejected_log_records.labels(reason)._value.get()  # type: ignore[no-any-return]


def _parked(store_db: StoreDb) -> int:
    return int(store_db.query("SELECT count(*) FROM parked_log_events")[0][0])


async def _stored(daemon: Daemon) -> list[tuple[Any, ...]]:
    assert daemon._store is not None
    messages = await daemon._store.session_messages("conv-1")
    return [(m.kind, m.sender, m.recipient, m.content) for m in messages]


CONVERSATION_STORED = [
    (kind, sender, recipient, text) for kind, sender, recipient, text, *_ in CONVERSATION
]


async def test_events_waiting_when_the_daemon_stops_are_stored_once_after_it_starts(
    tmp_path: Path,
    store_db: StoreDb,
    exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest],
) -> None:
    """The regression: a logs export answered as accepted while its events waited for their
    span, the daemon stopped (its memory gone), then the spans sent to the daemon started again
    on the same store: every message is stored, once, even when the exporter resends the logs."""
    spans, logs = exports
    async with _daemon(tmp_path, store_db) as daemon:
        answer = await _send_logs(daemon, logs)
        assert answer.partial_success.rejected_log_records == 0
        waited = _waiting(daemon)
        assert waited == _events(logs)
        assert await _stored(daemon) == []
    async with _daemon(tmp_path, store_db) as daemon:
        assert _waiting(daemon) == waited  # reloaded
        await _send_spans(daemon, spans)
        assert await _stored(daemon) == CONVERSATION_STORED
        assert _waiting(daemon) == 0
        # the pharmacist's events (no agent of the spec) rejected once their span came
        assert _rejected(daemon, "unknown_agent") == 2
        # the exporter's retry of the logs export whose answer it lost: stored already (its
        # answer names the pharmacist's events, as any export after their span does)
        retry = await _send_logs(daemon, logs)
        assert retry.partial_success.rejected_log_records == 2
        assert await _stored(daemon) == CONVERSATION_STORED
    assert _parked(store_db) == 0


async def test_a_parked_row_goes_when_its_event_is_placed_or_rejected_after_its_wait(
    tmp_path: Path,
    store_db: StoreDb,
    exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest],
) -> None:
    spans, logs = exports
    async with _daemon(tmp_path, store_db, otlp_log_wait_seconds=0.5) as daemon:
        await _send_logs(daemon, logs)
        assert _parked(store_db) == _events(logs)
        # their span never came: rejected once they waited their time, no export needed
        async with asyncio.timeout(10):  # counted once their release is committed
            await eventually(lambda: _rejected(daemon, "no_span") == _events(logs))
        assert _parked(store_db) == 0
        assert _waiting(daemon) == 0
    async with _daemon(tmp_path, store_db) as daemon:
        await _send_logs(daemon, logs)  # sent again: they wait anew, their span comes
        assert _parked(store_db) == _events(logs)
        await _send_spans(daemon, spans)
        assert await _stored(daemon) == CONVERSATION_STORED
        assert _parked(store_db) == 0


async def test_reloaded_events_count_against_the_waiting_bound(
    tmp_path: Path,
    store_db: StoreDb,
    exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest],
) -> None:
    """POIROTD_OTLP_LOG_WAIT_RECORDS bounds the parked rows too: after a restart, a logs export
    whose events would pass it with the reloaded ones is throttled."""
    spans, logs = exports
    bound = {"otlp_log_wait_records": _events(logs) + 1}
    async with _daemon(tmp_path, store_db, **bound) as daemon:
        await _send_logs(daemon, logs)
    async with _daemon(tmp_path, store_db, **bound) as daemon:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _send_logs(daemon, logs)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _parked(store_db) == _events(logs)
        await _send_spans(daemon, spans)
        assert await _stored(daemon) == CONVERSATION_STORED


async def test_a_store_that_cannot_park_the_events_refuses_the_export(
    small_disk: Path, exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest]
) -> None:
    """A full disk: the export is refused as retryable (UNAVAILABLE, 503 with Retry-After),
    never answered as accepted; once there is room, the exporter's retry is parked."""
    spans, logs = exports
    async with in_process_daemon(
        small_disk, SPEC, ScriptedBackend(schema_answer), otlp_http_port=free_port()
    ) as daemon:
        filler = fill(small_disk)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _send_logs(daemon, logs)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        url = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/logs"
        async with httpx.AsyncClient(timeout=30) as client:
            answer = await client.post(url, content=logs.SerializeToString(), headers=PROTOBUF)
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
        filler.unlink()
        await _send_logs(daemon, logs)
        await _send_spans(daemon, spans)
        assert await _stored(daemon) == CONVERSATION_STORED


async def test_over_a_shared_store_each_replica_reloads_its_own_parked_events(
    tmp_path: Path,
    postgres_url: str,
    exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest],
) -> None:
    """Replicas over one PostgreSQL park under their replica id: another replica starting
    leaves a stopped one's events alone; the stopped one, started again under its id, places
    them once their span comes."""
    spans, logs = exports
    store_db = PostgresDb(postgres_url)
    for replica in ("a", "b"):
        (tmp_path / replica).mkdir()
    async with _daemon(tmp_path / "a", store_db, replica_id="a") as daemon:
        await _send_logs(daemon, logs)
    async with _daemon(tmp_path / "b", store_db, replica_id="b") as daemon:
        assert _waiting(daemon) == 0
    assert store_db.query("SELECT DISTINCT owner FROM parked_log_events") == [("a",)]
    async with _daemon(tmp_path / "a", store_db, replica_id="a") as daemon:
        assert _waiting(daemon) == _events(logs)
        await _send_spans(daemon, spans)
        assert await _stored(daemon) == CONVERSATION_STORED
    assert _parked(store_db) == 0


async def test_a_replica_gone_leaves_its_parked_events_to_a_live_one(
    tmp_path: Path,
    postgres_url: str,
    exports: tuple[ExportTraceServiceRequest, ExportLogsServiceRequest],
) -> None:
    """A replica that never starts again under its id (a pod replaced under a new name): once
    its rows are held for twice the wait, a live replica takes them over and places them with
    the spans the exporter sent it."""
    spans, logs = exports
    store_db = PostgresDb(postgres_url)
    for replica in ("gone", "live"):
        (tmp_path / replica).mkdir()
    async with _daemon(tmp_path / "gone", store_db, replica_id="gone") as daemon:
        await _send_logs(daemon, logs)
    live = {"replica_id": "live", "otlp_log_wait_seconds": 0.5}
    async with _daemon(tmp_path / "live", store_db, **live) as daemon:
        await _send_spans(daemon, spans)
        async with asyncio.timeout(10):
            await eventually(lambda: _parked(store_db) == 0 and _waiting(daemon) == 0)
        taken = daemon.metrics.otlp_taken_over_log_records._value.get()
        assert taken == _events(logs)
        assert sorted(await _stored(daemon)) == sorted(CONVERSATION_STORED)
