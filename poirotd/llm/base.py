"""The one interface the protocol talks to; backends differ only in where tokens come from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from poirotd.llm.control_tokens import ControlTokens
from poirotd.observability.outages import PartState

# The LLMError reason of a call that waited out its whole outage budget: no server could serve.
# The investigation ends there (its other calls would wait as long), rather than abstaining.
MODEL_UNAVAILABLE = "model_unavailable"


class ToolCall(BaseModel):
    """One call the model made; `arguments` is its JSON text as written, for the caller to check."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str


class Tool(BaseModel):
    """A function offered to the model: its name, what it is for, and its arguments' JSON schema."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]


class ChatMessage(BaseModel):
    """A chat turn. An assistant turn may carry `tool_calls`; a "tool" turn answers the call
    `tool_call_id` names (OpenAI wants every call answered, by id, before the next turn)."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""

    def wire(self) -> dict[str, Any]:
        """The turn as chat-completions APIs and chat templates take it; tool fields only when
        set, so a plain turn is exactly {"role", "content"}."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            # Content stays a string even when empty: llama-cpp-python's server refuses null.
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        return message


def replies_to(turn: ChatMessage, text: str) -> list[ChatMessage]:
    """What answers an assistant turn with `text`: the result of each tool call it made, or the
    next user turn when it made none."""
    if turn.tool_calls:
        return [ChatMessage(role="tool", content=text, tool_call_id=c.id) for c in turn.tool_calls]
    return [ChatMessage(role="user", content=text)]


class Completion(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    prompt_tokens: int
    completion_tokens: int
    # Prompt tokens the server did not have to evaluate (prefix cache); None when unknown.
    cached_tokens: int | None = None
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCall, ...] = ()

    def turn(self) -> ChatMessage:
        """The answer as the assistant turn a later request replays."""
        return ChatMessage(role="assistant", content=self.text, tool_calls=self.tool_calls)


class LLMError(Exception):
    """A call that produced no usable answer (timeout, server down, context exceeded...).

    `reason` is a short, bounded label for metrics; the message is for people.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class LLMBackend(Protocol):
    """An async chat-completion backend.

    `schema`, when given, is a JSON schema the answer must satisfy; backends constrain decoding to
    it where they can. `tools`, when given, are offered and the answer should call one of them
    (in `Completion.tool_calls`); a backend that cannot offer tools refuses the request with
    reason "bad_request". `temperature`, when given, replaces the backend's configured one for
    this call (ECHO's analysts sample at their own). Implementations must not block the event
    loop.
    """

    name: str
    context_tokens: int
    # How many calls it serves side by side (None: as many as come), for the model-time floor.
    serves_at_once: int | None

    @property
    def availability(self) -> PartState | None:
        """Whether the model's servers answer, for what must wait for them (investigations);
        None for a backend in this process, which has no outage (embedded, scripted)."""
        ...

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion: ...

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Prompt tokens these messages would take, chat template included."""
        ...

    async def control_tokens(self) -> ControlTokens:
        """The chat-control spellings text quoted to this backend's model must not contain
        (control_tokens.py): what the backend knows of its model's, over the built-in families.
        Never raises: what cannot be learned now is the built-in families (and the configured
        family's name)."""
        ...

    async def aclose(self) -> None: ...
