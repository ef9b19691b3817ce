"""End to end: the real OpenTelemetry SDK's OTLP exporters (gRPC and HTTP) send a traced
multi-agent run to a real in-process daemon; its messages arrive as one session, in order, with
the right agents and tool results and their trace links; a rule fires on the tool's result and
the investigation it opens runs over the session (scripted backend)."""

from __future__ import annotations

import asyncio
import sys
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.otlp_runs import DIAGNOSIS, HANDOFF, PLAN, RESULT, RUNS, SPEC, TASK, provider
from poirotd.devtools.process import free_port
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import Investigation, InvestigationState, MessageKind
from poirotd.transports.otlp.mapping import REJECT_REASONS
from tests.support.daemon import in_process_daemon
from tests.support.otlp_runs import agent_framework_conversation

Exporter = Callable[[Daemon], SpanExporter]
ROOT = Path(__file__).parents[3]


def _grpc(daemon: Daemon) -> SpanExporter:
    return GrpcSpanExporter(endpoint=f"127.0.0.1:{daemon.grpc_port}", insecure=True)


def _http(daemon: Daemon) -> SpanExporter:
    endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
    return HttpSpanExporter(endpoint=endpoint, compression=Compression.Gzip)


def _send(run_name: str, exporter: SpanExporter, conversation: str) -> None:
    """Runs the traced run now and exports it the way an application does (batch processor,
    flushed at shutdown); blocking, as the SDK is."""
    traced = provider(BatchSpanProcessor(exporter))
    RUNS[run_name](traced.get_tracer("clinic"), time.time_ns() - 1_000_000_000, conversation)
    assert traced.force_flush(30_000)
    traced.shutdown()


@pytest.mark.parametrize(
    ("exporter", "run_name"),
    [
        (_grpc, "genai"),
        (_http, "openinference"),
        (_http, "genai_events"),
    ],
)
async def test_an_exported_run_is_one_session_a_rule_fires_and_an_investigation_runs(
    tmp_path: Path, exporter: Exporter, run_name: str
) -> None:
    backend = ScriptedBackend(schema_answer)
    async with in_process_daemon(tmp_path, SPEC, backend, otlp_http_port=free_port()) as daemon:
        store = daemon._store
        assert store is not None
        await asyncio.to_thread(_send, run_name, exporter(daemon), "visit-42")
        messages = await store.session_messages("visit-42")
        assert [(m.index, m.kind, m.sender, m.recipient, m.content) for m in messages] == [
            (0, MessageKind.SYSTEM, "system", "doctor", "You diagnose."),
            (1, MessageKind.HUMAN, "user", "doctor", TASK),
            (2, MessageKind.AGENT, "doctor", "", ""),
            (3, MessageKind.TOOL, "tool:gait_test", "doctor", RESULT),
            (4, MessageKind.AGENT, "doctor", "", DIAGNOSIS),
            (5, MessageKind.HUMAN, "user", "chief", HANDOFF),
            (6, MessageKind.AGENT, "chief", "", PLAN),
        ]
        assert messages[2].tool_calls == ('gait_test({"side":"left"})',)
        assert all(len(m.trace_id) == 32 and len(m.span_id) == 16 for m in messages)
        session = await store.get_session("visit-42")
        assert session is not None and session.labels["input"] == "otlp"
        # The rule on the tool's result opened an investigation over the session, which ran.
        investigation = await _finished_investigation(daemon, "visit-42")
        assert investigation.state is InvestigationState.SUCCEEDED
        assert investigation.trigger is not None
        assert investigation.trigger.rule == "sensor_fault_reported"
        rejected = daemon.metrics.otlp_rejected_spans
        assert rejected.labels("unknown_agent")._value.get() == 1
        assert rejected.labels("no_content")._value.get() == 1


