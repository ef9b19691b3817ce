"""Every structured answer poirotd asks an LLM for, as the schema vLLM decodes it under and the
parser that then reads it: per method (POIROT phases I-IV, baseline, ECHO, ErrorProbe) and phase,
over the spec variations that change the schema (number of agents and regions, sub-regions,
whether the voter saw any message, Phase III as an action object or as tool calls).

A Phase III turn as tool calls is offered with `tool_choice: "required"`, which vLLM decodes under
the array schema it builds from the tools (`required_tool_schema`); the answer reaches poirotd as
tool calls, read by the same ToolFormat the daemon uses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from poirotd.config.spec import AgentSpec, ComponentSpec, ProtocolSpec, SystemInfo, SystemSpec
from poirotd.llm.base import Completion, ToolCall
from poirotd.model import HazardRegion, HazardSpace
from poirotd.protocol.echo.schemas import analysis_format
from poirotd.protocol.errorprobe.schemas import (
    evidence_format,
    hypotheses_format,
    tags_format,
    verdict_format,
)
from poirotd.protocol.poirot.peer_tools import turn_tools
from poirotd.protocol.poirot.schemas import (
    hazard_space_format,
    report_format,
    turn_format,
    vote_format,
)
from poirotd.protocol.schemas import AnswerFormat, InvalidAnswerError
from tests.support.vllm_grammars import required_tool_schema


@dataclass(frozen=True)
class RequestFormat:
    """One schema poirotd sends, named "method/phase/variation", and its parser (raises
    InvalidAnswerError, or ValueError, on an answer poirotd does not take)."""

    name: str
    schema: dict[str, Any]
    parse: Callable[[str], object]
    # The part of the schema poirotd takes, when narrower: vLLM's schema for tool_choice
    # "required" lets a model call several tools, poirotd takes one call per turn.
    taken: dict[str, Any] | None = None

    @property
    def answered(self) -> dict[str, Any]:
        """The schema answers are drawn from: what poirotd takes."""
        return self.taken or self.schema

    def __str__(self) -> str:
        return self.name


def system(agents: int, components: int, *, max_sub_regions: int = 16) -> SystemSpec:
    """A system of `agents` agents and `components` hardware components."""
    return SystemSpec(
        system=SystemInfo(name="plant", description="A multi-agent system under watch."),
        agents=tuple(
            AgentSpec(id=f"agent_{i}", name=f"Agent {i}", system_prompt="You are an agent.")
            for i in range(agents)
        ),
        components=tuple(
            ComponentSpec(id=f"part_{i}", name=f"Part {i}", type="hardware", description="A part.")
            for i in range(components)
        ),
        protocol=ProtocolSpec(max_sub_regions=max_sub_regions),
    )


def space(spec: SystemSpec, sub_regions: int = 0) -> HazardSpace:
    """The spec's agents and components as regions, plus `sub_regions` parts of the first
    component (as Phase I may add)."""
    regions = [
        *(HazardRegion(id=a.id, name=a.name, type="agent", description="x") for a in spec.agents),
        *(
            HazardRegion(id=c.id, name=c.name, type=c.type, description="x")
            for c in spec.components
        ),
        *(
            HazardRegion(
                id=f"{spec.components[0].id}.sub_{i}", name="Sub", type="hardware", description="x"
            )
            for i in range(sub_regions)
        ),
    ]
    return HazardSpace(system=spec.system.name, version="v1", regions=tuple(regions), source="spec")


# (agents, components, sub-regions): two agents alone, CORTEX's shape, TradingAgents' size.
SYSTEMS = ((2, 0, 0), (3, 1, 2), (12, 3, 0))
# The session indices a voter saw: none (a telemetry-only session), or some.
STEPS: tuple[frozenset[int], ...] = (frozenset(), frozenset({0, 1, 2, 5, 8}))


def _named(name: str, fmt: AnswerFormat[Any]) -> RequestFormat:
    assert fmt.schema is not None, name
    return RequestFormat(name, fmt.schema, fmt.parse)


def poirot_formats() -> list[RequestFormat]:
    formats = []
    for agents, components, subs in SYSTEMS:
        spec = system(agents, components)
        size = agents + components + subs
        shape = f"{agents}a{components}c{subs}s"
        formats.append(_named(f"poirot/phase1-hazard-space/{shape}", hazard_space_format(spec)))
        formats.append(_named(f"poirot/phase2-report/{shape}", report_format(spec.agent_ids)))
        peers = spec.agent_ids[1:]
        for steps in STEPS:
            seen = f"{shape}-{len(steps)}steps"
            turn = turn_format(peers, size, steps)
            formats.append(_named(f"poirot/phase3-action-object/{seen}", turn))
            formats.append(_tool_turn(f"poirot/phase3-tool-calls/{seen}", peers, size, steps))
            formats.append(_named(f"poirot/phase4-vote/{seen}", vote_format(size, steps)))
            formats.append(_named(f"baseline/vote/{seen}", vote_format(size, steps)))
    # Phase I without room for sub-regions (max_sub_regions: 0).
    spec = system(3, 1, max_sub_regions=0)
    formats.append(
        _named("poirot/phase1-hazard-space/3a1c-no-sub-regions", hazard_space_format(spec))
    )
    return formats


def _tool_turn(name: str, peers: Sequence[str], size: int, steps: frozenset[int]) -> RequestFormat:
    """Phase III as tool calls with tool_choice "required": vLLM's array schema over the tools,
    its answer turned into tool calls as vLLM does, read by poirotd's ToolFormat."""
    tool_format = turn_tools(peers, size, steps)
    offered = [{"type": "function", "function": t.model_dump()} for t in tool_format.tools]

    def parse(text: str) -> object:
        calls = json.loads(text)
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls
        ):
            raise ValueError("vLLM reads a list of {name, parameters}")
        completion = Completion(
            text="",
            prompt_tokens=0,
            completion_tokens=0,
            tool_calls=tuple(
                ToolCall(
                    id=f"call_{i}",
                    name=c["name"],
                    arguments=json.dumps(c.get("parameters"), ensure_ascii=False),
                )
                for i, c in enumerate(calls)
            ),
        )
        return tool_format.read(completion)

    schema = required_tool_schema(offered)
    return RequestFormat(name, schema, parse, taken=schema | {"maxItems": 1})


