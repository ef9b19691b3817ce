"""Builds the smallest JSON value that satisfies one of the protocol's answer schemas.

Used by scripted backends in orchestration tests, so that they follow whatever schema the
protocol asks for instead of hard-coding answers.
"""

from __future__ import annotations

from typing import Any


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
