"""A Microsoft Agent Framework workflow of two agents, traced by the framework's own OpenTelemetry
instrumentation in the GenAI semantic conventions, its spans exported to poirotd over OTLP: no
poirotd code in the agents, only an exporter pointed at the daemon.

    POIROTD_OTLP_HTTP_PORT=4318 poirotd run --config my-system.yaml &   # agents doctor, chief
    python -m examples.agent_framework_genai --endpoint http://127.0.0.1:4318/v1/traces

The doctor calls a gait test (a framework function tool) and reports; the chief, the next
executor of the workflow, decides. The framework writes each agent invocation, model call and
tool call as an `invoke_agent` / `chat` / `execute_tool` span; with sensitive-data capture on
(`enable_instrumentation(enable_sensitive_data=True)`) their messages are in
`gen_ai.input.messages` / `gen_ai.output.messages` and the tool's result in
`gen_ai.tool.call.result` (the framework's default semantic-convention version; with
OTEL_SEMCONV_STABILITY_OPT_IN set to anything without `gen_ai_latest_experimental` it writes
messages only as OpenTelemetry log events, if at all, which a trace receiver never sees).

The models are replayed: the framework ships no fake chat client, so `ReplayChatClient` is a
`BaseChatClient` with the framework's own function-invocation and telemetry layers (its
built-in clients compose the same ones, and middleware) whose model answers from a list:
every span is the framework's. The application names the conversation on its root span
(`gen_ai.conversation.id`, the session in poirotd); without it poirotd files the run under its
trace id.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
    Workflow,
    WorkflowBuilder,
    tool,
)
from agent_framework.observability import ChatTelemetryLayer, enable_instrumentation
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator

TASK = "Assess the gait of patient 7."
DIAGNOSIS = "The offset is noise; proceed."
PLAN = "Plan 4, full assistance."


class ReplayChatClient(FunctionInvocationLayer[Any], ChatTelemetryLayer[Any], BaseChatClient[Any]):
    """A chat client whose model gives the listed answers in turn (no model server)."""

    OTEL_PROVIDER_NAME = "replay"

    def __init__(self, answers: Sequence[Message]) -> None:
        super().__init__()
        self._answers = list(answers)

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any
    ) -> Awaitable[ChatResponse[Any]]:
        if stream:
            raise ValueError("ReplayChatClient does not stream")
        return self._answer()

    async def _answer(self) -> ChatResponse[Any]:
        if not self._answers:
            raise RuntimeError("ReplayChatClient has no answer left")
        return ChatResponse(messages=[self._answers.pop(0)], model="replay")


@tool
def gait_test(side: str) -> str:
    """Runs a gait test on one side."""
    return f"ankle_{side}_deg offset 15 deg: SENSOR FAULT"


def build_workflow() -> Workflow:
    call = Content.from_function_call("call_1", "gait_test", arguments={"side": "left"})
    doctor = Agent(
        ReplayChatClient(
            [
                Message(role="assistant", contents=[call]),
                Message(role="assistant", contents=[DIAGNOSIS]),
            ]
        ),
        id="doctor",
        name="doctor",
        instructions="You diagnose.",
        tools=[gait_test],
    )
    chief = Agent(
        ReplayChatClient([Message(role="assistant", contents=[PLAN])]),
        id="chief",
        name="chief",
        instructions="You choose the plan.",
    )
    return WorkflowBuilder(start_executor=doctor).add_edge(doctor, chief).build()


def traced(processor: SpanProcessor, ids: IdGenerator | None = None) -> TracerProvider:
    """The process's tracer provider (the framework traces with the global one), its spans to
    `processor`, with the framework's message capture on; once per process."""
    resource = Resource.create({"service.name": "clinic-agents"})
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    enable_instrumentation(enable_sensitive_data=True)
    return provider


async def run(workflow: Workflow, conversation: str) -> str:
    """One run of the workflow in the conversation; the chief's decision."""
    tracer = trace.get_tracer("clinic")
    attributes = {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.conversation.id": conversation,
    }
    with tracer.start_as_current_span("invoke_workflow clinic", attributes=attributes):
        result = await workflow.run(TASK)
    return str(result.get_outputs()[-1].text)


def main(endpoint: str, conversation: str = "agent-framework-run") -> str:
    provider = traced(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    try:
        decision = asyncio.run(run(build_workflow(), conversation))
    finally:
        provider.shutdown()  # exports what is left
    print("chief:", decision, "- traced into poirotd session", conversation)
    return decision


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:4318/v1/traces")
    parser.add_argument("--session", default="agent-framework-run")
    args = parser.parse_args()
    main(args.endpoint, args.session)
