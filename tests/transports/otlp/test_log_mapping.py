"""Golden tests of OTLP log events joined to their spans, on exports recorded from the real
OpenTelemetry SDK (tests/support/otlp_log_runs.py): the runs of test_mapping with their content
moved from the spans to GenAI log events, in the older conventions (one event per message) and
the current one (gen_ai.client.inference.operation.details), each read as protobuf and as
OTLP/JSON, the logs exported before their spans or after them. The same conversation comes out
as from the spans' own content, each message once."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from poirotd.devtools.otlp_runs import CONVERSATION, DIAGNOSIS, PLAN, SPEC, TRACE, conversation
from poirotd.model import MessageKind
from poirotd.transports.otlp.http import JSON, PROTOBUF, _decode
from poirotd.transports.otlp.log_join import LogJoin
from poirotd.transports.otlp.log_parking import LogParking
from poirotd.transports.otlp.log_records import read_logs
from poirotd.transports.otlp.mapping import MappedMessage, Rejection, map_spans, read_spans
from tests.support.otlp_log_runs import LOG_RUNS, recorded_logs
from tests.support.otlp_runs import DATA

AGENTS = SPEC.agents_by_alias()
# The span each message of CONVERSATION comes from: the model calls' log events, and the tool's
# result from its own span (the second model call's input repeats it: stored once).
SPANS = [3, 3, 3, 4, 5, 8, 8]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _join(clock: Clock | None = None, wall_clock: Clock | None = None) -> LogJoin:
    return LogJoin(
        AGENTS,
        "conversation",
        max_spans=1000,
        max_waiting=1000,
        wait_seconds=60,
        clock=clock or Clock(),
        wall_clock=wall_clock or Clock(),
    )


def _spans(name: str) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString((DATA / f"{name}_logs.spans.pb").read_bytes())


def _logs(name: str, encoding: str) -> ExportLogsServiceRequest:
    if encoding == "protobuf":
        body, content_type = (DATA / f"{name}_logs.pb").read_bytes(), PROTOBUF
    else:
        body, content_type = (DATA / f"{name}_logs.json").read_bytes(), JSON
    return _decode(ExportLogsServiceRequest, body, content_type, "identity", 1 << 20)


def _received(
    join: LogJoin, spans: ExportTraceServiceRequest, logs: ExportLogsServiceRequest, order: str
) -> tuple[list[MappedMessage], list[Rejection], list[Rejection]]:
    """What the receiver stores of the two exports in `order`: (messages in the order they are
    numbered, spans rejected, log records rejected)."""
    stored: list[MappedMessage] = []
    span_rejections: list[Rejection] = []
    log_rejections: list[Rejection] = []

    def traces() -> None:
        read = read_spans(spans)
        joined = join.spans_in(read, map_spans(read, AGENTS, session_by="conversation"))
        stored.extend(joined.messages)
        span_rejections.extend(joined.rejections)
        log_rejections.extend(joined.placed.rejections)

    def log_records() -> None:
        read = read_logs(logs)
        placed = join.logs_in(read)
        stored.extend(placed.messages)
        log_rejections.extend([*read.rejections, *placed.rejections])

    for step in (log_records, traces) if order == "logs_first" else (traces, log_records):
        step()
    return stored, span_rejections, log_rejections


def _conversation(messages: list[MappedMessage]) -> list[tuple[Any, ...]]:
    """In the order a session would number them: time, then span, then place in the span."""
    return conversation(sorted(messages, key=lambda m: (m.at_ns, m.span_id, m.position)))


@pytest.mark.parametrize("order", ["logs_first", "spans_first"])
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("name", sorted(LOG_RUNS))
def test_log_events_of_each_convention_map_to_the_same_conversation(
    name: str, encoding: str, order: str
) -> None:
    messages, span_rejections, log_rejections = _received(
        _join(), _spans(name), _logs(name, encoding), order
    )
    assert _conversation(messages) == CONVERSATION
    assert {m.session_id for m in messages} == {"conv-1"}
    ordered = sorted(messages, key=lambda m: (m.at_ns, m.span_id, m.position))
    assert [(m.trace_id, int(m.span_id, 16)) for m in ordered] == [(TRACE, s) for s in SPANS]
    # The tool's result from its span, the agents' messages from their log events.
    assert [m.logged_seq is not None for m in ordered] == [True] * 3 + [False] + [True] * 3
    # The model call with content capture off sends no events: its span is rejected. A model
    # call exported before its events is too (nothing says yet that they will come).
    spoken_for = [] if order == "logs_first" else [3, 5, 8, 10]
    assert sorted((int(r.span_id, 16), r.reason) for r in span_rejections) == sorted(
        (span, "no_content") for span in [6, *spoken_for]
    )
    # The pharmacist's events name an agent the spec does not know.
    assert {(int(r.span_id, 16), r.reason) for r in log_rejections} == {(10, "unknown_agent")}


def test_the_recorded_log_exports_are_what_the_recording_script_writes() -> None:
    for name, run in LOG_RUNS.items():
        spans, logs = recorded_logs(run)
        assert spans.SerializeToString() == (DATA / f"{name}_logs.spans.pb").read_bytes()
        assert logs.SerializeToString() == (DATA / f"{name}_logs.pb").read_bytes()


def test_events_wait_for_the_agent_span_above_their_model_call() -> None:
    """The batch processor exports a model call before the agent's span above it ends: its
    events wait (neither placed under no agent nor rejected) until that span comes."""
    spans, logs = _spans("genai"), _logs("genai", "protobuf")
    join = _join()
    placed = join.logs_in(read_logs(logs))
    assert not placed.messages and not placed.rejections
    below = read_spans(_spans_named(spans, lambda name: not name.startswith("invoke_")))
    first = join.spans_in(below, map_spans(below, AGENTS, session_by="conversation"))
    assert not first.messages and not first.placed.rejections
    above = read_spans(_spans_named(spans, lambda name: name.startswith("invoke_")))
    then = join.spans_in(above, map_spans(above, AGENTS, session_by="conversation"))
    # The tool's span, exported without the agent's, is rejected by the trace mapping (it
    # reads one export's tree); its result reaches the doctor from the next call's events.
    assert [(int(r.span_id, 16), r.reason) for r in first.rejections] == [
        (6, "no_content"),
        (4, "unknown_agent"),
    ]
    assert [c[:5] for c in _conversation(then.messages)] == [c[:5] for c in CONVERSATION]
    assert {r.reason for r in then.placed.rejections} == {"unknown_agent"}


def test_a_message_a_span_and_its_events_both_carry_is_stored_once() -> None:
    """An instrumentation sending content both ways (span_and_event): the spans' messages are
    stored, their events add nothing, in either order."""
    with_content = ExportTraceServiceRequest.FromString((DATA / "genai.pb").read_bytes())
    for order in ("logs_first", "spans_first"):
        messages, _, log_rejections = _received(
            _join(), with_content, _logs("genai", "protobuf"), order
        )
        assert _conversation(messages) == CONVERSATION
        assert all(m.logged_seq is None for m in messages)
        assert {r.reason for r in log_rejections} == {"unknown_agent"}


def test_events_resent_or_split_over_exports_are_stored_once_with_the_same_keys() -> None:
    """An exporter's retry of a logs export stores nothing more, and a model call's events
    exported in two parts (its input, then its answer) give the keys they give together."""
    spans, logs = _spans("genai_events"), _logs("genai_events", "protobuf")
    whole, _, _ = _received(_join(), spans, logs, "spans_first")
    join = _join()
    read = read_spans(spans)
    join.spans_in(read, map_spans(read, AGENTS, session_by="conversation"))
    parts = [_records(logs, lambda r: r.event_name != "gen_ai.choice"), _records(logs, None)]
    split = [m for part in parts for m in join.logs_in(read_logs(part)).messages]
    assert {m.key() for m in split} == {m.key() for m in whole if m.logged_seq is not None}
    assert not join.logs_in(read_logs(logs)).messages
    assert [m.content for m in split if m.kind is MessageKind.AGENT][-2:] == [DIAGNOSIS, PLAN]


def test_events_whose_span_never_comes_are_rejected_once_they_waited_their_time() -> None:
    clock = Clock()
    join = _join(clock)
    read = read_logs(_logs("genai", "protobuf"))
    assert not join.logs_in(read).rejections
    assert join.waiting_records == read.records
    clock.now = 59.0
    assert not join.place([]).rejections
    clock.now = 60.0
    placed = join.place([])
    assert [r.reason for r in placed.rejections] == ["no_span"] * read.records
    assert join.waiting_records == 0


def test_parked_events_reloaded_wait_what_is_left_of_their_wait_and_are_placed_alike() -> None:
    """A join started again reloads what the one before parked (as the store reads it back:
    JSON, in arrival order): each span's events wait from their arrival on the wall clock (the
    monotonic clock of the new process starts elsewhere), and once their spans come they say
    what they would have said to the join that received them."""
    spans, logs = _spans("genai_events"), _logs("genai_events", "protobuf")
    parking = LogParking("")
    wall = Clock()
    wall.now = 1_000.0
    placed = _join(wall_clock=wall).logs_in(read_logs(logs))
    assert not placed.messages and not placed.taken
    rows = parking.park(placed.waiting).park
    assert len(rows) == read_logs(logs).records
    assert {row.arrived_us for row in rows} == {1_000_000_000}

    def reloaded(monotonic: float, wall_now: float) -> tuple[LogJoin, Clock]:
        clock, wall_then = Clock(), Clock()
        clock.now, wall_then.now = monotonic, wall_now
        join = _join(clock, wall_then)
        join.reload(parking.reloaded(rows))
        return join, clock

    join, clock = reloaded(5_000.0, 1_050.0)  # stopped for 50 s of the 60 they may wait
    assert join.waiting_records == len(rows)
    clock.now = 5_009.0
    assert not join.place([]).rejections
    clock.now = 5_010.0
    assert [r.reason for r in join.place([]).rejections] == ["no_span"] * len(rows)
    join, _ = reloaded(0.0, 1_001.0)
    read = read_spans(spans)
    joined = join.spans_in(read, map_spans(read, AGENTS, session_by="conversation"))
    whole, _, _ = _received(_join(), spans, logs, "logs_first")
    assert [m.key() for m in joined.messages] == [m.key() for m in whole]
    assert join.waiting_records == 0


def test_a_resent_logs_export_waits_once_and_is_parked_as_the_same_events() -> None:
    join, parking = _join(), LogParking("")
    read = read_logs(_logs("genai", "protobuf"))
    first = parking.park(join.logs_in(read).waiting)
    again = parking.park(join.logs_in(read).waiting)
    assert join.waiting_records == read.records
    assert [row.event_id for row in again.park] == [row.event_id for row in first.park]
    assert len({row.event_id for row in first.park}) == read.records


def test_events_taken_for_a_commit_that_failed_wait_again_since_they_first_did() -> None:
    """Their rejection after their wait, refused with its commit, is made again (and counted)
    with the next commit; the rows it releases are theirs."""
    clock = Clock()
    join = _join(clock)
    read = read_logs(_logs("genai", "protobuf"))
    parked = LogParking("").park(join.logs_in(read).waiting)
    clock.now = 60.0
    rejected = join.place([])
    released = LogParking("").release(rejected.taken_events())
    assert sorted(e for _, e in released.release) == sorted(r.event_id for r in parked.park)
    join.wait_again(rejected.taken)
    assert join.waiting_records == read.records
    assert len(join.place([]).rejections) == read.records


def test_a_record_outside_any_span_is_rejected_and_other_logs_are_passed_over() -> None:
    def record(name: str, span_id: bytes) -> LogRecord:
        content = AnyValue(string_value='{"content": "hi"}')
        return LogRecord(event_name=name, trace_id=b"\x01" * 16, span_id=span_id, body=content)

    other = LogRecord(
        body=AnyValue(string_value="GET /health 200"),
        attributes=[KeyValue(key="event.name", value=AnyValue(string_value="http.access"))],
    )
    export = ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                scope_logs=[
                    ScopeLogs(
                        log_records=[
                            record("gen_ai.user.message", b""),
                            record("gen_ai.user.message", b"\x02" * 8),
                            LogRecord(
                                trace_id=b"\x01" * 16,
                                span_id=b"\x02" * 8,
                                body=AnyValue(string_value="[1]"),
                                attributes=[
                                    KeyValue(
                                        key="event.name",
                                        value=AnyValue(string_value="gen_ai.choice"),
                                    )
                                ],
                            ),
                            other,
                        ]
                    )
                ]
            )
        ]
    )
    read = read_logs(export)
    assert read.records == 4
    assert [r.reason for r in read.rejections] == ["no_span", "malformed"]
    assert [(key, [e.name for e in events]) for key, events in read.events.items()] == [
        (("01" * 16, "02" * 8), ["gen_ai.user.message"])
    ]


def _spans_named(export: ExportTraceServiceRequest, keep: Any) -> ExportTraceServiceRequest:
    part = ExportTraceServiceRequest()
    part.CopyFrom(export)
    for resource_spans in part.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            kept = [span for span in scope_spans.spans if keep(span.name)]
            del scope_spans.spans[:]
            scope_spans.spans.extend(kept)
    return part


def _records(export: ExportLogsServiceRequest, keep: Any) -> ExportLogsServiceRequest:
    """The export with the records `keep` accepts; None: those the other part left."""
    part = ExportLogsServiceRequest()
    part.CopyFrom(export)
    for resource_logs in part.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            kept = [
                r
                for r in scope_logs.log_records
                if (keep(r) if keep else r.event_name == "gen_ai.choice")
            ]
            del scope_logs.log_records[:]
            scope_logs.log_records.extend(kept)
    return part
