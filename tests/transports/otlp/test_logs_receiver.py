"""The OTLP logs transports of a real in-process daemon (gRPC LogsService, HTTP /v1/logs): the
recorded runs whose content travels as GenAI log events (tests/support/otlp_log_runs.py) are
stored as one session, in order, whichever of logs and spans comes first; a resent logs export is
stored once; the log records that cannot be placed are reported in partial_success and counted;
bad bodies are refused as on /v1/traces."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

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
from poirotd.model import MessageKind
from tests.support.daemon import in_process_daemon
from tests.support.otlp_log_runs import LOG_RUNS, otlp_logs_json, recorded_logs

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
# The pharmacist's log records (the spec knows no such agent), by convention.
PHARMACIST_RECORDS = {"genai": 1, "genai_events": 2}


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[Daemon]:
    async with in_process_daemon(
        tmp_path, SPEC, ScriptedBackend(schema_answer), otlp_http_port=free_port()
    ) as d:
        yield d


def _base(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.settings.otlp_http_port}"


async def _send_logs(
    daemon: Daemon, transport: str, logs: ExportLogsServiceRequest
) -> ExportLogsServiceResponse:
    if transport == "grpc":
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
            answer: ExportLogsServiceResponse = await logs_service_pb2_grpc.LogsServiceStub(
                channel
            ).Export(logs)
            return answer
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{_base(daemon)}/v1/logs", content=otlp_logs_json(logs), headers=JSON
        )
    assert response.status_code == 200, response.text
    parsed = ExportLogsServiceResponse()
    if response.content:
        from google.protobuf import json_format

        json_format.Parse(response.content, parsed)
    return parsed


async def _send_spans(daemon: Daemon, transport: str, spans: ExportTraceServiceRequest) -> None:
    if transport == "grpc":
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
            await trace_service_pb2_grpc.TraceServiceStub(channel).Export(spans)
        return
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{_base(daemon)}/v1/traces", content=spans.SerializeToString(), headers=PROTOBUF
        )
    assert response.status_code == 200, response.text


def _rejected_logs(daemon: Daemon, reason: str) -> float:
    return daemon.metrics.otlp_rejected_log_records.labels(reason)._value.get()  # type: ignore[no-any-return]


@pytest.mark.parametrize("order", ["logs_first", "spans_first"])
@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("name", sorted(LOG_RUNS))
async def test_log_events_and_their_spans_are_one_session_in_either_order(
    daemon: Daemon, name: str, transport: str, order: str
) -> None:
    spans, logs = recorded_logs(LOG_RUNS[name])
    if order == "logs_first":
        answer = await _send_logs(daemon, transport, logs)
        # the pharmacist's records wait for their span: nothing is known against them yet
        assert answer.partial_success.rejected_log_records == 0
        assert daemon.metrics.otlp_waiting_log_records._value.get() > 0
        await _send_spans(daemon, transport, spans)
    else:
        await _send_spans(daemon, transport, spans)
        answer = await _send_logs(daemon, transport, logs)
        assert answer.partial_success.rejected_log_records == PHARMACIST_RECORDS[name]
        assert "unknown_agent" in answer.partial_success.error_message
    store = daemon._store
    assert store is not None
    messages = await store.session_messages("conv-1")
    if order == "spans_first":
        # Numbered as they come: the tool's result, on its span, before the model calls'
        # messages that came later in their log events; each at the time it was sent.
        assert messages[0].kind is MessageKind.TOOL
        messages = sorted(messages, key=lambda m: (m.sent_at, m.index))
    assert [(m.kind, m.sender, m.recipient, m.content) for m in messages] == [
        (kind, sender, recipient, content) for kind, sender, recipient, content, *_ in CONVERSATION
    ]
    assert sorted(m.index for m in messages) == list(range(len(CONVERSATION)))
    assert messages[2].tool_calls == ('gait_test({"side":"left"})',)
    assert _rejected_logs(daemon, "unknown_agent") == PHARMACIST_RECORDS[name]
    assert daemon.metrics.otlp_waiting_log_records._value.get() == 0
    assert daemon.metrics.otlp_log_records.labels(transport)._value.get() == sum(
        len(scope.log_records) for resource in logs.resource_logs for scope in resource.scope_logs
    )


async def test_a_logs_export_resent_is_stored_once(daemon: Daemon) -> None:
    """The exporter's retry of an export whose answer it lost: nothing is stored twice."""
    spans, logs = recorded_logs(LOG_RUNS["genai_events"])
    await _send_spans(daemon, "grpc", spans)
    for _ in range(2):
        await _send_logs(daemon, "grpc", logs)
    store = daemon._store
    assert store is not None
    assert len(await store.session_messages("conv-1")) == len(CONVERSATION)


async def test_bad_logs_bodies_are_refused_with_a_status_that_says_why(daemon: Daemon) -> None:
    good = recorded_logs(LOG_RUNS["genai"])[1].SerializeToString()
    cases = [
        (good[: len(good) // 2], PROTOBUF, 400, "not an ExportLogsServiceRequest"),
        (good, {"Content-Type": "text/plain"}, 415, "is not application"),
        (b'{"resourceLogs": 7}', JSON, 400, "not an OTLP/JSON ExportLogsServiceRequest"),
        (
            b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"spanId": "zz"}]}]}]}',
            JSON,
            400,
            "'zz' is not hex",
        ),
    ]
    async with httpx.AsyncClient() as client:
        for body, headers, status, says in cases:
            answer = await client.post(f"{_base(daemon)}/v1/logs", content=body, headers=headers)
            assert answer.status_code == status, answer.text
            assert says in answer.json()["message"] if status == 415 or headers == JSON else True
        answer = await client.post(f"{_base(daemon)}/v1/logs", content=good, headers=PROTOBUF)
        assert answer.status_code == 200


async def test_events_beyond_the_waiting_bound_are_throttled_and_nothing_is_kept(
    tmp_path: Path,
) -> None:
    """More GenAI events than POIROTD_OTLP_LOG_WAIT_RECORDS may wait: the export is refused
    whole with a retry delay (the exporter resends it), and nothing of it waits."""
    spans, logs = recorded_logs(LOG_RUNS["genai_events"])
    async with in_process_daemon(
        tmp_path,
        SPEC,
        ScriptedBackend(schema_answer),
        otlp_http_port=free_port(),
        otlp_log_wait_records=4,
    ) as daemon:
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{_base(daemon)}/v1/logs", content=logs.SerializeToString(), headers=PROTOBUF
            )
        assert answer.status_code == 429 and answer.headers["Retry-After"] == "1"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await logs_service_pb2_grpc.LogsServiceStub(channel).Export(logs)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert daemon.metrics.otlp_waiting_log_records._value.get() == 0
        # Once the spans are known, the same export's events are placed at once, not held.
        await _send_spans(daemon, "grpc", spans)
        answer_after = await _send_logs(daemon, "grpc", logs)
        assert (
            answer_after.partial_success.rejected_log_records == PHARMACIST_RECORDS["genai_events"]
        )
