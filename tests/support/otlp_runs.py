"""The recorded OTLP exports the golden tests read (tests/data/otlp): each run of
`poirotd.devtools.otlp_runs` as its exporters encode it, and examples/agent_framework_genai.py's
run as Microsoft Agent Framework traces it (GenAI conventions written by a real framework; its
spans keep the framework's clock, so that recording is read by the tests, not rebuilt).
`python -m tests.support.otlp_runs` writes them again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from poirotd.devtools.otlp_runs import RESULT, RUNS, CountingIds, otlp_json, recorded_export
from poirotd.model import MessageKind

DATA = Path(__file__).parents[1] / "data" / "otlp"


def agent_framework_export() -> ExportTraceServiceRequest:
    """examples/agent_framework_genai.py's workflow run in conversation "conv-1", traced by
    Microsoft Agent Framework with ids 1, 2, 3...; once per process (the framework traces with
    the global tracer provider)."""
    from examples import agent_framework_genai as example

    memory = InMemorySpanExporter()
    traced = example.traced(SimpleSpanProcessor(memory), CountingIds())
    asyncio.run(example.run(example.build_workflow(), "conv-1"))
    traced.shutdown()
    return encode_spans(memory.get_finished_spans())


def agent_framework_conversation() -> list[tuple[MessageKind, str, str, str, tuple[str, ...]]]:
    """examples/agent_framework_genai.py's run as poirotd stores it: (kind, sender, recipient,
    content, tool calls) of each message, in order."""
    from examples import agent_framework_genai as example

    return [
        (MessageKind.SYSTEM, "system", "doctor", "You diagnose.", ()),
        (MessageKind.HUMAN, "user", "doctor", example.TASK, ()),
        (MessageKind.AGENT, "doctor", "", "", ('gait_test({"side":"left"})',)),
        (MessageKind.TOOL, "tool:gait_test", "doctor", RESULT, ()),
        (MessageKind.AGENT, "doctor", "", example.DIAGNOSIS, ()),
        (MessageKind.SYSTEM, "system", "chief", "You choose the plan.", ()),
        (MessageKind.AGENT, "chief", "", example.PLAN, ()),
    ]


def record() -> None:
    """Writes each run's export, protobuf and OTLP/JSON, into tests/data/otlp."""
    DATA.mkdir(parents=True, exist_ok=True)
    exports = {name: recorded_export(run) for name, run in RUNS.items()}
    exports["agent_framework"] = agent_framework_export()
    for name, export in exports.items():
        (DATA / f"{name}.pb").write_bytes(export.SerializeToString())
        (DATA / f"{name}.json").write_bytes(otlp_json(export))


if __name__ == "__main__":
    record()
