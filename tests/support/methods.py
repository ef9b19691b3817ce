"""Answers the scripted backend gives for the other attribution methods (ECHO's analysts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tests.support.protocol import REGIONS


def analysis(
    regions: Sequence[str] = ("exo",),
    confidence: float = 0.9,
    step: int | None = 6,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "summary": "read the log",
        "evaluations": [
            {"region": r.id, "likelihood": 0.8 if r.id in regions else 0.1, "evidence": "log"}
            for r in REGIONS
        ],
        "conclusion": {
            "kind": "single" if len(regions) == 1 else "multiple",
            "regions": list(regions),
            "step": step,
            "confidence": confidence,
            "reasoning": "the knee angle",
        },
        "alternatives": [],
    } | extra
