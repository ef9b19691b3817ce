"""ECHO's confidence-weighted consensus and its disagreement report. Pure functions, no I/O.

Each analyst's primary conclusion is a ballot with its confidence. Ballots below δ are left
out. Among the rest, the conclusion kind (single or multiple regions) with the highest total
confidence wins; within it every ballot adds its confidence to each region it names (ω_a) and to
its step (ω_s). A single conclusion is the region with the most ω_a (ties kept, as POIROT reports
them); a multiple one is every region with ω_a ≥ δ. The step is the one with the most ω_s (a tie
goes to the earliest step, the first sign of the fault). The consensus confidence is the winning
ballots' mean confidence.

The disagreement report (the paper's φ): how many conclusion kinds and distinct attributions the
counted ballots hold, the spread of their confidences (max - min), whether the consensus step was
sent by a region the consensus blames, and whether the case needs a human: when two counted
ballots with confidence of at least HIGH_CONFIDENCE blame different regions, or the spread
exceeds REVIEW_SPREAD.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poirotd.model import Frozen
from poirotd.protocol.aggregation import TIE_TOLERANCE, heaviest_step

HIGH_CONFIDENCE = 0.7
REVIEW_SPREAD = 0.5


@dataclass(frozen=True)
class Ballot:
    """One analyst's primary conclusion as the consensus counts it."""

    analyst: str
    kind: str
    regions: tuple[str, ...]
    step: int | None
    confidence: float


class Disagreement(Frozen):
    conclusion_kinds: int
    attributions: int
    confidence_spread: float
    # None when the consensus names no step.
    step_consistent: bool | None
    conflicting_high_confidence: bool
    requires_review: bool


class Consensus(Frozen):
    # None: no ballot reached δ, so there is no consensus.
    kind: str | None
    regions: tuple[str, ...]
    # ω_a and ω_s over the winning kind's ballots.
    region_votes: dict[str, float]
    step: int | None
    step_votes: dict[int, float]
    confidence: float
    # Analysts whose ballot reached δ, and those left out.
    counted: tuple[str, ...]
    below_delta: tuple[str, ...]
    disagreement: Disagreement


def consensus(ballots: Sequence[Ballot], delta: float, senders: Mapping[int, str]) -> Consensus:
    """The consensus of `ballots` at threshold `delta`; `senders` maps a session index to the
    id of who sent that message (for the step's consistency with the regions)."""
    counted = [b for b in ballots if b.confidence >= delta]
    totals: dict[str, float] = defaultdict(float)
    for b in counted:
        totals[b.kind] += b.confidence
    kind = _best(totals)
    winning = [b for b in counted if b.kind == kind]
    region_votes: dict[str, float] = defaultdict(float)
    step_votes: dict[int, float] = defaultdict(float)
    for b in winning:
        for region in b.regions:
            region_votes[region] += b.confidence
        if b.step is not None:
            step_votes[b.step] += b.confidence
    if kind == "multiple":
        regions = tuple(r for r, w in region_votes.items() if w >= delta - TIE_TOLERANCE)
    else:
        best = max(region_votes.values(), default=0.0)
        regions = tuple(r for r, w in region_votes.items() if w >= best - TIE_TOLERANCE)
    step = heaviest_step(step_votes)
    confidence = sum(b.confidence for b in winning) / len(winning) if winning else 0.0
    return Consensus(
        kind=kind,
        regions=regions,
        region_votes=dict(region_votes),
        step=step,
        step_votes=dict(step_votes),
        confidence=confidence,
        counted=tuple(b.analyst for b in counted),
        below_delta=tuple(b.analyst for b in ballots if b.confidence < delta),
        disagreement=disagreement(counted, regions, step, senders),
    )


def disagreement(
    counted: Sequence[Ballot],
    regions: Sequence[str],
    step: int | None,
    senders: Mapping[int, str],
) -> Disagreement:
    confidences = [b.confidence for b in counted]
    spread = max(confidences) - min(confidences) if confidences else 0.0
    confident = {frozenset(b.regions) for b in counted if b.confidence >= HIGH_CONFIDENCE}
    conflicting = len(confident) > 1
    return Disagreement(
        conclusion_kinds=len({b.kind for b in counted}),
        attributions=len({frozenset(b.regions) for b in counted}),
        confidence_spread=spread,
        step_consistent=None if step is None else senders.get(step) in regions,
        conflicting_high_confidence=conflicting,
        requires_review=conflicting or spread > REVIEW_SPREAD,
    )


def _best(totals: Mapping[str, float]) -> str | None:
    """The key with the highest total; a tie goes to "single" (the paper's default kind)."""
    if not totals:
        return None
    best = max(totals.values())
    tied = [k for k, v in totals.items() if v >= best - TIE_TOLERANCE]
    return "single" if "single" in tied else tied[0]
