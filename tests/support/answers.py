"""Scripted LLM answers: the smallest JSON value that satisfies whatever schema the protocol asks
for (so scripted backends follow the protocol instead of hard-coding answers), a backend that
gives them only once a test lets it, and the body an OpenAI-compatible server answers a chat
completion with.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from poirotd.llm import ChatMessage
from poirotd.llm.scripted import ScriptedBackend


def schema_answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
    """A ScriptedBackend script: a schema-valid answer (every vote names region 0), or prose."""
    return json.dumps(fill(schema)) if schema is not None else "I saw nothing unusual."


def gated(gate: asyncio.Event) -> ScriptedBackend:
    """`schema_answer`s once the test sets `gate`: until then every run holds its worker."""

    async def answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        await gate.wait()
        return schema_answer(messages, schema)

    return ScriptedBackend(answer)


def fill(schema: dict[str, Any], *, prefer: str = "vote", bit: int = 1) -> Any:
    """`prefer` picks the anyOf branch whose `action` const matches; `bit` fills 0|1 arrays with a
    single 1 at index 0 (bit=1) or all zeros (bit=0)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        branches = schema["anyOf"]
        chosen = next(
            (
                b
                for b in branches
                if b.get("properties", {}).get("action", {}).get("const") == prefer
            ),
            branches[0],
        )
        return fill(chosen, prefer=prefer, bit=bit)
    kind = schema.get("type")
    if kind == "object":
        return {k: fill(v, prefer=prefer, bit=bit) for k, v in schema["properties"].items()}
    if kind == "array":
        prefix = [fill(s, prefer=prefer, bit=bit) for s in schema.get("prefixItems", [])]
        size = max(schema.get("minItems", 0), len(prefix))
        items = schema.get("items") or {}
        if items.get("enum") == [0, 1]:
            return [bit if i == 0 else 0 for i in range(size)]
        return prefix + [fill(items, prefer=prefer, bit=bit) for _ in range(size - len(prefix))]
    if kind == "string":
        return "x"
    if kind == "boolean":
        return False
    if kind == "integer":
        return 0
    if kind == "null":
        return None
    raise ValueError(f"unsupported schema: {schema}")


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
