"""Golden tests of the span mapping on exports recorded from the real OpenTelemetry SDK, one per
convention, each read as protobuf and as OTLP/JSON: the same conversation comes out of all."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from poirotd.devtools.otlp_runs import (
    CONVERSATION,
    RECORDED_AT_NS,
    RUNS,
    SPEC,
    TRACE,
    conversation,
    recorded_export,
)
from poirotd.transports.otlp.http import JSON, PROTOBUF, _decode
from poirotd.transports.otlp.mapping import map_export
from tests.support.otlp_runs import DATA, agent_framework_conversation

AGENTS = SPEC.agents_by_alias()
# Per convention: the span each message of CONVERSATION comes from, and the spans rejected
# (span, reason).
SPANS = {
    "genai": ([3, 3, 3, 4, 5, 8, 8], [(6, "no_content"), (10, "unknown_agent")]),
    "genai_events": ([3, 3, 3, 4, 5, 8, 8], [(6, "no_content"), (10, "unknown_agent")]),
    "openinference": ([3, 3, 3, 5, 7, 10, 10], [(8, "no_content"), (12, "unknown_agent")]),
}


def _read(name: str, encoding: str) -> ExportTraceServiceRequest:
    if encoding == "protobuf":
        return _decode(
            ExportTraceServiceRequest,
            (DATA / f"{name}.pb").read_bytes(),
            PROTOBUF,
            "identity",
            1 << 20,
        )
    return _decode(
        ExportTraceServiceRequest, (DATA / f"{name}.json").read_bytes(), JSON, "identity", 1 << 20
    )


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("name", sorted(RUNS))
def test_each_convention_maps_to_the_same_conversation(name: str, encoding: str) -> None:
    mapped = map_export(_read(name, encoding), AGENTS, session_by="conversation")
    assert conversation(mapped.messages) == CONVERSATION
    spans, rejected = SPANS[name]
    assert [(m.trace_id, int(m.span_id, 16)) for m in mapped.messages] == [
        (TRACE, span) for span in spans
    ]
    assert {m.session_id for m in mapped.messages} == {"conv-1"}
    assert [(int(r.span_id, 16), r.reason) for r in mapped.rejections] == rejected
    assert "pharmacist'" in mapped.rejections[1].detail.lower()


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_recorded_exports_are_what_the_recording_script_writes(name: str) -> None:
    assert recorded_export(RUNS[name]).SerializeToString() == (DATA / f"{name}.pb").read_bytes()


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_microsoft_agent_framework_run_maps_to_its_conversation(encoding: str) -> None:
    """examples/agent_framework_genai.py as the framework traced it: each message once, though
    the agents' invocations repeat their model calls' messages and the doctor's holds its whole
    run, the tool's result too (which once became an empty message of the doctor); the chief,
    handed the doctor's history, has its own instructions stored (they came before that
    history, and were once taken for part of it)."""
    export = _read("agent_framework", encoding)
    mapped = map_export(export, AGENTS, session_by="conversation")
    assert [
        (m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in mapped.messages
    ] == agent_framework_conversation()
    names = {
        span.span_id.hex(): span.name
        for resource_spans in export.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }
    assert [names[m.span_id] for m in mapped.messages] == [
        "invoke_agent doctor",
        "invoke_agent doctor",
        "chat replay",
        "execute_tool gait_test",
        "chat replay",
        "invoke_agent chief",
        "chat replay",
    ]
    assert {m.session_id for m in mapped.messages} == {"conv-1"}
    assert not mapped.rejections
    assert mapped.spans == 15


def _spans_named(export: ExportTraceServiceRequest, keep: Callable[[str], bool]) -> Any:
    """The export with only the spans whose name `keep` accepts."""
    part = ExportTraceServiceRequest()
    part.CopyFrom(export)
    for resource_spans in part.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            kept = [span for span in scope_spans.spans if keep(span.name)]
            del scope_spans.spans[:]
            scope_spans.spans.extend(kept)
    return part


def test_an_invocation_exported_after_its_model_calls_carries_the_run_once() -> None:
    """The batch processor exports an invocation that outlasts its schedule delay after its
    model calls. Microsoft Agent Framework names the agent only on the invocation, so the
    doctor's model calls and tool call, exported first, are rejected `unknown_agent`; the
    invocation, exported next, carries the doctor's whole run: each message is stored once."""
    run = _read("agent_framework", "protobuf")
    doctor = "invoke_agent doctor"
    first = map_export(
        _spans_named(run, lambda name: name != doctor), AGENTS, session_by="conversation"
    )
    then = map_export(
        _spans_named(run, lambda name: name == doctor), AGENTS, session_by="conversation"
    )
    conversation = agent_framework_conversation()
    assert [
        (m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in first.messages
    ] == conversation[-2:]
    assert [r.reason for r in first.rejections] == ["unknown_agent"] * 3
    assert [(m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in then.messages] == (
        conversation[:5]
    )
    assert not then.rejections


def test_the_session_is_the_trace_when_configured_so() -> None:
    mapped = map_export(_read("genai", "protobuf"), AGENTS, session_by="trace")
    assert {m.session_id for m in mapped.messages} == {TRACE}


def _export(*spans: Span) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=list(spans))])]
    )