async def _finished_investigation(daemon: Daemon, session_id: str) -> Investigation:
    store = daemon._store
    assert store is not None
    for _ in range(600):
        found, _ = await store.list_investigations(session_id=session_id)
        if found and found[0].state.finished:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no investigation of {session_id} finished")


async def test_a_real_langgraph_run_traced_by_openinference_is_one_session(
    tmp_path: Path,
) -> None:
    """examples/langgraph_openinference.py: LangGraph's graph, OpenInference's LangChain
    instrumentor and the SDK's OTLP/HTTP exporter, nothing hand-made; the tool's result (which
    the instrumentor writes as its ToolMessage in JSON) is stored once, as text."""
    from examples import langgraph_openinference

    backend = ScriptedBackend(schema_answer)
    async with in_process_daemon(tmp_path, SPEC, backend, otlp_http_port=free_port()) as daemon:
        store = daemon._store
        assert store is not None
        endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
        await asyncio.to_thread(langgraph_openinference.main, endpoint, "graph-1")
        messages = await store.session_messages("graph-1")
        assert [(m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in messages] == [
            (MessageKind.SYSTEM, "system", "doctor", "You diagnose.", ()),
            (MessageKind.HUMAN, "user", "doctor", langgraph_openinference.TASK, ()),
            (MessageKind.AGENT, "doctor", "", "", ('gait_test({"side":"left"})',)),
            (
                MessageKind.TOOL,
                "tool:gait_test",
                "doctor",
                "ankle_left_deg offset 15 deg: SENSOR FAULT",
                (),
            ),
            (MessageKind.AGENT, "doctor", "", "The offset is noise; proceed.", ()),
            (MessageKind.SYSTEM, "system", "chief", "You choose the plan.", ()),
            (MessageKind.HUMAN, "user", "chief", "Doctor: The offset is noise; proceed.", ()),
            (MessageKind.AGENT, "chief", "", "Plan 4, full assistance.", ()),
        ]
        assert len({m.trace_id for m in messages}) == 1
        investigation = await _finished_investigation(daemon, "graph-1")
        assert investigation.state is InvestigationState.SUCCEEDED
        assert daemon.metrics.otlp_rejected_spans.labels("malformed")._value.get() == 0


async def test_a_microsoft_agent_framework_workflow_traced_natively_is_one_session(
    tmp_path: Path,
) -> None:
    """examples/agent_framework_genai.py run as a program: Microsoft Agent Framework's workflow
    of two agents, traced by the framework itself in the GenAI conventions and exported by the
    SDK's OTLP/HTTP exporter; the run is one session with the right agents, order and the tool's
    result, nothing is rejected, and the rule on the result opens an investigation that runs."""
    backend = ScriptedBackend(schema_answer)
    async with in_process_daemon(tmp_path, SPEC, backend, otlp_http_port=free_port()) as daemon:
        store = daemon._store
        assert store is not None
        endpoint = f"http://127.0.0.1:{daemon.settings.otlp_http_port}/v1/traces"
        program = ("-m", "examples.agent_framework_genai", "--endpoint", endpoint)
        process = await asyncio.create_subprocess_exec(
            sys.executable, *program, "--session", "visit-af", cwd=ROOT, stdout=PIPE, stderr=STDOUT
        )
        output, _ = await process.communicate()
        assert process.returncode == 0, output.decode()
        messages = await store.session_messages("visit-af")
        assert [
            (m.kind, m.sender, m.recipient, m.content, m.tool_calls) for m in messages
        ] == agent_framework_conversation()
        assert [m.index for m in messages] == list(range(7))
        assert len({m.trace_id for m in messages}) == 1
        investigation = await _finished_investigation(daemon, "visit-af")
        assert investigation.state is InvestigationState.SUCCEEDED
        assert investigation.trigger is not None
        assert investigation.trigger.rule == "sensor_fault_reported"
        rejected = daemon.metrics.otlp_rejected_spans
        assert all(rejected.labels(r)._value.get() == 0 for r in REJECT_REASONS)
