"""Shared pieces of the eval tests: where the data is, result factories, the recorded runs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from poirot_eval import blame
from poirot_eval.cases import Dataset, GroundTruth
from poirot_eval.results import CaseResult, Status, TokenUsage
from poirotd.model import InvestigationMethod, Vote

# The shared data folder sits beside the checkout (as it does for CI).
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
RUNS = DATA / "poirot-runs"


def one_hot(region_ids: Sequence[str], *chosen: str) -> tuple[int, ...]:
    return tuple(int(r in chosen) for r in region_ids)


def result(
    region_ids: Sequence[str],
    truth: Sequence[str],
    predicted: Sequence[str] = (),
    *,
    dataset: Dataset = "whowhen",
    method: InvestigationMethod = "poirot",
    case_id: str = "c",
    status: Status = "ok",
    step: int | None = None,
    truth_step: int | None = None,
    votes: Sequence[Vote] = (),
    tokens: TokenUsage | None = None,
    seconds: float = 0.0,
) -> CaseResult:
    return CaseResult(
        case_id=case_id,
        dataset=dataset,
        method=method,
        status=status,
        region_ids=tuple(region_ids),
        decision=one_hot(region_ids, *predicted) if status == "ok" else (),
        step=step,
        truth=GroundTruth(regions=tuple(truth), step=truth_step),
        votes=tuple(votes),
        tokens=tokens or TokenUsage(),
        seconds=seconds,
    )


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / name).read_text())
    return data


def recorded_result(name: str, dataset: Dataset) -> CaseResult:
    """A POIROT-web run as a CaseResult: its winning vector, scores, votes and recorded truth."""
    run = recorded(name)
    voting = run["voting_data"]
    ids = blame.region_ids(DATA, dataset)
    truth_bits = (
        run.get("ground_truth_vector") or voting["ground_truth_comparison"]["ground_truth_vector"]
    )
    votes = tuple(
        Vote(
            agent_id=_voter(v, ids),
            location=tuple(v["voted_location"]),
            weight=v["vote_weight"],
        )
        for v in voting["agent_votes"]
    )
    return CaseResult(
        case_id=f"{name}",
        dataset=dataset,
        method="poirot",
        status="ok",
        region_ids=ids,
        decision=tuple(voting["winning_location"]["vector"]),
        scores=tuple(voting["dimension_scores"]),
        truth=GroundTruth(regions=tuple(r for r, b in zip(ids, truth_bits, strict=True) if b)),
        votes=votes,
    )


def _voter(vote: dict[str, Any], ids: tuple[str, ...]) -> str:
    """By recorded position; TradingAgents' trader has an all-zero position, so then by name."""
    position: list[int] = vote["agent_position"]
    return ids[position.index(1)] if 1 in position else blame.agent_id(vote["agent_name"])
