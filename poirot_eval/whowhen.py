"""Who&When (Algorithm-Generated): 126 AG2 CaptainAgent group chats that failed, one JSON each.

`mistake_step` is a string holding a 0-based index into `history`; `system_prompt` names the
agents (some with an empty prompt); other speakers, such as the code executor
"Computer_terminal", are components.
"""

from __future__ import annotations

import json
from pathlib import Path

from poirot_eval.cases import EvalCase
from poirot_eval.trajectory import Turn, trajectory_case

FOLDER = Path("whowhen") / "Algorithm-Generated"


def case_ids(data_dir: Path) -> list[str]:
    """Ids in numeric file order ("1", "2", ... "126")."""
    return sorted((p.stem for p in (data_dir / FOLDER).glob("*.json")), key=_numeric_first)


def load(data_dir: Path, case_id: str) -> EvalCase:
    record = json.loads((data_dir / FOLDER / f"{case_id}.json").read_text())
    return trajectory_case(
        "whowhen",
        case_id,
        description=(
            "A team of expert agents built by AG2 CaptainAgent that works on a task in a group "
            "chat and runs code on a computer terminal. The task: " + record["question"]
        ),
        prompts=record["system_prompt"],
        turns=[Turn(name=h["name"], content=h["content"]) for h in record["history"]],
        mistake_agent=record["mistake_agent"],
        mistake_step=int(record["mistake_step"]),
    )


def _numeric_first(stem: str) -> tuple[int, str]:
    return (int(stem), "") if stem.isdigit() else (1 << 30, stem)