def echo_formats() -> list[RequestFormat]:
    formats = []
    for agents, components, subs in ((1, 0, 0), *SYSTEMS):
        regions = space(system(agents, components), subs)
        for steps in STEPS:
            name = f"echo/analysis/{regions.size}regions-{len(steps)}steps"
            formats.append(_named(name, analysis_format(regions, steps)))
    return formats


def errorprobe_formats() -> list[RequestFormat]:
    """ErrorProbe diagnoses sessions with messages only: its steps are never empty."""
    steps = sorted(STEPS[1])
    formats = [
        _named("errorprobe/detector-tags/default", tags_format(steps, 8)),
        _named("errorprobe/detector-tags/one-tag", tags_format(steps[:1], 1)),
        _named("errorprobe/arbiter-verdict/3-hypotheses", verdict_format([1, 2, 3])),
        _named("errorprobe/arbiter-verdict/1-hypothesis", verdict_format([1])),
    ]
    for agents, components, subs in SYSTEMS:
        regions = space(system(agents, components), subs)
        formats.append(
            _named(
                f"errorprobe/strategist-hypotheses/{regions.size}regions",
                hypotheses_format(regions, steps, 3),
            )
        )
    signals = [("part_0", "torque"), ("part_0", "angle"), ("part_1", "torque")]
    for calling, readings, label in (
        ([], [], "quote-only"),
        ([1, 5], [], "quote-tool-result"),
        ([1], signals, "all-tools"),
    ):
        formats.append(
            _named(
                f"errorprobe/investigator-evidence/{label}",
                evidence_format(steps, calling, readings, 3),
            )
        )
    return formats


def all_formats() -> list[RequestFormat]:
    return [*poirot_formats(), *echo_formats(), *errorprobe_formats()]


def rejects(fmt: RequestFormat, text: str) -> bool:
    """Whether poirotd refuses `text` as an answer to `fmt`."""
    try:
        fmt.parse(text)
    except (InvalidAnswerError, ValueError):
        return True
    return False
