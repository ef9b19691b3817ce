"""Scripted LLM answers: the smallest JSON value that satisfies whatever schema the protocol asks
for, so a scripted backend (`poirotd.llm.scripted`) follows the protocol instead of hard-coding
answers; the tests and the benchmarks run whole investigations on it without model time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from poirotd.llm import ChatMessage


def schema_answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
    """A ScriptedBackend script: a schema-valid answer (every vote names region 0), or prose."""
    return json.dumps(fill(schema)) if schema is not None else "I saw nothing unusual."


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
