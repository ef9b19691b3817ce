"""Who&When, both subsets, as published (github.com/ag2ai/Agents_Failure_Attribution), one JSON
file per failed run.

Algorithm-Generated: 126 AG2 CaptainAgent group chats. `system_prompt` names the agents (some
with an empty prompt); each `history` entry has the speaker's `name`; other speakers, such as the
code executor "Computer_terminal", are components.

Hand-Crafted: 58 Magentic-One runs. No `system_prompt`; each `history` entry has only a `role`,
which is the speaker and sometimes where the turn went: "Orchestrator (-> WebSurfer)" (an
instruction to WebSurfer), "Orchestrator (thought)" (the Orchestrator's own ledger, seen by no
one else), "WebSurfer". A tool output can run to ~90,000 characters; it is kept whole (the
context budget shortens prompts, not the session).

In both, `mistake_step` is a string holding a 0-based index into `history`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from poirot_eval.case_files import CaseFileError, read_record
from poirot_eval.cases import Benchmark, Dataset, EvalCase
from poirot_eval.trajectory import TruthError, Turn, trajectory_case

Subset = Literal["algorithm-generated", "hand-crafted"]
SUBSETS: dict[Subset, Benchmark] = {
    "algorithm-generated": "whowhen",
    "hand-crafted": "whowhen-hand-crafted",
}
FOLDERS: dict[Dataset, Path] = {
    "whowhen": Path("whowhen") / "Algorithm-Generated",
    "whowhen-hand-crafted": Path("whowhen") / "Hand-Crafted",
}

# ------------------------------------------------------------------ the published formats

StepIndex = Annotated[int, Field(ge=0)]  # published as a string of digits ("12")


class _Format(BaseModel):
    # Fields a loader does not use (ground_truth, question_ID, level, is_correct, ...) vary
    # between files and subsets; they are ignored, not required.
    model_config = ConfigDict(extra="ignore", frozen=True)


class GeneratedTurn(_Format):
    name: str = Field(min_length=1)
    content: str


class GeneratedLog(_Format):
    question: str
    system_prompt: dict[str, str]
    history: list[GeneratedTurn] = Field(min_length=1)
    mistake_agent: str
    mistake_step: StepIndex


# SPEAKER, SPEAKER (-> RECIPIENT) or SPEAKER (NOTE), spaces around each part allowed.
_ROLE = re.compile(
    r"\s*(?P<name>[^()]*[^()\s])\s*"
    r"(?:\(\s*(?:->\s*(?P<to>[^()]*[^()\s])|(?P<note>(?!->)[^()]*[^()\s]))\s*\))?\s*"
)


class HandCraftedTurn(_Format):
    role: str
    content: str

    @field_validator("role")
    @classmethod
    def _speaker_with_optional_target(cls, role: str) -> str:
        if _ROLE.fullmatch(role) is None:
            raise ValueError("expected SPEAKER, SPEAKER (-> RECIPIENT) or SPEAKER (NOTE)")
        return role

    def as_turn(self) -> Turn:
        """The speaker; a recipient after "->"; a note such as "thought" makes the turn the
        speaker's own (kept in front of the content, as the log shows it)."""
        match = _ROLE.fullmatch(self.role)
        assert match is not None  # checked on validation
        name, to, note = match["name"], match["to"], match["note"]
        if note:
            return Turn(name=name, content=f"({note})\n{self.content}", recipient=name)
        return Turn(name=name, content=self.content, recipient=to or "")


class HandCraftedLog(_Format):
    question: str
    history: list[HandCraftedTurn] = Field(min_length=1)
    mistake_agent: str
    mistake_step: StepIndex

    @model_validator(mode="before")
    @classmethod
    def _not_algorithm_generated(cls, data: Any) -> Any:
        if isinstance(data, dict) and "system_prompt" in data:
            raise ValueError(
                "has a system_prompt: an Algorithm-Generated log (--subset algorithm-generated)"
            )
        return data


_STEP = '"mistake_step": "<0-based index into history>"'
GENERATED_SHAPE = (
    'a Who&When Algorithm-Generated log {"question": str, "system_prompt": {AGENT: str}, '
    f'"history": [{{"name": SPEAKER, "content": str}}], "mistake_agent": AGENT, {_STEP}}} '
    "(a Hand-Crafted log has no system_prompt: --subset hand-crafted)"
)
HAND_CRAFTED_SHAPE = (
    'a Who&When Hand-Crafted log {"question": str, "history": [{"role": "Orchestrator (-> '
    'WebSurfer)" | "Orchestrator (thought)" | "WebSurfer" | ..., "content": str}], '
    f'"mistake_agent": AGENT, {_STEP}}}'
)

