"""One small multi-agent run (a doctor calls a gait test, then a chief decides), traced with the
real OpenTelemetry SDK in each convention the OTLP receiver reads: OTel GenAI's current
attributes, its older per-message span events, and OpenInference (LangGraph-style). Each run
also has two spans the receiver must reject: a model call of an agent the spec does not know,
and one whose content capture was off.

The tests and the OTLP benchmarks send the runs through the SDK's own OTLP exporters or encode
them once as exports (`recorded_export`: the same bytes on every run, the golden tests' inputs in
tests/data/otlp). Needs the dev extra (opentelemetry-sdk).
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, Tracer

from poirotd.config import SystemSpec
from poirotd.model import MessageKind
from poirotd.transports.otlp.mapping import MappedMessage

MS = 1_000_000
# 2026-01-01T00:00:00Z: the recorded runs' clock.
RECORDED_AT_NS = 1_767_225_600 * 1_000_000_000

SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "clinic", "description": "Agents plan therapy on an exoskeleton."},
        "agents": [
            {
                "id": "doctor",
                "name": "Doctor",
                "system_prompt": "You diagnose.",
                "aliases": ["Doctor Agent"],
            },
            {"id": "chief", "name": "Chief", "system_prompt": "You choose the plan."},
        ],
        "rules": [
            {
                "kind": "message_pattern",
                "name": "sensor_fault_reported",
                "severity": "critical",
                "pattern": "SENSOR FAULT",
                "message_kind": "tool",
            }
        ],
        "protocol": {"max_invocations": 1},
    }
)

TASK = "Assess the gait of patient 7."
DOCTOR_SYSTEM = "You diagnose."
CHIEF_SYSTEM = "You choose the plan."
RESULT = "ankle_left_deg offset 15 deg: SENSOR FAULT"
DIAGNOSIS = "The offset is noise; proceed."
HANDOFF = "Chief, decide the plan."
PLAN = "Plan: continue at full assistance."
ARGUMENTS = {"side": "left"}
# The trace id of the hand-built exports, and the conversation every recorded run holds:
# (kind, sender, recipient, content, tool_calls, tool_name, ms after the run's start).
TRACE = f"{0x7ACE:032x}"
CONVERSATION = [
    (MessageKind.SYSTEM, "system", "doctor", DOCTOR_SYSTEM, (), "", 2),
    (MessageKind.HUMAN, "user", "doctor", TASK, (), "", 2),
    (MessageKind.AGENT, "doctor", "", "", ('gait_test({"side":"left"})',), "", 10),
    (MessageKind.TOOL, "tool:gait_test", "doctor", RESULT, (), "gait_test", 20),
    (MessageKind.AGENT, "doctor", "", DIAGNOSIS, (), "", 30),
    (MessageKind.HUMAN, "user", "chief", HANDOFF, (), "", 52),
    (MessageKind.AGENT, "chief", "", PLAN, (), "", 60),
]


def conversation(messages: Iterable[MappedMessage]) -> list[tuple[Any, ...]]:
    """`messages` as CONVERSATION writes them, ms counted from the recorded runs' start."""
    return [
        (
            m.kind,
            m.sender,
            m.recipient,
            m.content,
            m.tool_calls,
            m.tool_name,
            (m.at_ns - RECORDED_AT_NS) // MS,
        )
        for m in messages
    ]


class CountingIds(IdGenerator):
    """Ids 1, 2, 3...: the recorded exports are the same on every run."""

    def __init__(self) -> None:
        self._next = 0

    def generate_span_id(self) -> int:
        self._next += 1
        return self._next

    def generate_trace_id(self) -> int:
        return 0x7ACE


def provider(processor: SpanProcessor, ids: IdGenerator | None = None) -> TracerProvider:
    traced = TracerProvider(resource=Resource({"service.name": "clinic-agents"}), id_generator=ids)
    traced.add_span_processor(processor)
    return traced


@contextlib.contextmanager
def _span(
    tracer: Tracer, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]
) -> Iterator[Span]:
    with tracer.start_as_current_span(
        name, start_time=start_ns, attributes=attributes, end_on_exit=False
    ) as span:
        yield span
        span.end(end_time=end_ns)


def _leaf(
    tracer: Tracer,
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any],
    events: tuple[tuple[str, int, dict[str, Any], bool], ...] = (),
) -> None:
    """A span without children, with the older conventions' message events: (name, time,
    body, whether the body is `gen_ai.event.content` JSON or the event's own attributes)."""
    span = tracer.start_span(name, start_time=start_ns, attributes=attributes)
    for event, at_ns, body, as_json in events:
        if as_json:
            span.add_event(event, {"gen_ai.event.content": json.dumps(body)}, timestamp=at_ns)
        else:
            fields = {k: v for k, v in body.items() if isinstance(v, str)}
            span.add_event(event, fields, timestamp=at_ns)
    span.end(end_time=end_ns)


