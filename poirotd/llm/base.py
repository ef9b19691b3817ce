"""The one interface the protocol talks to; backends differ only in where tokens come from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str


class Completion(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    prompt_tokens: int
    completion_tokens: int
    # Prompt tokens the server did not have to evaluate (prefix cache); None when unknown.
    cached_tokens: int | None = None
    finish_reason: str = "stop"


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
    it where they can. Implementations must not block the event loop.
    """

    name: str
    context_tokens: int

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        max_tokens: int,
    ) -> Completion: ...

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Prompt tokens these messages would take, chat template included."""
        ...

    async def aclose(self) -> None: ...
