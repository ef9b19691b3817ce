"""What the methods whose LLM judges a session from outside share (ECHO's analysts, ErrorProbe's
roles): the confidence levels they answer in, the prompt sections that describe the system, the
regions a fault may be blamed on and the incident, and the request around them. Like POIROT's
prompts (poirot/prompts.py), every untrusted text is quoted with the investigation's
`Spotlight`, under headers built outside the quotes, and the system turn carries the
spotlight's notice.

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
from poirotd.protocol.prompts import INCIDENT_HEADING, Incident, incident_section
from poirotd.protocol.spotlight import Spotlight

LEVELS = tuple(round(x / 10, 1) for x in range(10, -1, -1))  # 1.0, 0.9, ... 0.0

Probability = Annotated[float, Field(ge=0.0, le=1.0)]


def request(
    system: str, sections: Sequence[str], answer: str, spotlight: Spotlight
) -> list[ChatMessage]:
    """A judge's request: its role and rules, then what the spotlight's marks mean, as the system
    turn; the material in sections, then the answer format (`answer`: the JSON shape), as the
    user turn."""
    closing = f"# Answer format\n\nReply with ONE JSON object and nothing else:\n{answer}"
    notice = spotlight.notice
    return [
        ChatMessage(role="system", content="\n\n".join(p for p in (system, notice) if p)),
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


def incident_sections(incident: Incident | None, spotlight: Spotlight) -> list[str]:
    """The incident under its heading, quoted; no section when it is unknown."""
    if incident is None:
        return []
    return [f"{INCIDENT_HEADING}\n{incident_section(incident, spotlight)}"]