def _parts(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "content": text}]


_CALL = {"type": "tool_call", "id": "call_1", "name": "gait_test", "arguments": ARGUMENTS}
_RESPONSE = {"type": "tool_call_response", "id": "call_1", "response": RESULT}


def genai_run(tracer: Tracer, t0: int, conversation: str = "conv-1") -> None:
    """OTel GenAI conventions, current: messages as gen_ai.*.messages JSON attributes."""
    conv = {"gen_ai.conversation.id": conversation}
    task = {"role": "user", "parts": _parts(TASK)}
    called = {"role": "assistant", "parts": [_CALL]}
    with _span(
        tracer,
        "invoke_workflow clinic",
        t0,
        t0 + 100 * MS,
        {
            "gen_ai.operation.name": "invoke_workflow",
            **conv,
        },
    ):
        answer = [{"role": "assistant", "parts": _parts(DIAGNOSIS), "finish_reason": "stop"}]
        with _span(
            tracer,
            "invoke_agent Doctor Agent",
            t0 + 1 * MS,
            t0 + 50 * MS,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "Doctor Agent",
                "gen_ai.output.messages": json.dumps(answer),
                **conv,
            },
        ):
            _leaf(
                tracer,
                "chat small-model",
                t0 + 2 * MS,
                t0 + 10 * MS,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system_instructions": json.dumps(_parts(DOCTOR_SYSTEM)),
                    "gen_ai.input.messages": json.dumps([task]),
                    "gen_ai.output.messages": json.dumps(
                        [{**called, "finish_reason": "tool_call"}]
                    ),
                },
            )
            _leaf(
                tracer,
                "execute_tool gait_test",
                t0 + 11 * MS,
                t0 + 20 * MS,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "gait_test",
                    "gen_ai.tool.call.id": "call_1",
                    "gen_ai.tool.call.arguments": json.dumps(ARGUMENTS),
                    "gen_ai.tool.call.result": RESULT,
                },
            )
            _leaf(
                tracer,
                "chat small-model",
                t0 + 21 * MS,
                t0 + 30 * MS,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system_instructions": json.dumps(_parts(DOCTOR_SYSTEM)),
                    "gen_ai.input.messages": json.dumps(
                        [task, called, {"role": "tool", "parts": [_RESPONSE]}]
                    ),
                    "gen_ai.output.messages": json.dumps(answer),
                },
            )
            # content capture off: an operation name and nothing else
            _leaf(
                tracer,
                "chat small-model",
                t0 + 31 * MS,
                t0 + 32 * MS,
                {
                    "gen_ai.operation.name": "chat",
                },
            )
        with _span(
            tracer,
            "invoke_agent chief",
            t0 + 51 * MS,
            t0 + 70 * MS,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": "chief",
                **conv,
            },
        ):
            _leaf(
                tracer,
                "chat small-model",
                t0 + 52 * MS,
                t0 + 60 * MS,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system_instructions": json.dumps(_parts(CHIEF_SYSTEM)),
                    "gen_ai.input.messages": json.dumps(
                        [
                            task,
                            {"role": "assistant", "parts": _parts(DIAGNOSIS)},
                            {"role": "user", "parts": _parts(HANDOFF)},
                        ]
                    ),
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": _parts(PLAN), "finish_reason": "stop"}]
                    ),
                },
            )
        with _span(
            tracer,
            "invoke_agent Pharmacist",
            t0 + 71 * MS,
            t0 + 80 * MS,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "Pharmacist",
                **conv,
            },
        ):
            _leaf(
                tracer,
                "chat small-model",
                t0 + 72 * MS,
                t0 + 79 * MS,
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": _parts("Dose?")}]
                    ),
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": _parts("10 mg.")}]
                    ),
                },
            )


_EVENT_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "gait_test", "arguments": json.dumps(ARGUMENTS)},
}


