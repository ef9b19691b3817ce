"""A LangChain / LangGraph callback handler that records a run's messages into a poirotd session,
for teams that want no OpenTelemetry (the OTLP receiver reads the OpenInference traces of the
same runs). langchain-core is optional: without it, importing this module raises ImportError
saying what to install.

    from poirotd.client import Client
    from poirotd.integrations.langchain import PoirotCallbackHandler

    with Client("127.0.0.1:50051", system="clinic") as poirot:
        handler = PoirotCallbackHandler(poirot, "run-42", agent="doctor")
        graph.invoke(inputs, config={"callbacks": [handler]})

What it records as the run goes (each event one `record`, durable before the run goes on):
- what a chat model is given after its last assistant turn: the system and human messages, each
  once per agent (a graph hands the same task to every model call);
- the model's answer, with its tool calls, from the agent;
- a tool's result, to the agent whose tool call it answers.
The agent is the LangGraph node running the model (metadata `langgraph_node`) when
`node_is_agent`, else `agent`. The daemon numbers the messages; the session is started on the
first one (label input=langchain). A refusal (a node that is no agent of the spec, the daemon
down) is logged and the run goes on: monitoring never fails the monitored system.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

import structlog

from poirotd.client import Client, Message
from poirotd.model import MessageKind

try:
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.outputs import LLMResult
except ImportError as missing:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "poirotd.integrations.langchain needs langchain-core: pip install langchain-core"
    ) from missing

log = structlog.get_logger(__name__)


class PoirotCallbackHandler(BaseCallbackHandler):  # type: ignore[misc]
    raise_error = False  # LangChain logs what a handler raises and goes on

    def __init__(
        self, client: Client, session_id: str, *, agent: str, node_is_agent: bool = True
    ) -> None:
        self._client = client
        self.session_id = session_id
        self._agent = agent
        self._node_is_agent = node_is_agent
        # Callbacks may come from several threads (parallel tools, async runs' executors).
        self._lock = threading.Lock()
        self._started = False
        self._model_agents: dict[UUID, str] = {}  # model run -> its agent
        self._tools: dict[UUID, str] = {}  # tool run -> the tool's name
        self._callers: dict[str, str] = {}  # tool call id -> the agent that made it
        self._given: set[tuple[str, str, str]] = set()  # (sender, recipient, content) given

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        agent = self._agent_of(metadata)
        conversation = messages[0] if messages else []
        last_answer = max(
            (i for i, m in enumerate(conversation) if isinstance(m, AIMessage)), default=-1
        )
        given = []
        with self._lock:
            self._model_agents[run_id] = agent
            for message in conversation[last_answer + 1 :]:
                if isinstance(message, SystemMessage):
                    kind, sender = MessageKind.SYSTEM, "system"
                elif isinstance(message, HumanMessage):
                    kind, sender = MessageKind.HUMAN, "user"
                else:  # tool results are recorded when their tool ends
                    continue
                content = _text(message.content)
                if (sender, agent, content) not in self._given:
                    self._given.add((sender, agent, content))
                    given.append(Message(sender, content, recipient=agent, kind=kind))
        self._record(given)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            agent = self._model_agents.pop(run_id, self._agent)
        answers = []
        for generations in response.generations:
            if not generations:
                continue
            generation = generations[0]
            message = getattr(generation, "message", None)
            calls = getattr(message, "tool_calls", None) or []
            with self._lock:
                self._callers.update((call["id"], agent) for call in calls if call.get("id"))
            content = _text(message.content) if message is not None else generation.text
            answers.append(Message(agent, content, tool_calls=[_rendered(c) for c in calls]))
        self._record(answers)

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        with self._lock:
            self._tools[run_id] = (serialized or {}).get("name") or kwargs.get("name") or "tool"

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            name = self._tools.pop(run_id, "tool")
            agent = self._callers.get(getattr(output, "tool_call_id", "") or "", self._agent)
        content = _text(output.content) if isinstance(output, BaseMessage) else str(output)
        result = Message(
            f"tool:{name}", content, recipient=agent, kind=MessageKind.TOOL, tool_name=name
        )
        self._record([result])

    def _agent_of(self, metadata: Mapping[str, Any] | None) -> str:
        node = (metadata or {}).get("langgraph_node")
        return node if self._node_is_agent and isinstance(node, str) and node else self._agent

    def _record(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        try:
            if not self._started:
                self._client.start_session(self.session_id, labels={"input": "langchain"})
                self._started = True
            self._client.record(self.session_id, messages)
        except Exception as exc:
            log.warning(
                "poirotd did not record the run's messages",
                session_id=self.session_id,
                messages=len(messages),
                error=str(exc)[:300],
            )


def _text(content: Any) -> str:
    """A message's text: its content, or the text blocks of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block if isinstance(block, str) else str(block.get("text", ""))
            for block in content
            if isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")
        )
    return str(content)


def _rendered(call: Mapping[str, Any]) -> str:
    """A tool call as the OTLP mapping writes one: name(arguments as compact, sorted JSON)."""
    arguments = call.get("args") or {}
    if not arguments:
        return str(call.get("name", ""))
    compact = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return f"{call.get('name', '')}({compact})"
