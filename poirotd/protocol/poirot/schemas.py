"""What the LLM must return in each of POIROT's phases, and in the baseline's vote (the Phase IV
vote): a JSON schema for constrained decoding plus a parser, built from the shared blocks of
poirotd/protocol/schemas.py (same subset, same rules: every free string bounded, everything
re-checked after decoding).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Annotated, Any, Literal, TypeVar

import structlog
from pydantic import Field, StrictInt, TypeAdapter

from poirotd.config.spec import SLUG_MAX, SLUG_PATTERN, SystemSpec
from poirotd.model import ForcedBy, Frozen, Vote
from poirotd.protocol.schemas import (
    AnswerFormat,
    InvalidAnswerError,
    bounded_text,
    json_object,
    validate_answer,
    validate_json,
)

log = structlog.get_logger(__name__)

NAME_MAX = 100
DESCRIPTION_MAX = 400
EVIDENCE_MAX = 400
QUESTION_MAX = 300
HAZARD_VECTOR_MAX = 200
JUSTIFICATION_MAX = 600
PEER_TOOL_PREFIX = "talk_to_"


def peer_tool(agent_id: str) -> str:
    """The name under which another agent is reachable in Phase III."""
    return f"{PEER_TOOL_PREFIX}{agent_id}"


# ------------------------------------------------------------------ answer models


class RegionText(Frozen):
    """Phase I's description of one declared region, found by its id (name and type, if written,
    are the spec's: the model may not rename a region)."""

    id: str
    description: str
    name: str = ""
    type: str = ""


class SubRegionText(Frozen):
    """A part of a declared component the model proposes as a region of its own; its id is
    derived from `parent` and `slug` once both are checked."""

    parent: str
    slug: str
    name: str
    description: str


class HazardSpaceAnswer(Frozen):
    """The agents, the components and the sub-regions are separate fields because llama.cpp's
    grammar converter drops `prefixItems` when `items` is given: an exact tuple is enforced, a
    tuple followed by free items is not."""

    system_name: str
    agent_regions: tuple[RegionText, ...]
    component_regions: tuple[RegionText, ...]
    sub_regions: tuple[SubRegionText, ...]
    error_vector_example: tuple[StrictInt, ...]


class SelfEvaluation(Frozen):
    role_fulfilled: bool
    anomalies_detected: bool
    description: str
    evidence: str


class PeerObservation(Frozen):
    agent_name: str
    description: str
    evidence: str


class SelfReport(Frozen):
    self_evaluation: SelfEvaluation
    peer_observations: tuple[PeerObservation, ...]
    suspected_agents: tuple[str, ...]


class AskAction(Frozen):
    action: Literal["ask"]
    peer: str
    question: str = Field(min_length=1)

    @property
    def peer_id(self) -> str:
        return self.peer.removeprefix(PEER_TOOL_PREFIX)


class VoteAnswer(Frozen):
    hazard_vector: str
    location: tuple[StrictInt, ...]
    justification: str
    # "When": the session index (#N) of the message where the fault first shows; optional, and
    # dropped by the parser when it names a message the voter never saw.
    step: StrictInt | None = None

    def as_vote(self, agent_id: str, *, forced_by: ForcedBy = "", weight: float = 0.0) -> Vote:
        """The validated answer as `agent_id`'s vote."""
        return Vote(
            agent_id=agent_id,
            location=self.location,
            hazard_vector=self.hazard_vector,
            justification=self.justification,
            weight=weight,
            forced_by=forced_by,
            step=self.step,
        )


class VoteAction(VoteAnswer):
    action: Literal["vote"]


_TURN = TypeAdapter[AskAction | VoteAction](
    Annotated[AskAction | VoteAction, Field(discriminator="action")]
)


# ------------------------------------------------------------------ formats


def hazard_space_format(spec: SystemSpec) -> AnswerFormat[HazardSpaceAnswer]:
    """Phase I: a description for every declared agent and component, under its own id and name,
    and at most `max_sub_regions` sub-regions of components. Constrained decoding fixes the ids;
    the parser checks only the shape, since which proposals enter the space is the hazard
    space's own rule (hazard_space.py), applied whatever the backend enforced."""
    limits = spec.protocol

    def declared(region_id: str, name: str, region_type: str) -> dict[str, Any]:
        return json_object(
            id={"const": region_id},
            name={"const": name},
            type={"const": region_type},
            description=bounded_text(DESCRIPTION_MAX),
        )

    def exactly(items: list[dict[str, Any]]) -> dict[str, Any]:
        # prefixItems alone lets the array stop short (llguidance, like JSON Schema, takes a
        # prefix of the tuple): minItems makes it whole. JSON Schema wants prefixItems
        # non-empty: no items at all is maxItems 0.
        if not items:
            return {"type": "array", "maxItems": 0}
        return {"type": "array", "prefixItems": items, "items": False, "minItems": len(items)}

    components = [c.id for c in spec.components]
    sub_limit = limits.max_sub_regions if components else 0
    schema = json_object(
        system_name=bounded_text(NAME_MAX),
        # The spec names the agents and components; the model writes only their error signatures.
        agent_regions=exactly([declared(a.id, a.name, "agent") for a in spec.agents]),
        component_regions=exactly([declared(c.id, c.name, c.type) for c in spec.components]),
        sub_regions={
            "type": "array",
            "items": json_object(
                parent={"enum": components},
                slug={"type": "string", "pattern": SLUG_PATTERN, "maxLength": SLUG_MAX},
                name=bounded_text(NAME_MAX),
                description=bounded_text(DESCRIPTION_MAX),
            ),
            "maxItems": sub_limit,
        }
        if components
        else exactly([]),
        error_vector_example=_bits(max_items=len(spec.region_ids) + sub_limit),
    )
    return AnswerFormat(schema, lambda text: validate_answer(HazardSpaceAnswer, text))