def genai_events_run(tracer: Tracer, t0: int, conversation: str = "conv-1") -> None:
    """OTel GenAI conventions, older: one span event per message (gen_ai.user.message, ...),
    the body as `gen_ai.event.content` JSON or as the event's attributes (both are in use)."""
    chat = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai"}
    system, user = "gen_ai.system.message", "gen_ai.user.message"
    called = {"message": {"role": "assistant", "tool_calls": [_EVENT_CALL]}}
    doctor = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Doctor Agent"}
    chief = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": "chief"}
    pharmacist = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Pharmacist"}
    workflow = {"gen_ai.conversation.id": conversation}
    with _span(tracer, "invoke_workflow clinic", t0, t0 + 100 * MS, workflow):
        with _span(tracer, "invoke_agent Doctor", t0 + 1 * MS, t0 + 50 * MS, doctor):
            t = t0 + 2 * MS
            _leaf(
                tracer,
                "chat small-model",
                t,
                t0 + 10 * MS,
                chat,
                (
                    (system, t, {"content": DOCTOR_SYSTEM}, False),
                    (user, t, {"content": TASK}, False),
                    ("gen_ai.choice", t0 + 10 * MS, {"index": 0, **called}, True),
                ),
            )
            _leaf(
                tracer,
                "execute_tool gait_test",
                t0 + 11 * MS,
                t0 + 20 * MS,
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "gait_test",
                    "gen_ai.tool.call.id": "call_1",
                    "gen_ai.tool.call.result": RESULT,
                },
            )
            t = t0 + 21 * MS
            _leaf(
                tracer,
                "chat small-model",
                t,
                t0 + 30 * MS,
                chat,
                (
                    (system, t, {"content": DOCTOR_SYSTEM}, True),
                    (user, t, {"content": TASK}, True),
                    ("gen_ai.assistant.message", t, {"tool_calls": [_EVENT_CALL]}, True),
                    ("gen_ai.tool.message", t, {"id": "call_1", "content": RESULT}, True),
                    ("gen_ai.choice", t0 + 30 * MS, {"message": {"content": DIAGNOSIS}}, True),
                ),
            )
            _leaf(tracer, "chat small-model", t0 + 31 * MS, t0 + 32 * MS, chat)
        with _span(tracer, "invoke_agent chief", t0 + 51 * MS, t0 + 70 * MS, chief):
            t = t0 + 52 * MS
            _leaf(
                tracer,
                "chat small-model",
                t,
                t0 + 60 * MS,
                chat,
                (
                    (system, t, {"content": CHIEF_SYSTEM}, True),
                    (user, t, {"content": TASK}, True),
                    ("gen_ai.assistant.message", t, {"content": DIAGNOSIS}, True),
                    (user, t, {"content": HANDOFF}, True),
                    ("gen_ai.choice", t0 + 60 * MS, {"message": {"content": PLAN}}, True),
                ),
            )
        with _span(tracer, "invoke_agent Pharmacist", t0 + 71 * MS, t0 + 80 * MS, pharmacist):
            t = t0 + 72 * MS
            _leaf(
                tracer,
                "chat small-model",
                t,
                t0 + 79 * MS,
                chat,
                (
                    (user, t, {"content": "Dose?"}, True),
                    ("gen_ai.choice", t0 + 79 * MS, {"message": {"content": "10 mg."}}, True),
                ),
            )


