"""OTLP log records to the GenAI events they carry, by the span they belong to. Pure (no I/O);
the log join (`joins`) places them in their span's tree, `mapping.map_logged` reads them.

A record is a GenAI event when its name (the LogRecord's `event_name`, or its `event.name`
attribute as older SDKs write it) is one of `mapping.LOG_EVENTS`; other records (an
application's own logs) are not the daemon's business and are passed over. An event's body is
its LogRecord body (a map, or a JSON object as a string); the details event's messages are its
attributes. An event without a trace and span id, or whose body is not an object, is rejected
with a reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from poirotd.transports.otlp.mapping import (
    DETAILS_EVENT,
    LOG_EVENTS,
    LoggedEvent,
    Rejection,
    any_value,
    attributes,
)

# Why a log record was not stored: bounded, the label of poirot_otlp_rejected_log_records_total
# (with the pipeline's own refusal reasons).
LOG_REJECT_REASONS = ("no_span", "unknown_agent", "no_content", "malformed")

SpanKey = tuple[str, str]  # (trace id, span id), hex


@dataclass(frozen=True)
class ReadLogs:
    # The GenAI events of each span, in the export's order.
    events: dict[SpanKey, list[LoggedEvent]]
    rejections: tuple[Rejection, ...]
    records: int


def read_logs(request: ExportLogsServiceRequest) -> ReadLogs:
    events: dict[SpanKey, list[LoggedEvent]] = {}
    rejections: list[Rejection] = []
    records = 0
    for record in _records(request):
        records += 1
        attrs = attributes(record.attributes)
        name = record.event_name or attrs.get("event.name")
        if name not in LOG_EVENTS:
            continue
        trace_id, span_id = record.trace_id.hex(), record.span_id.hex()
        if len(trace_id) != 32 or len(span_id) != 16 or not span_id.strip("0"):
            detail = f"event {name} names no span (emitted outside a model call's span?)"
            rejections.append(Rejection(trace_id, span_id, "no_span", detail))
            continue
        body = attrs if name == DETAILS_EVENT else _body(record)
        if body is None:
            detail = f"event {name}: the body is not an object"
            rejections.append(Rejection(trace_id, span_id, "malformed", detail))
            continue
        at_ns = record.time_unix_nano or record.observed_time_unix_nano
        events.setdefault((trace_id, span_id), []).append(LoggedEvent(str(name), body, at_ns))
    return ReadLogs(events, tuple(rejections), records)


def _records(request: ExportLogsServiceRequest) -> Iterator[LogRecord]:
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            yield from scope_logs.log_records


def _body(record: LogRecord) -> dict[str, Any] | None:
    """The event's body as an object ({} for none: content capture off); None if it is not."""
    body = any_value(record.body)
    if body is None:
        return {}
    if isinstance(body, str):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    return body if isinstance(body, dict) else None