def report_format(agent_ids: Sequence[str]) -> AnswerFormat[SelfReport]:
    """Phase II: a self-evaluation, observations about peers, and the suspects (maybe none)."""
    names = {"enum": list(agent_ids)}
    schema = json_object(
        self_evaluation=json_object(
            role_fulfilled={"type": "boolean"},
            anomalies_detected={"type": "boolean"},
            description=bounded_text(DESCRIPTION_MAX),
            evidence=bounded_text(EVIDENCE_MAX),
        ),
        peer_observations={
            "type": "array",
            "items": json_object(
                agent_name=names,
                description=bounded_text(DESCRIPTION_MAX),
                evidence=bounded_text(EVIDENCE_MAX),
            ),
            "maxItems": len(agent_ids),
        },
        suspected_agents={"type": "array", "items": names, "maxItems": len(agent_ids)},
    )

    def parse(text: str) -> SelfReport:
        report = validate_answer(SelfReport, text)
        named = [o.agent_name for o in report.peer_observations] + list(report.suspected_agents)
        unknown = sorted(set(named) - set(agent_ids))
        if unknown:
            raise InvalidAnswerError(f"unknown agent ids {unknown}; valid ids: {list(agent_ids)}")
        return report.model_copy(
            update={"suspected_agents": tuple(dict.fromkeys(report.suspected_agents))}
        )

    return AnswerFormat(schema, parse)


def turn_format(
    peer_ids: Sequence[str], size: int, steps: Collection[int]
) -> AnswerFormat[AskAction | VoteAction]:
    """Phase III: ask one peer a question, or cast the vote (which ends the consultation).
    `steps` are the session indices the voter saw, the only ones a vote's step may name."""
    tools = [peer_tool(p) for p in peer_ids]
    # A question is never empty (AskAction): the schema says so too, or decoding could write one.
    question = {"type": "string", "minLength": 1, "maxLength": QUESTION_MAX}
    ask = json_object(action={"const": "ask"}, peer={"enum": tools}, question=question)
    vote = json_object(action={"const": "vote"}, **_vote_properties(size, steps))

    def parse(text: str) -> AskAction | VoteAction:
        action = validate_json(_TURN.validate_json, text)
        if isinstance(action, VoteAction):
            _check_location(action.location, size)
            return _seen_step(action, steps)
        if action.peer not in tools:
            raise InvalidAnswerError(f"peer must be one of {tools}, got {action.peer!r}")
        return action

    return AnswerFormat({"anyOf": [ask, vote]}, parse)


def vote_format(size: int, steps: Collection[int]) -> AnswerFormat[VoteAnswer]:
    """Phase IV (and the baseline): the private vote over the N regions; all zeros means "no
    anomaly". `steps` are the session indices the voter saw, the only ones its step may name."""

    def parse(text: str) -> VoteAnswer:
        vote = validate_answer(VoteAnswer, text)
        _check_location(vote.location, size)
        return _seen_step(vote, steps)

    return AnswerFormat(json_object(**_vote_properties(size, steps)), parse)


def _non_empty(text: str) -> str:
    if not text.strip():
        raise InvalidAnswerError("the answer was empty")
    return text.strip()


FREE_TEXT: AnswerFormat[str] = AnswerFormat(None, _non_empty)
"""A peer's answer to a question: any non-empty text."""


# ------------------------------------------------------------------ helpers


def _bits(*, max_items: int, min_items: int = 0) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "integer", "enum": [0, 1]},
        "minItems": min_items,
        "maxItems": max_items,
    }


def _vote_properties(size: int, steps: Collection[int]) -> dict[str, dict[str, Any]]:
    return {
        "hazard_vector": bounded_text(HAZARD_VECTOR_MAX),
        "location": _bits(min_items=size, max_items=size),
        "justification": bounded_text(JUSTIFICATION_MAX),
        # Required (strict structured outputs want every property listed) but nullable. A voter
        # that saw no message (a telemetry-only session) has no step to name: null is all that
        # constrained decoding then lets it write.
        "step": {"anyOf": [{"type": "integer"}, {"type": "null"}]} if steps else {"type": "null"},
    }


def _check_location(location: Sequence[int], size: int) -> None:
    if len(location) != size:
        raise InvalidAnswerError(
            f"location must have exactly {size} entries (one per region), got {len(location)}"
        )
    if any(x not in (0, 1) for x in location):
        raise InvalidAnswerError("location entries must be 0 or 1")


VoteT = TypeVar("VoteT", bound=VoteAnswer)


def _seen_step(vote: VoteT, steps: Collection[int]) -> VoteT:
    """The vote without its step when the step names a message the voter never saw: a wrong
    "when" is noted and dropped, it does not cost the vote its "where"."""
    if vote.step is None or vote.step in steps:
        return vote
    log.warning("vote step dropped: not a message the voter saw", step=vote.step)
    return vote.model_copy(update={"step": None})
