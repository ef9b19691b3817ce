"""Scripted LLM answers for the tests: a backend that gives `schema_answer`s only once a test lets
it, and the body an OpenAI-compatible server answers a chat completion with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from poirotd.devtools.answers import schema_answer
from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend


def gated(gate: asyncio.Event) -> ScriptedBackend:
    """`schema_answer`s once the test sets `gate`: until then every run holds its worker."""

    async def answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        await gate.wait()
        return schema_answer(messages, schema)

    return ScriptedBackend(answer)


def chat_body(
    text: str = '{"location": [0, 1]}',
    *,
    finish_reason: str = "stop",
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    """A /v1/chat/completions response carrying `text`, with token usage."""
    usage: dict[str, Any] = {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129}
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }
