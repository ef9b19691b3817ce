"""What an ECHO analyst returns, as a JSON schema for constrained decoding and a parser.

The paper's four parts: a summary of the investigation; an evaluation of every region (the
likelihood that the fault originated there, and the evidence); the primary conclusion (one region
or several, the step where the fault first shows, a confidence); alternative hypotheses in the
same shape. Likelihoods and confidences are levels (`poirotd.protocol.analyst`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Literal

from pydantic import StrictInt

from poirotd.model import Frozen, HazardSpace
from poirotd.protocol.analyst import Probability, level_schema
from poirotd.protocol.schemas import (
    AnswerFormat,
    InvalidAnswerError,
    bounded_text,
    json_object,
    validate_answer,
)

SUMMARY_MAX = 300
EVIDENCE_MAX = 300
REASONING_MAX = 400
MAX_ALTERNATIVES = 2


class RegionEvaluation(Frozen):
    region: str
    likelihood: Probability
    evidence: str


class Conclusion(Frozen):
    # single: the fault has one origin; multiple: several regions contributed.
    kind: Literal["single", "multiple"]
    regions: tuple[str, ...]
    step: StrictInt | None
    confidence: Probability
    reasoning: str


class Analysis(Frozen):
    summary: str
    evaluations: tuple[RegionEvaluation, ...]
    conclusion: Conclusion
    alternatives: tuple[Conclusion, ...]


def analysis_format(space: HazardSpace, steps: Collection[int]) -> AnswerFormat[Analysis]:
    """An analyst's answer over the regions of `space`; a step must be one of `steps` (the
    session indices the analyst was shown), else it is dropped, not the analysis."""
    ids = [r.id for r in space.regions]
    region = {"enum": ids}
    level = level_schema()
    step = {"anyOf": [{"enum": sorted(steps)}, {"type": "null"}]} if steps else {"type": "null"}

    def conclusion_of(kind: str, least: int, most: int) -> dict[str, Any]:
        return json_object(
            kind={"const": kind},
            regions={"type": "array", "items": region, "minItems": least, "maxItems": most},
            step=step,
            confidence=level,
            reasoning=bounded_text(REASONING_MAX),
        )

    # The kind decides how many regions: one, or at least two (constrained, not just checked).
    single = conclusion_of("single", 1, 1)
    conclusion = (
        {"anyOf": [single, conclusion_of("multiple", 2, len(ids))]} if len(ids) > 1 else single
    )
    schema: dict[str, Any] = json_object(
        summary=bounded_text(SUMMARY_MAX),
        evaluations={
            "type": "array",
            "items": json_object(
                region=region, likelihood=level, evidence=bounded_text(EVIDENCE_MAX)
            ),
            "maxItems": len(ids),
        },
        conclusion=conclusion,
        alternatives={"type": "array", "items": conclusion, "maxItems": MAX_ALTERNATIVES},
    )

    def parse(text: str) -> Analysis:
        analysis = validate_answer(Analysis, text)
        conclusions = (analysis.conclusion, *analysis.alternatives)
        named = {e.region for e in analysis.evaluations} | {
            r for c in conclusions for r in c.regions
        }
        unknown = sorted(named - set(ids))
        if unknown:
            raise InvalidAnswerError(f"unknown region ids {unknown}; valid ids: {ids}")
        if len(analysis.alternatives) > MAX_ALTERNATIVES:
            raise InvalidAnswerError(f"at most {MAX_ALTERNATIVES} alternatives")
        return analysis.model_copy(
            update={
                "evaluations": _first_per_region(analysis.evaluations),
                "conclusion": _checked(analysis.conclusion, steps, "conclusion"),
                "alternatives": tuple(
                    _checked(c, steps, f"alternatives[{i}]")
                    for i, c in enumerate(analysis.alternatives)
                ),
            }
        )

    return AnswerFormat(schema, parse)


def _checked(conclusion: Conclusion, steps: Collection[int], where: str) -> Conclusion:
    """Regions deduplicated and matching the kind; a step the analyst was not shown dropped.

    A "multiple" conclusion that names one region more than once blames that region alone, so it
    reads as "single": the schema can ask for two items but not for two distinct ones (llama.cpp's
    grammars have no uniqueItems), and a small model fills the second with the first."""
    regions = tuple(dict.fromkeys(conclusion.regions))
    if not regions:
        raise InvalidAnswerError(f"{where}.regions names no region")
    if conclusion.kind == "single" and len(regions) != 1:
        raise InvalidAnswerError(f"{where}: kind 'single' names exactly one region")
    if conclusion.kind == "multiple" and len(conclusion.regions) < 2:
        raise InvalidAnswerError(f"{where}: kind 'multiple' names at least two regions")
    kind = "single" if len(regions) == 1 else conclusion.kind
    step = conclusion.step if conclusion.step in steps else None
    return conclusion.model_copy(update={"kind": kind, "regions": regions, "step": step})


def _first_per_region(
    evaluations: tuple[RegionEvaluation, ...],
) -> tuple[RegionEvaluation, ...]:
    """A region evaluated twice keeps its first evaluation."""
    seen: dict[str, RegionEvaluation] = {}
    for e in evaluations:
        seen.setdefault(e.region, e)
    return tuple(seen.values())
