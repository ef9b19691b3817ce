"""A LangGraph multi-agent graph traced by OpenInference, its spans exported to poirotd over OTLP:
no poirotd code in the agents, only an exporter pointed at the daemon.

    POIROTD_OTLP_HTTP_PORT=4318 poirotd run --config my-system.yaml &   # agents doctor, chief
    python -m examples.langgraph_openinference --endpoint http://127.0.0.1:4318/v1/traces

The doctor calls a gait test (LangGraph's tools node) and reports; the chief decides. The chat
models are langchain-core's fake models, so it runs without a model server. The session is
OpenInference's `session.id` (`using_session`); poirotd reads each node's name (`langgraph_node`
in the spans' metadata) as the agent.
"""

from __future__ import annotations

import argparse
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from openinference.instrumentation import using_session
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TASK = "Assess the gait of patient 7."


def _gait_test(side: str) -> str:
    """Runs a gait test on one side."""
    return f"ankle_{side}_deg offset 15 deg: SENSOR FAULT"


def build_graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    gait_test = StructuredTool.from_function(_gait_test, name="gait_test")
    call = {"name": "gait_test", "args": {"side": "left"}, "id": "call_1", "type": "tool_call"}
    doctor_model = FakeMessagesListChatModel(
        responses=[AIMessage("", tool_calls=[call]), AIMessage("The offset is noise; proceed.")]
    )
    chief_model = FakeMessagesListChatModel(responses=[AIMessage("Plan 4, full assistance.")])

    def doctor(state: MessagesState) -> dict[str, Any]:
        prompt = [SystemMessage("You diagnose."), *state["messages"]]
        return {"messages": [doctor_model.invoke(prompt)]}

    def chief(state: MessagesState) -> dict[str, Any]:
        report = state["messages"][-1].content
        prompt = [SystemMessage("You choose the plan."), HumanMessage(f"Doctor: {report}")]
        return {"messages": [chief_model.invoke(prompt)]}

    graph = StateGraph(MessagesState)
    graph.add_node("doctor", doctor)
    graph.add_node("tools", ToolNode([gait_test]))
    graph.add_node("chief", chief)
    graph.add_edge(START, "doctor")
    graph.add_conditional_edges("doctor", tools_condition, {"tools": "tools", END: "chief"})
    graph.add_edge("tools", "doctor")
    graph.add_edge("chief", END)
    return graph.compile()


def traced(processor: SpanProcessor) -> tuple[TracerProvider, LangChainInstrumentor]:
    """LangChain instrumented by OpenInference, its spans to `processor`; uninstrument after."""
    provider = TracerProvider(resource=Resource.create({"service.name": "clinic-agents"}))
    provider.add_span_processor(processor)
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    return provider, instrumentor


def run(graph: CompiledStateGraph[Any, Any, Any, Any], session: str) -> str:
    """One run of the graph in the session; the chief's decision."""
    with using_session(session):
        state = graph.invoke({"messages": [HumanMessage(TASK)]})
    return str(state["messages"][-1].content)


def main(endpoint: str, session: str = "langgraph-run") -> str:
    provider, instrumentor = traced(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    try:
        decision = run(build_graph(), session)
    finally:
        provider.shutdown()  # exports what is left
        instrumentor.uninstrument()
    print("chief:", decision, "- traced into poirotd session", session)
    return decision


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:4318/v1/traces")
    parser.add_argument("--session", default="langgraph-run")
    args = parser.parse_args()
    main(args.endpoint, args.session)
