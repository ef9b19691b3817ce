"""Labelled clinic cases for canaries and campaign seeding: the scripted answers vote for the
doctor (region 0), so a case labelled "doctor" is one they get right."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from poirotd.campaigns.labelled import GroundTruth, LabelledCase
from poirotd.devtools.clinic import CLINIC, CLINIC_AGENTS
from poirotd.model import AgentMessage, MessageKind

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def labelled(case_id: str = "c1", truth: tuple[str, ...] = ("doctor",)) -> LabelledCase:
    """A four-message clinic session labelled with `truth`."""
    messages = tuple(
        AgentMessage(
            session_id="original",
            index=i,
            kind=MessageKind.AGENT,
            sender=CLINIC_AGENTS[i % 3],
            content=f"step {i}",
            sent_at=T0 + timedelta(seconds=i),
        )
        for i in range(4)
    )
    return LabelledCase(
        dataset="campaign",
        case_id=case_id,
        spec=CLINIC,
        messages=messages,
        truth=GroundTruth(regions=truth),
    )


def write_case(folder: Path, case: LabelledCase, **extra: Any) -> Path:
    """`case` as a one-case JSON file in `folder`, with `extra` top-level fields (a campaign's
    fault description, say)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case.case_id}.json"
    path.write_text(json.dumps(case.model_dump(mode="json") | extra))
    return path
