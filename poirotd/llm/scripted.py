"""A backend that answers from a test's script. For unit tests of orchestration ONLY.

It never runs a model, so nothing a user runs may use it or default to it. The script sees each
request (messages and schema) and returns the answer text, or raises LLMError to simulate a
failed call; it may be async, to hold calls in flight. A request that offers tools goes to the
tool script instead, which sees the tools and returns the calls the "model" makes (or text, for
a model that called none). Every call is recorded for assertions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from poirotd.llm.base import ChatMessage, Completion, LLMError, Tool, ToolCall
from poirotd.llm.control_tokens import BUILT_IN, ControlTokens

Script = Callable[[Sequence[ChatMessage], dict[str, Any] | None], str | Awaitable[str]]
ToolReply = str | Sequence[ToolCall]
ToolScript = Callable[[Sequence[ChatMessage], Sequence[Tool]], ToolReply | Awaitable[ToolReply]]


@dataclass(frozen=True)
class ScriptedCall:
    messages: tuple[ChatMessage, ...]
    schema: dict[str, Any] | None
    max_tokens: int
    tools: tuple[Tool, ...] = ()
    temperature: float | None = None


class ScriptedBackend:
    def __init__(
        self,
        script: Script,
        *,
        tool_script: ToolScript | None = None,
        context_tokens: int = 8192,
        control_tokens: ControlTokens = BUILT_IN,
    ) -> None:
        self.name = "scripted"
        self.context_tokens = context_tokens
        self.availability = None
        self.serves_at_once: int | None = None
        self.calls: list[ScriptedCall] = []
        self._script = script
        self._tool_script = tool_script
        self._control_tokens = control_tokens

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        max_tokens: int,
        temperature: float | None = None,
    ) -> Completion:
        self.calls.append(
            ScriptedCall(tuple(messages), schema, max_tokens, tuple(tools), temperature)
        )
        # A real backend always suspends here; so does this one, so agents interleave.
        await asyncio.sleep(0)
        reply: ToolReply | Awaitable[ToolReply]
        if not tools:
            reply = self._script(messages, schema)
        elif self._tool_script is None:
            raise LLMError("this scripted backend has no tool script", reason="bad_request")
        else:
            reply = self._tool_script(messages, tools)
        answer: ToolReply = await reply if inspect.isawaitable(reply) else reply
        text, calls = (answer, ()) if isinstance(answer, str) else ("", tuple(answer))
        return Completion(
            text=text,
            prompt_tokens=self.count_tokens(messages),
            completion_tokens=(len(text) + sum(len(c.arguments) for c in calls)) // 4,
            tool_calls=calls,
        )

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Roughly four characters per token: enough for budget arithmetic in tests."""
        return (
            sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages) // 4
        )

    async def control_tokens(self) -> ControlTokens:
        """The built-in families, or the model's a test hands over (an embedded model's)."""
        return self._control_tokens

    async def aclose(self) -> None:
        return None
