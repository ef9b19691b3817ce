"""A backend that answers from a test's script. For unit tests of orchestration ONLY.

It never runs a model, so nothing a user runs may use it or default to it. The script sees each
request (messages and schema) and returns the answer text, or raises LLMError to simulate a
failed call; it may be async, to hold calls in flight. Every call is recorded for assertions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from poirotd.llm.base import ChatMessage, Completion

Script = Callable[[Sequence[ChatMessage], dict[str, Any] | None], str | Awaitable[str]]


@dataclass(frozen=True)
class ScriptedCall:
    messages: tuple[ChatMessage, ...]
    schema: dict[str, Any] | None
    max_tokens: int


class ScriptedBackend:
    def __init__(self, script: Script, *, context_tokens: int = 8192) -> None:
        self.name = "scripted"
        self.context_tokens = context_tokens
        self.calls: list[ScriptedCall] = []
        self._script = script

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        schema: dict[str, Any] | None = None,
        max_tokens: int,
    ) -> Completion:
        self.calls.append(ScriptedCall(tuple(messages), schema, max_tokens))
        # A real backend always suspends here; so does this one, so agents interleave.
        await asyncio.sleep(0)
        reply = self._script(messages, schema)
        text: str = await reply if inspect.isawaitable(reply) else reply
        return Completion(
            text=text,
            prompt_tokens=self.count_tokens(messages),
            completion_tokens=len(text) // 4,
        )

    def count_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Roughly four characters per token: enough for budget arithmetic in tests."""
        return sum(len(m.content) for m in messages) // 4

    async def aclose(self) -> None:
        return None