def _oi_messages(prefix: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenInference's flattened message list."""
    flat: dict[str, Any] = {}
    for n, message in enumerate(messages):
        for key, value in message.items():
            if key == "tool_calls":
                for m, call in enumerate(value):
                    base = f"{prefix}.{n}.message.tool_calls.{m}.tool_call"
                    flat[f"{base}.id"] = call["id"]
                    flat[f"{base}.function.name"] = call["name"]
                    flat[f"{base}.function.arguments"] = json.dumps(call["arguments"])
            else:
                flat[f"{prefix}.{n}.message.{key}"] = value
    return flat


def _node(name: str, session: str) -> dict[str, Any]:
    return {
        "openinference.span.kind": "CHAIN",
        "graph.node.id": name,
        "metadata": json.dumps({"langgraph_node": name, "langgraph_step": 1}),
        "session.id": session,
    }


def openinference_run(tracer: Tracer, t0: int, session: str = "conv-1") -> None:
    """OpenInference, as its LangGraph instrumentation traces a graph: a CHAIN span per node,
    LLM and TOOL spans below them, the tools in a node of their own."""
    llm = {"openinference.span.kind": "LLM", "llm.model_name": "small-model"}
    system = {"role": "system", "content": DOCTOR_SYSTEM}
    task = {"role": "user", "content": TASK}
    call = {"id": "call_1", "name": "gait_test", "arguments": ARGUMENTS}
    called = {"role": "assistant", "tool_calls": [call]}
    with _span(
        tracer,
        "LangGraph",
        t0,
        t0 + 100 * MS,
        {
            "openinference.span.kind": "CHAIN",
            "session.id": session,
        },
    ):
        with _span(tracer, "doctor", t0 + 1 * MS, t0 + 10 * MS, _node("doctor", session)):
            _leaf(
                tracer,
                "ChatOpenAI",
                t0 + 2 * MS,
                t0 + 10 * MS,
                {
                    **llm,
                    **_oi_messages("llm.input_messages", [system, task]),
                    **_oi_messages("llm.output_messages", [called]),
                },
            )
        with _span(tracer, "tools", t0 + 11 * MS, t0 + 20 * MS, _node("tools", session)):
            _leaf(
                tracer,
                "gait_test",
                t0 + 11 * MS,
                t0 + 20 * MS,
                {
                    "openinference.span.kind": "TOOL",
                    "tool.name": "gait_test",
                    "input.value": json.dumps(ARGUMENTS),
                    "output.value": RESULT,
                },
            )
        with _span(tracer, "doctor", t0 + 21 * MS, t0 + 32 * MS, _node("doctor", session)):
            tool = {
                "role": "tool",
                "tool_call_id": "call_1",
                "name": "gait_test",
                "content": RESULT,
            }
            _leaf(
                tracer,
                "ChatOpenAI",
                t0 + 21 * MS,
                t0 + 30 * MS,
                {
                    **llm,
                    **_oi_messages("llm.input_messages", [system, task, called, tool]),
                    **_oi_messages(
                        "llm.output_messages", [{"role": "assistant", "content": DIAGNOSIS}]
                    ),
                },
            )
            _leaf(tracer, "ChatOpenAI", t0 + 31 * MS, t0 + 32 * MS, llm)
        with _span(tracer, "chief", t0 + 51 * MS, t0 + 70 * MS, _node("chief", session)):
            chief_input = [
                {"role": "system", "content": CHIEF_SYSTEM},
                task,
                {"role": "assistant", "content": DIAGNOSIS},
                {"role": "user", "content": HANDOFF},
            ]
            _leaf(
                tracer,
                "ChatOpenAI",
                t0 + 52 * MS,
                t0 + 60 * MS,
                {
                    **llm,
                    **_oi_messages("llm.input_messages", chief_input),
                    **_oi_messages("llm.output_messages", [{"role": "assistant", "content": PLAN}]),
                },
            )
        with _span(
            tracer,
            "pharmacist",
            t0 + 71 * MS,
            t0 + 80 * MS,
            {
                "openinference.span.kind": "AGENT",
                "agent.name": "pharmacist",
            },
        ):
            _leaf(
                tracer,
                "ChatOpenAI",
                t0 + 72 * MS,
                t0 + 79 * MS,
                {
                    **llm,
                    **_oi_messages("llm.input_messages", [{"role": "user", "content": "Dose?"}]),
                    **_oi_messages(
                        "llm.output_messages", [{"role": "assistant", "content": "10 mg."}]
                    ),
                },
            )


# (tracer, start time in ns, conversation id)
Run = Callable[[Tracer, int, str], None]
RUNS: dict[str, Run] = {
    "genai": genai_run,
    "genai_events": genai_events_run,
    "openinference": openinference_run,
}


def send_run(endpoints: list[str], conversation: str, run: str = "genai") -> None:
    """Runs the traced run now and exports it to every OTLP/HTTP endpoint (/v1/traces URLs) the
    way an application does (batch processors, flushed); blocking, as the SDK is."""
    traced = provider(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoints[0])))
    for endpoint in endpoints[1:]:
        traced.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    RUNS[run](traced.get_tracer("clinic"), time.time_ns() - 1_000_000_000, conversation)
    assert traced.force_flush(60_000)
    traced.shutdown()


def recorded_export(run: Run, t0: int = RECORDED_AT_NS) -> ExportTraceServiceRequest:
    """The run as the SDK's OTLP exporters encode it, with ids 1, 2, 3..."""
    return _encoded(run, t0, "conv-1", CountingIds())


def live_export(conversation: str = "conv-1") -> ExportTraceServiceRequest:
    """The GenAI run, a second ago, with random ids, as its exporter would send it now."""
    return _encoded(genai_run, time.time_ns() - 1_000_000_000, conversation, None)


def _encoded(
    run: Run, t0: int, conversation: str, ids: IdGenerator | None
) -> ExportTraceServiceRequest:
    memory = InMemorySpanExporter()
    traced = provider(SimpleSpanProcessor(memory), ids)
    run(traced.get_tracer("clinic"), t0, conversation)
    traced.shutdown()
    return encode_spans(memory.get_finished_spans())


def otlp_json(export: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON: protobuf's JSON mapping, but trace and span ids (of spans and links) in hex."""
    document = json_format.MessageToDict(export)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for holder in (span, *span.get("links", [])):  # a framework's spans link others
                    for name in ("traceId", "spanId", "parentSpanId"):
                        if name in holder:
                            holder[name] = _base64_to_hex(holder[name])
    return json.dumps(document, indent=1).encode()


def _base64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()
