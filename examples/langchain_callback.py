"""A LangChain run recorded by poirotd's callback handler, no OpenTelemetry: two "nodes" (the
doctor calls a tool, the chief decides), driven by langchain-core's fake chat model so that it
runs without a model server.

    pip install langchain-core
    python -m examples.langchain_callback --system cortex
"""

from __future__ import annotations

import argparse

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool

from poirotd.client import Client
from poirotd.integrations.langchain import PoirotCallbackHandler


def _gait_test(side: str) -> str:
    """Runs a gait test on one side."""
    return f"ankle_{side}_deg offset 15 deg"


def main(target: str, system: str, session: str = "example-langchain") -> None:
    gait_test = StructuredTool.from_function(_gait_test, name="gait_test")
    call = {"name": "gait_test", "args": {"side": "left"}, "id": "call_1", "type": "tool_call"}
    doctor = FakeMessagesListChatModel(
        responses=[AIMessage("", tool_calls=[call]), AIMessage("Offset is noise; proceed.")]
    )
    chief = FakeMessagesListChatModel(responses=[AIMessage("Plan 4, full assistance.")])
    with Client(target, system=system) as poirot:
        handler = PoirotCallbackHandler(poirot, session, agent="doctor")

        def node(name: str) -> RunnableConfig:  # what LangGraph puts in each node's config
            return {"callbacks": [handler], "metadata": {"langgraph_node": name}}

        history: list[BaseMessage] = [SystemMessage("You diagnose."), HumanMessage("Assess.")]
        asked = doctor.invoke(history, config=node("doctor"))
        history += [asked, gait_test.invoke(call, config=node("tools"))]
        history.append(doctor.invoke(history, config=node("doctor")))
        decision = chief.invoke([HumanMessage(str(history[-1].content))], config=node("chief"))
        print("chief:", decision.content, "- recorded in session", session)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--system", default="cortex")
    args = parser.parse_args()
    main(args.target, args.system)
