"""A scripted world for the protocol engine: the CORTEX-like spec, a session, and a backend that
routes each request by its schema to a handler per kind of answer (orchestration tests only)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from poirotd.config.spec import (
    AgentSpec,
    ComponentSpec,
    PinnedHazardSpace,
    ProtocolSpec,
    SystemInfo,
    SystemSpec,
)
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, HazardRegion, HazardSpace, MessageKind
from poirotd.protocol.engine import InvestigationEngine, ProtocolOutcome
from poirotd.protocol.events import ProtocolEvent
from poirotd.protocol.prompts import Incident
from poirotd.protocol.spotlight import CLOSE, OPEN, TOKEN_LETTERS, Spotlight

AGENTS = (
    AgentSpec(id="doctor", name="Diagnosis Doctor", system_prompt="You are the diagnosis doctor."),
    AgentSpec(id="chief", name="Chief of Rehabilitation", system_prompt="You are the chief."),
    AgentSpec(id="physio", name="Physiotherapist", system_prompt="You are the physiotherapist."),
)
REGIONS = (
    *(
        HazardRegion(id=a.id, name=a.name, type="agent", description="Error signature: x.")
        for a in AGENTS
    ),
    HazardRegion(id="exo", name="Exoskeleton", type="hardware", description="Error signature: y."),
)
EXO = 3


def make_spec(*, pinned: bool = True, **protocol: Any) -> SystemSpec:
    return SystemSpec(
        system=SystemInfo(
            name="cortex", description="Rehabilitation of a child with an exoskeleton."
        ),
        agents=AGENTS,
        components=(
            ComponentSpec(id="exo", name="Exoskeleton", type="hardware", description="Gait robot."),
        ),
        protocol=ProtocolSpec(**protocol),
        hazard_space=PinnedHazardSpace(regions=REGIONS) if pinned else None,
    )


def agent_message(
    index: int, kind: MessageKind, sender: str, recipient: str = "", **kw: Any
) -> AgentMessage:
    return AgentMessage(
        session_id="s1",
        index=index,
        kind=kind,
        sender=sender,
        recipient=recipient,
        sent_at=datetime(2025, 1, 1, tzinfo=UTC),
        **kw,
    )


SESSION = (
    agent_message(0, MessageKind.HUMAN, "operator", "doctor", content="Assess the patient."),
    agent_message(1, MessageKind.AGENT, "doctor", "", tool_calls=("patient_retriever_tool",)),
    agent_message(
        2,
        MessageKind.TOOL,
        "doctor",
        "doctor",
        tool_name="patient_retriever_tool",
        content="Age 9, CP.",
    ),
    agent_message(
        3, MessageKind.AGENT, "doctor", "chief", content="Report: fit for gait training."
    ),
    agent_message(4, MessageKind.AGENT, "chief", "physio", content="Plan 2, please confirm."),
    agent_message(5, MessageKind.AGENT, "physio", "chief", content="Confirmed."),
    agent_message(6, MessageKind.SYSTEM, "exo", "", content="knee angle 270 deg"),
    agent_message(7, MessageKind.AGENT, "physio", "", content="The knee angle is impossible."),
)

# ------------------------------------------------------------------ scripted world

Handler = Callable[[str, Sequence[ChatMessage]], Any]


def kind_of(schema: dict[str, Any] | None) -> str:
    if schema is None:
        return "answer"
    if "anyOf" in schema:
        return "turn"
    props = schema["properties"]
    if "agent_regions" in props:
        return "hazard_space"
    return "report" if "self_evaluation" in props else "vote"


def who(messages: Sequence[ChatMessage]) -> str:
    """The agent whose request this is, by its system prompt (the spotlight's notice follows)."""
    system = messages[0].content
    return next((a.id for a in AGENTS if system.startswith(a.system_prompt)), "builder")


def spotlight_of(world: World) -> Spotlight:
    """The spotlight the world's (one) investigation quoted under, read off its first request."""
    system = "\n".join(c.messages[0].content for c in world.backend.calls)
    found = re.search(f"{OPEN}([a-z]{{{TOKEN_LETTERS}}}){CLOSE}", system)
    assert found, "no spotlight token in the system turns"
    return Spotlight("lines", found.group(1))


def vote_json(location: Sequence[int] = (0, 0, 0, 1), *, action: bool = False) -> str:
    vote: dict[str, Any] = {"action": "vote"} if action else {}
    vote |= {"hazard_vector": "sensor", "location": list(location), "justification": "angles"}
    return json.dumps(vote)


def stepped_vote(step: int | None, location: Sequence[int] = (0, 0, 0, 1), **extra: Any) -> str:
    vote = {"hazard_vector": "sensor", "location": list(location), "justification": "angles"}
    return json.dumps(extra | vote | {"step": step})


def default_hazard_space(agent: str, messages: Sequence[ChatMessage]) -> str:
    return hazard_space_json([r.model_dump() for r in REGIONS])


def hazard_space_json(
    regions: Sequence[dict[str, Any]], agents: int = 3, sub_regions: Sequence[dict[str, Any]] = ()
) -> str:
    return json.dumps(
        {
            "system_name": "cortex",
            "agent_regions": list(regions[:agents]),
            "component_regions": list(regions[agents:]),
            "sub_regions": list(sub_regions),
            "error_vector_example": [0, 0, 0, 1],
        }
    )


def default_report(agent: str, messages: Sequence[ChatMessage]) -> str:
    suspects = ["physio"] if agent != "physio" else []
    return json.dumps(
        {
            "self_evaluation": {
                "role_fulfilled": True,
                "anomalies_detected": False,
                "description": "fine",
                "evidence": "N/A",
            },
            "peer_observations": [],
            "suspected_agents": suspects,
        }
    )


def ask_once_then_vote(agent: str, messages: Sequence[ChatMessage]) -> str:
    if any(m.role == "user" and m.content.startswith("Answer from") for m in messages):
        return vote_json(action=True)
    return always_ask(agent, messages)


def always_ask(agent: str, messages: Sequence[ChatMessage]) -> str:
    ids = [a.id for a in AGENTS]
    peer = ids[(ids.index(agent) + 1) % len(ids)]  # doctor → chief → physio → doctor
    return json.dumps({"action": "ask", "peer": f"talk_to_{peer}", "question": "What did you see?"})


class World:
    """Routes each request by its schema to a handler; a handler may be async or raise."""

    def __init__(self, **handlers: Handler) -> None:
        self.handlers: dict[str, Handler] = {
            "hazard_space": default_hazard_space,
            "report": default_report,
            "turn": ask_once_then_vote,
            "answer": lambda agent, messages: "The exoskeleton reported 270 degrees.",
            "vote": lambda agent, messages: vote_json(),
        } | handlers
        self.backend = ScriptedBackend(self)
        self.events: list[ProtocolEvent] = []

    def __call__(self, messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> Any:
        return self.handlers[kind_of(schema)](who(messages), messages)

    async def sink(self, event: ProtocolEvent) -> None:
        self.events.append(event)

    def calls(self, kind: str, agent: str | None = None) -> list[tuple[ChatMessage, ...]]:
        return [
            c.messages
            for c in self.backend.calls
            if kind_of(c.schema) == kind and (agent is None or who(c.messages) == agent)
        ]

    def of(self, event_type: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, event_type)]


class MemoryCache:
    def __init__(self) -> None:
        self.spaces: dict[tuple[str, str], HazardSpace] = {}

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None:
        return self.spaces.get((system, version))

    async def put_hazard_space(self, space: HazardSpace) -> None:
        self.spaces[(space.system, space.version)] = space


async def investigate(
    world: World,
    spec: SystemSpec | None = None,
    cache: MemoryCache | None = None,
    incident: Incident | None = None,
) -> ProtocolOutcome:
    engine = InvestigationEngine(spec or make_spec(), world.backend, cache or MemoryCache())
    return await engine.run(SESSION, world.sink, incident=incident)
