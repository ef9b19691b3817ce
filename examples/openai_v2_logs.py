"""Two agents on the OpenAI client, traced by the official OpenTelemetry instrumentation
(`opentelemetry-instrumentation-openai-v2`) in its default mode, traces and logs exported to
poirotd over OTLP: no poirotd code in the agents, only the SDK's exporters pointed at the daemon.

    POIROTD_OTLP_HTTP_PORT=4318 poirotd run --config my-system.yaml &   # agents doctor, chief
    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true \\
        python -m examples.openai_v2_logs --endpoint http://127.0.0.1:4318 \\
        --model-url http://127.0.0.1:8000/v1

In its default mode (semantic conventions 1.30) the instrumentation writes a `chat` span per
model call without any message on it, and sends the messages as log events in the span's
context: `gen_ai.system.message`, `gen_ai.user.message`, ... for the request, `gen_ai.choice`
for each answer. Without a logs exporter (or a Collector pipeline for logs) pointed at poirotd,
the daemon sees spans with nothing said in them.

The application names each agent on its own `invoke_agent` span around the agent's model call
(`gen_ai.agent.name`) and the conversation on the workflow's root span (`gen_ai.conversation.id`,
the session in poirotd): the instrumentation knows neither. The doctor assesses, the chief
decides on the doctor's word. Prints the two answers as JSON.
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry import trace
from opentelemetry._logs import set_logger_provider
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, LogRecordExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

TASK = "Patient 7 walks with a 15 degree offset at the left ankle. Assess it in one sentence."
DOCTOR_SYSTEM = "You are the doctor. You diagnose gait problems briefly."
CHIEF_SYSTEM = "You are the chief. You choose the therapy plan in one sentence."


def handoff(diagnosis: str) -> str:
    return f"The doctor says: {diagnosis} Decide the plan."


def exporters(endpoint: str) -> tuple[SpanExporter, LogRecordExporter]:
    """OTLP/HTTP for an http(s) endpoint (the daemon's OTLP/HTTP port), else OTLP/gRPC (its
    gRPC port, host:port)."""
    if endpoint.startswith(("http://", "https://")):
        base = endpoint.rstrip("/")
        return HttpSpans(endpoint=f"{base}/v1/traces"), HttpLogs(endpoint=f"{base}/v1/logs")
    return GrpcSpans(endpoint=endpoint, insecure=True), GrpcLogs(endpoint=endpoint, insecure=True)


def ask(client: OpenAI, model: str, agent: str, messages: list[ChatCompletionMessageParam]) -> str:
    """One agent's turn: its own span around its model call, as an agent framework makes."""
    tracer = trace.get_tracer("clinic")
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
    with tracer.start_as_current_span(f"invoke_agent {agent}", attributes=attributes):
        answer = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=40,
            temperature=0.0,
            seed=7,
        )
    return (answer.choices[0].message.content or "").strip()


def run(client: OpenAI, model: str, conversation: str) -> dict[str, str]:
    """The workflow: the doctor's turn, then the chief's on the doctor's word, in one trace."""
    workflow = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.conversation.id": conversation}
    tracer = trace.get_tracer("clinic")
    with tracer.start_as_current_span("invoke_workflow clinic", attributes=workflow):
        doctor: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": DOCTOR_SYSTEM},
            {"role": "user", "content": TASK},
        ]
        diagnosis = ask(client, model, "doctor", doctor)
        chief: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": CHIEF_SYSTEM},
            {"role": "user", "content": handoff(diagnosis)},
        ]
        plan = ask(client, model, "chief", chief)
    return {"diagnosis": diagnosis, "plan": plan}


def main(endpoint: str, model_url: str, conversation: str) -> dict[str, str]:
    resource = Resource({"service.name": "clinic-agents"})
    spans, logs = exporters(endpoint)
    traced = TracerProvider(resource=resource)
    traced.add_span_processor(BatchSpanProcessor(spans))
    trace.set_tracer_provider(traced)
    logged = LoggerProvider(resource=resource)
    logged.add_log_record_processor(BatchLogRecordProcessor(logs))
    set_logger_provider(logged)
    OpenAIInstrumentor().instrument()
    try:
        client = OpenAI(base_url=model_url, api_key="unused")
        model = client.models.list().data[0].id
        answers = run(client, model, conversation)
    finally:
        traced.shutdown()  # exports what is left, spans then logs
        logged.shutdown()
    print(json.dumps(answers))
    return answers


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:4318")
    parser.add_argument("--model-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--session", default="openai-v2-run")
    args = parser.parse_args()
    main(args.endpoint, args.model_url, args.session)
