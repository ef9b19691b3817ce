"""The runs of otlp_runs as an instrumentation in its default mode sends them: spans without
content, the messages as GenAI log events in their span's context, emitted through the real
OpenTelemetry SDK's logs pipeline and encoded by its OTLP encoder. The older conventions' span
events become per-message events (gen_ai.user.message, gen_ai.choice, ...) with the body as a
map, as opentelemetry-instrumentation-openai-v2 emits them; the current conventions' message
attributes become one `gen_ai.client.inference.operation.details` event at the span's end, the
messages as structured attributes, as opentelemetry-util-genai emits it.

`record` writes each as a pair into tests/data/otlp (`python -m tests.support.otlp_log_runs`):
`<name>_logs.spans.pb` (the spans) and `<name>_logs.pb` / `.json` (the logs export).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, set_span_in_context

from poirotd.devtools.otlp_runs import (
    RECORDED_AT_NS,
    CountingIds,
    Run,
    _base64_to_hex,
    genai_events_run,
    genai_run,
    provider,
)
from tests.support.otlp_runs import DATA

DETAILS = "gen_ai.client.inference.operation.details"
CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
LOG_RUNS: dict[str, Run] = {"genai": genai_run, "genai_events": genai_events_run}


def recorded_logs(
    run: Run, t0: int = RECORDED_AT_NS
) -> tuple[ExportTraceServiceRequest, ExportLogsServiceRequest]:
    """The run's spans (ids 1, 2, 3...) without content, and its log records."""
    memory = InMemorySpanExporter()
    traced = provider(SimpleSpanProcessor(memory), CountingIds())
    run(traced.get_tracer("clinic"), t0, "conv-1")
    traced.shutdown()
    spans = memory.get_finished_spans()
    logs = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
    logged = LoggerProvider(resource=Resource({"service.name": "clinic-agents"}))
    logged.add_log_record_processor(SimpleLogRecordProcessor(logs))
    logger = logged.get_logger("clinic")
    for span in sorted(spans, key=lambda span: span.start_time or 0):
        for record in _records(span):
            logger.emit(record)
    logged.shutdown()
    return _without_content(encode_spans(spans)), encode_logs(logs.get_finished_logs())


def _records(span: ReadableSpan) -> list[LogRecord]:
    """The span's messages as log events emitted in its context."""
    span_context = span.get_span_context()
    assert span_context is not None
    context = set_span_in_context(NonRecordingSpan(span_context))
    records = []
    for event in span.events:
        attributes: dict[str, Any] = dict(event.attributes or {})
        content = attributes.get("gen_ai.event.content")
        body = json.loads(content) if isinstance(content, str) else attributes
        at = event.timestamp
        records.append(
            LogRecord(
                timestamp=at,
                observed_timestamp=at,
                context=context,
                event_name=event.name,
                body=body,
            )
        )
    spanned = span.attributes or {}
    messages = {k: json.loads(str(spanned[k])) for k in CONTENT_KEYS if k in spanned}
    if messages:
        operation = spanned.get("gen_ai.operation.name", "chat")
        records.append(
            LogRecord(
                timestamp=span.end_time,
                observed_timestamp=span.end_time,
                context=context,
                event_name=DETAILS,
                attributes={"gen_ai.operation.name": operation, **messages},
            )
        )
    return records


def _without_content(export: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    for resource_spans in export.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                del span.events[:]
                kept = [kv for kv in span.attributes if kv.key not in CONTENT_KEYS]
                del span.attributes[:]
                span.attributes.extend(kept)
    return export


def otlp_logs_json(export: ExportLogsServiceRequest) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping, but trace and span ids in hex."""
    document: dict[str, Any] = json_format.MessageToDict(export)
    for resource_logs in document.get("resourceLogs", []):
        for scope_logs in resource_logs.get("scopeLogs", []):
            for record in scope_logs.get("logRecords", []):
                for name in ("traceId", "spanId"):
                    if name in record:
                        record[name] = _base64_to_hex(record[name])
    return json.dumps(document, indent=1).encode()


def record() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for name, run in LOG_RUNS.items():
        spans, logs = recorded_logs(run)
        (DATA / f"{name}_logs.spans.pb").write_bytes(spans.SerializeToString())
        (DATA / f"{name}_logs.pb").write_bytes(logs.SerializeToString())
        (DATA / f"{name}_logs.json").write_bytes(otlp_logs_json(logs))


if __name__ == "__main__":
    record()
