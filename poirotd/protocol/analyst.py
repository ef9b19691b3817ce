"""What the methods whose LLM judges a session from outside share (ECHO's analysts, ErrorProbe's
roles): the confidence levels they answer in, and the prompt sections that describe the system
and the regions a fault may be blamed on.

Likelihoods and confidences are decoded from eleven levels (0.0, 0.1, ... 1.0): llama.cpp's
grammar converter enforces no numeric range, and a level is all a consensus or a gate needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import ChatMessage
from poirotd.model import HazardSpace

LEVELS = tuple(round(x / 10, 1) for x in range(10, -1, -1))  # 1.0, 0.9, ... 0.0

Probability = Annotated[float, Field(ge=0.0, le=1.0)]


def request(system: str, sections: Sequence[str], answer: str) -> list[ChatMessage]:
    """A judge's request: its role and rules as the system turn; the material in sections, then
    the answer format (`answer`: the JSON shape), as the user turn."""
    closing = f"# Answer format\n\nReply with ONE JSON object and nothing else:\n{answer}"
    return [
        ChatMessage(role="system", content=system),
        ChatMessage(role="user", content="\n\n".join([*sections, closing])),
    ]


def level_schema() -> dict[str, Any]:
    return {"enum": list(LEVELS)}


def levels_text() -> str:
    return "A level is one of " + ", ".join(str(level) for level in reversed(LEVELS)) + "."


def system_section(spec: SystemSpec) -> str:
    agents = "\n".join(f"- {a.id}: {a.name}" for a in spec.agents)
    return (
        f"# The system\n\nName: {spec.system.name}\n{spec.system.description}\n\nAgents:\n{agents}"
    )


def regions_section(space: HazardSpace) -> str:
    rows = "\n".join(f"- {r.id} ({r.type}): {r.name}. {r.description}" for r in space.regions)
    return f"# Regions where the fault may originate (use these ids)\n\n{rows}"