def _span(span_id: int, attributes: dict[str, str], parent: int = 0) -> Span:
    return Span(
        trace_id=(7).to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        start_time_unix_nano=RECORDED_AT_NS + span_id,
        end_time_unix_nano=RECORDED_AT_NS + span_id + 1,
        attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items()],
    )


def test_malformed_attributes_reject_their_span_only() -> None:
    agent = {"gen_ai.agent.name": "doctor"}
    good = {
        "gen_ai.operation.name": "chat",
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "fine"}]}]
        ),
        **agent,
    }
    not_json = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[{oops", **agent}
    no_list = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": '{"a": 1}', **agent}
    bad_index = {
        "openinference.span.kind": "LLM",
        "llm.output_messages.first.message.content": "x",
        **agent,
    }
    mapped = map_export(
        _export(_span(1, good), _span(2, not_json), _span(3, no_list), _span(4, bad_index)),
        AGENTS,
        session_by="conversation",
    )
    assert [m.content for m in mapped.messages] == ["fine"]
    assert [(int(r.span_id, 16), r.reason) for r in mapped.rejections] == [
        (2, "malformed"),
        (3, "malformed"),
        (4, "malformed"),
    ]
    assert "gen_ai.input.messages is not JSON" in mapped.rejections[0].detail
    assert "'first' is not a list index" in mapped.rejections[2].detail


def test_a_too_long_session_id_or_a_list_for_a_name_rejects_or_ignores_the_span() -> None:
    reply = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}])
    chat = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": reply}
    long_session = _span(2, {**chat, "gen_ai.agent.name": "doctor", "session.id": "s" * 300})
    listed = _span(3, {"gen_ai.agent.name": "doctor"})
    listed.attributes.add(key="gen_ai.operation.name").value.array_value.values.add(
        string_value="chat"
    )
    mapped = map_export(
        _export(_span(1, {**chat, "gen_ai.agent.name": "chief"}), long_session, listed),
        AGENTS,
        session_by="conversation",
    )
    assert [m.sender for m in mapped.messages] == ["chief"]
    assert [(int(r.span_id, 16), r.reason) for r in mapped.rejections] == [(2, "malformed")]
    assert "session.id is over 256 characters" in mapped.rejections[0].detail
    assert mapped.spans == 3


def test_bytes_values_and_escaped_lone_surrogates_become_storable_text() -> None:
    surrogate = '{"note": "\\ud800"}'  # JSON that json.loads turns into a lone surrogate
    span = _span(
        1,
        {
            "openinference.span.kind": "LLM",
            "gen_ai.agent.name": "doctor",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "note",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": surrogate,
        },
    )
    span.attributes.add(key="llm.output_messages.0.message.content").value.bytes_value = b"\0\1\2"
    mapped = map_export(_export(span), AGENTS, session_by="conversation")
    assert not mapped.rejections
    [message] = mapped.messages
    assert message.content == '"AAEC"'  # bytes as OTLP/JSON writes them
    assert message.tool_calls == (f"note({surrogate})",)
    assert message.tool_calls[0].encode()  # UTF-8, as the store writes it


def test_an_agent_is_found_by_alias_id_or_name_up_the_parents_and_other_spans_are_ignored() -> None:
    reply = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}])
    chat = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": reply}
    mapped = map_export(
        _export(
            _span(1, {"gen_ai.agent.name": "Doctor Agent"}),  # an alias
            _span(2, chat, parent=1),
            _span(3, {"agent.name": "Chief"}),  # the agent's name
            _span(4, chat, parent=3),
            _span(5, {"http.method": "GET"}),  # not a GenAI span: structure only
            _span(6, chat),  # no agent anywhere above it
        ),
        AGENTS,
        session_by="conversation",
    )
    assert [(m.sender, int(m.span_id, 16)) for m in mapped.messages] == [
        ("doctor", 2),
        ("chief", 4),
    ]
    assert [(int(r.span_id, 16), r.reason) for r in mapped.rejections] == [(6, "unknown_agent")]
    assert mapped.spans == 6


def test_a_parent_loop_ends() -> None:
    chat = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": "[]"}
    mapped = map_export(
        _export(_span(1, chat, parent=2), _span(2, {}, parent=1)), AGENTS, session_by="trace"
    )
    assert [r.reason for r in mapped.rejections] == ["no_content"]


def test_an_alias_names_one_agent_and_never_another_agents_id() -> None:
    from pydantic import ValidationError

    from poirotd.config import SystemSpec

    def spec(doctor: list[str], chief: list[str]) -> SystemSpec:
        agents = [
            {"id": "doctor", "name": "Doctor", "system_prompt": "p", "aliases": doctor},
            {"id": "chief", "name": "Chief", "system_prompt": "p", "aliases": chief},
        ]
        return SystemSpec.model_validate(
            {"system": {"name": "s", "description": "d"}, "agents": agents}
        )

    assert spec(["Dr"], ["boss"]).agents_by_alias()["Dr"] == "doctor"
    with pytest.raises(ValidationError, match="alias 'x' names two agents"):
        spec(["x"], ["x"])
    with pytest.raises(ValidationError, match="has alias 'chief', another agent's id"):
        spec(["chief"], [])
