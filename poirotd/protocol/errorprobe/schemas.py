"""What each ErrorProbe call returns, as a JSON schema for constrained decoding and a parser:
the MAST tags of the session, the Strategist's hypotheses, the Investigator's evidence (claims
for the daemon's tools) and the Arbiter's verdict."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from pydantic import StrictInt

from poirotd.model import Frozen, HazardSpace
from poirotd.protocol.analyst import Probability, level_schema
from poirotd.protocol.errorprobe.mast import mode_ids
from poirotd.protocol.errorprobe.tools import Claim, claim_schemas
from poirotd.protocol.schemas import (
    AnswerFormat,
    InvalidAnswerError,
    bounded_text,
    json_object,
    validate_answer,
)

NOTE_MAX = 200
CLAIM_MAX = 300
REASONING_MAX = 400
GUARD_MAX = 300


class Tag(Frozen):
    step: StrictInt
    mode: str
    note: str


class Tags(Frozen):
    tags: tuple[Tag, ...]


class Hypothesis(Frozen):
    region: str
    step: StrictInt
    mode: str
    claim: str


class Hypotheses(Frozen):
    hypotheses: tuple[Hypothesis, ...]


class Evidence(Frozen):
    claims: tuple[Claim, ...]
    assessment: str


class Verdict(Frozen):
    # 1-based number of the hypothesis the Arbiter upholds.
    hypothesis: StrictInt
    confidence: Probability
    reasoning: str
    # What a later diagnosis should check for this pattern (memory's recipe).
    guard: str


def tags_format(steps: Collection[int], max_tags: int) -> AnswerFormat[Tags]:
    """Up to `max_tags` (step, MAST mode, note) tags on the `steps` shown; a tag repeated is
    kept once."""
    modes = mode_ids()
    tag = json_object(step=_one_of(steps), mode={"enum": modes}, note=bounded_text(NOTE_MAX))
    schema = json_object(tags={"type": "array", "items": tag, "maxItems": max_tags})

    def parse(text: str) -> Tags:
        answer = validate_answer(Tags, text)
        for t in answer.tags:
            _known(t.step, steps, "step")
            _known(t.mode, modes, "mode")
        first: dict[tuple[int, str], Tag] = {}
        for t in answer.tags:
            first.setdefault((t.step, t.mode), t)
        return Tags(tags=tuple(first.values())[:max_tags])

    return AnswerFormat(schema, parse)


def hypotheses_format(
    space: HazardSpace, steps: Collection[int], max_hypotheses: int
) -> AnswerFormat[Hypotheses]:
    """One to `max_hypotheses` hypotheses: a region of `space`, a step among `steps` (the
    causal chain), a MAST mode and the claim to investigate."""
    regions, modes = [r.id for r in space.regions], mode_ids()
    hypothesis = json_object(
        region={"enum": regions},
        step=_one_of(steps),
        mode={"enum": modes},
        claim=bounded_text(CLAIM_MAX),
    )
    schema = json_object(
        hypotheses={
            "type": "array",
            "items": hypothesis,
            "minItems": 1,
            "maxItems": max_hypotheses,
        }
    )

    def parse(text: str) -> Hypotheses:
        answer = validate_answer(Hypotheses, text)
        if not 1 <= len(answer.hypotheses) <= max_hypotheses:
            raise InvalidAnswerError(f"give between 1 and {max_hypotheses} hypotheses")
        for h in answer.hypotheses:
            _known(h.region, regions, "region")
            _known(h.step, steps, "step")
            _known(h.mode, modes, "mode")
        return answer

    return AnswerFormat(schema, parse)


def evidence_format(
    steps: Sequence[int],
    calling_steps: Sequence[int],
    signals: Sequence[tuple[str, str]],
    max_evidence: int,
) -> AnswerFormat[Evidence]:
    """One to `max_evidence` claims for the tools this chain offers, and an assessment."""
    tools = claim_schemas(steps, calling_steps, signals)
    schema = json_object(
        claims={
            "type": "array",
            "items": {"anyOf": tools} if len(tools) > 1 else tools[0],
            "minItems": 1,
            "maxItems": max_evidence,
        },
        assessment=bounded_text(REASONING_MAX),
    )

    def parse(text: str) -> Evidence:
        answer = validate_answer(Evidence, text)
        if not 1 <= len(answer.claims) <= max_evidence:
            raise InvalidAnswerError(f"give between 1 and {max_evidence} claims")
        offered = {t["properties"]["tool"]["const"] for t in tools}
        for claim in answer.claims:
            _known(claim.tool, offered, "tool")
        return answer

    return AnswerFormat(schema, parse)


def verdict_format(choices: Sequence[int]) -> AnswerFormat[Verdict]:
    """The Arbiter upholds one of the hypotheses numbered `choices`."""
    schema = json_object(
        hypothesis={"enum": list(choices)},
        confidence=level_schema(),
        reasoning=bounded_text(REASONING_MAX),
        guard=bounded_text(GUARD_MAX),
    )

    def parse(text: str) -> Verdict:
        verdict = validate_answer(Verdict, text)
        _known(verdict.hypothesis, choices, "hypothesis")
        return verdict

    return AnswerFormat(schema, parse)


def _one_of(steps: Collection[int]) -> dict[str, Any]:
    return {"enum": sorted(steps)}


def _known(value: object, allowed: Collection[Any], field: str) -> None:
    if value not in allowed:
        shown = sorted(allowed)[:20]
        raise InvalidAnswerError(f"{field} {value!r} is not one of {shown}")