# ------------------------------------------------------------------ the systems

# Magentic-One's team in the order its roles are introduced; the logs call the Coder "Assistant".
MAGENTIC_ONE_AGENTS = {
    "Orchestrator": (
        "the lead agent: it plans the task, keeps a ledger of facts, guesses and progress, "
        "picks the next agent and tells it what to do, re-plans when stuck, and gives the final "
        "answer"
    ),
    "WebSurfer": (
        "drives a Chromium web browser: searches, visits pages, clicks, types, scrolls and "
        "reports what the page shows"
    ),
    "FileSurfer": "reads local files (documents, spreadsheets, slides, audio) and reports them",
    "Assistant": (
        "the Coder: writes Python and shell code for the ComputerTerminal to run, and analyses "
        "and reasons over what the others found"
    ),
}
MAGENTIC_ONE = (
    "Magentic-One (AutoGen), a generalist team of agents that solves a web or file task "
    "together. The Orchestrator plans the task, keeps a ledger of facts and progress, and at "
    "each step directs one agent: WebSurfer (a web browser), FileSurfer (local files), the Coder "
    '(logged as "Assistant": writes code and reasons) and ComputerTerminal (runs the Coder\'s '
    "code; a tool, not an LLM). A human states the task. The task: "
)
CAPTAIN_AGENT = (
    "A team of expert agents built by AG2 CaptainAgent that works on a task in a group chat and "
    "runs code on a computer terminal. The task: "
)
_NOT_AGENTS = frozenset({"human", "ComputerTerminal"})


# ------------------------------------------------------------------ loading


def case_ids(data_dir: Path, dataset: Dataset) -> list[str]:
    """Ids in numeric file order ("1", "2", ... "126")."""
    return sorted((p.stem for p in (data_dir / FOLDERS[dataset]).glob("*.json")), key=_numeric)


def load(data_dir: Path, dataset: Dataset, case_id: str) -> EvalCase:
    """One case of either subset; raises CaseFileError naming the file and what is wrong."""
    path = data_dir / FOLDERS[dataset] / f"{case_id}.json"
    if dataset == "whowhen-hand-crafted":
        return _hand_crafted(path, case_id)
    return _generated(path, case_id)


def _generated(path: Path, case_id: str) -> EvalCase:
    log = read_record(path, GeneratedLog, GENERATED_SHAPE)
    return _case(
        path,
        GENERATED_SHAPE,
        "whowhen",
        case_id,
        system="whowhen",
        description=CAPTAIN_AGENT + log.question,
        prompts=log.system_prompt,
        turns=[Turn(name=t.name, content=t.content) for t in log.history],
        mistake_agent=log.mistake_agent,
        mistake_step=log.mistake_step,
    )


def _hand_crafted(path: Path, case_id: str) -> EvalCase:
    log = read_record(path, HandCraftedLog, HAND_CRAFTED_SHAPE)
    turns = [t.as_turn() for t in log.history]
    named = dict.fromkeys(n for t in turns for n in (t.name, t.recipient) if n)
    agents = [a for a in MAGENTIC_ONE_AGENTS if a in named]
    agents += [n for n in named if n not in MAGENTIC_ONE_AGENTS and n not in _NOT_AGENTS]
    return _case(
        path,
        HAND_CRAFTED_SHAPE,
        "whowhen-hand-crafted",
        case_id,
        system="magentic_one",
        description=MAGENTIC_ONE + log.question,
        prompts={a: _magentic_one_prompt(a) for a in agents},
        turns=turns,
        mistake_agent=log.mistake_agent,
        mistake_step=log.mistake_step,
    )


def _case(path: Path, expected: str, *args: Any, **fields: Any) -> EvalCase:
    """The case, or the file named in what is wrong with its truth."""
    try:
        return trajectory_case(*args, **fields)
    except TruthError as exc:
        raise CaseFileError(f"{path}: {exc}; expected {expected}") from exc


def _magentic_one_prompt(agent: str) -> str:
    """The dataset records no system prompts; the agent's role in Magentic-One stands in."""
    role = MAGENTIC_ONE_AGENTS.get(agent, "one of the agents of this team")
    return (
        f"You are {agent} in a Magentic-One team; {role}. (The log records no system prompt; "
        "this is the role Magentic-One gives you.)"
    )


def _numeric(stem: str) -> tuple[int, str]:
    return (int(stem), "") if stem.isdigit() else (1 << 30, stem)
