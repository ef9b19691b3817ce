"""Shared pieces of the eval tests: result factories, the recorded runs, hand-built cases and a
runner over them with a scripted LLM."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from poirot_eval import blame
from poirot_eval.cases import Dataset, EvalCase, GroundTruth
from poirot_eval.journal import RunJournal
from poirot_eval.results import CaseResult, Status, TokenUsage
from poirot_eval.runner import run_cases
from poirotd.config import EmbeddedLLMSpec, SystemSpec
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import AgentMessage, InvestigationMethod, MessageKind, Vote
from tests.support.data import DATA, RUNS


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


SPEC = SystemSpec.model_validate(
    {
        "system": {"name": "clinic", "description": "Two agents plan therapy on an exoskeleton."},
        "agents": [
            {"id": "doctor", "name": "Doctor", "system_prompt": "You diagnose."},
            {"id": "physio", "name": "Physio", "system_prompt": "You advise on dosing."},
        ],
        "components": [
            {"id": "exo", "name": "Exoskeleton", "type": "hardware", "description": "Gait robot."}
        ],
        "protocol": {"max_invocations": 2},
        "hazard_space": {
            "regions": [
                {"id": "doctor", "name": "Doctor", "type": "agent", "description": "x"},
                {"id": "physio", "name": "Physio", "type": "agent", "description": "x"},
                {"id": "exo", "name": "Exoskeleton", "type": "hardware", "description": "x"},
            ]
        },
    }
)
LLM = EmbeddedLLMSpec(context_tokens=4096)


def case(case_id: str, *, content: str = "Knee angle 270 degrees, continue.") -> EvalCase:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    turns = [
        ("doctor", "physio", "Patient fit for gait training."),
        ("physio", "doctor", content),
        ("doctor", "", "Agreed."),
    ]
    return EvalCase(
        dataset="whowhen",
        case_id=case_id,
        spec=SPEC,
        messages=tuple(
            AgentMessage(
                session_id=f"s-{case_id}",
                index=i,
                kind=MessageKind.AGENT,
                sender=sender,
                recipient=recipient,
                content=text,
                sent_at=t0 + timedelta(seconds=i),
            )
            for i, (sender, recipient, text) in enumerate(turns)
        ),
        truth=GroundTruth(regions=("doctor",), step=0),
    )


class Recorder:
    def __init__(self) -> None:
        self.plan: tuple[int, int] | None = None
        self.started: list[str] = []
        self.finished: list[CaseResult] = []
        self.skipped: list[tuple[str, str]] = []

    def planned(self, total: int, done: int) -> None:
        self.plan = (total, done)

    def case_started(self, c: EvalCase) -> None:
        self.started.append(c.case_id)

    def case_finished(self, result: CaseResult) -> None:
        self.finished.append(result)

    def case_skipped(self, c: EvalCase, why: str) -> None:
        self.skipped.append((c.case_id, why))


async def run(
    cases: Sequence[EvalCase],
    out: Path,
    backend: ScriptedBackend,
    method: InvestigationMethod = "poirot",
    **options: Any,
) -> Recorder:
    """`options`: the rest of run_cases' keywords (case_timeout, concurrency...)."""
    recorder = Recorder()
    await run_cases(
        cases,
        RunJournal(out),
        method=method,
        llm=LLM,
        observer=recorder,
        backend=backend,
        **options,
    )
    return recorder


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
