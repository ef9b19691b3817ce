"""TracerTraj code-generation test split: 127 failed MetaGPT-style team runs in one parquet file.

Rows look like Who&When's (history of {content, name, role, step}, mistake_agent, string
mistake_step) but carry no system prompts: every speaker is an agent with a stand-in prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from poirot_eval.case_files import CaseFileError
from poirot_eval.cases import EvalCase
from poirot_eval.trajectory import TruthError, Turn, trajectory_case

FILE = Path("tracertraj") / "tracertraj-code-test.parquet"


def load_all(data_dir: Path) -> list[EvalCase]:
    """Every row, in file order; the file is small enough to read at once."""
    rows: list[dict[str, Any]] = pq.read_table(data_dir / FILE).to_pylist()
    return [_case(row) for row in rows]


def _case(row: dict[str, Any]) -> EvalCase:
    try:
        return _trajectory(row)
    except TruthError as exc:
        raise CaseFileError(f"{FILE} case {row['question_ID']}: {exc}") from exc


def _trajectory(row: dict[str, Any]) -> EvalCase:
    history = row["history"]
    speakers = [h["name"] for h in history]
    return trajectory_case(
        "tracertraj",
        row["question_ID"],
        system="tracertraj",
        description=(
            "A software team of LLM agents (team leader, product manager, architect, engineer, "
            "data analyst) that writes a Python solution to a programming task. The task: "
            + row["question"]
        ),
        prompts=dict.fromkeys(speakers, ""),
        turns=[Turn(name=h["name"], content=h["content"]) for h in history],
        mistake_agent=row["mistake_agent"],
        mistake_step=int(row["mistake_step"]),
    )
