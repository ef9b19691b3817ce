"""Runs recorded by the original POIROT web tool (github.com/11inaki11/POIROT-web, src/data):
read in their published format, re-aggregated with poirotd's own Phase V and compared with the
weights and scores the tool recorded, and their sessions written as one-case files to replay.

A run holds every agent's recorded position (a one-hot vector at its own dimension), its vote,
its β (`baseline`, the tool's reputation baseline; None when the tool used the paper's fixed
β = 0.25) and its weight, plus the dimension scores. The tool placed an agent whose name it could
not match to a dimension (TradingAgents' "trader" against the dimension "The Trader") at an
all-zero position. Two conventions re-aggregate such an agent (`ZeroPosition`):

- ``as-recorded``: the position as the tool recorded it, all zeros, so its distance to a vote is
  the number of regions the vote names and its weight β + ½(1 - |v|/N) (0.75 for an all-zero
  vote). This reproduces the recorded weights.
- ``own-region``: at its own region (the dimension of the agent of that id in the benchmark's
  spec), as poirotd places every voter: β + ½(1 - d_H(e_own, v)/N) (0.7167 for an all-zero vote
  over 15 regions). This is what poirotd would have computed.

The session is the chat log up to where the tool's own POIROT run begins: the peer consultation
that leads to the first relayed peer request ("**Request from ...") or vote (a JSON answer with a
hazard_vector and a location). Earlier attributions must never reach an attributor, so that part
is left out; `session_end` overrides the cut when a log needs another.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from poirot_eval import blame
from poirot_eval.case_files import CaseFileError, read_record
from poirot_eval.cases import Dataset, EvalCase, GroundTruth
from poirot_eval.parts import message
from poirotd.config.spec import DecisionRuleSpec, SystemSpec
from poirotd.model import AgentMessage, MessageKind
from poirotd.protocol.aggregation import score

ZeroPosition = Literal["as-recorded", "own-region"]
# The paper's β, which the tool used when a run records no per-agent baseline.
DEFAULT_BETA = 0.25
# The recorded weights carry 4 decimals, the scores 4 after sums of them.
WEIGHT_TOLERANCE = 1e-4
SCORE_TOLERANCE = 1e-3

SYSTEMS: dict[str, Dataset] = {"CORTEX": "blame-cortex", "TradingAgents": "blame-trading"}


class _Format(BaseModel):
    # The tool writes many summaries (percentages, rankings, token counts) the import does not
    # use; they are ignored, not required.
    model_config = ConfigDict(extra="ignore", frozen=True)


class RecordedVote(_Format):
    agent_name: str
    agent_position: list[Literal[0, 1]]
    voted_location: list[Literal[0, 1]]
    vote_weight: float
    baseline: float | None = None


class WinningLocation(_Format):
    vector: list[int]
    dimension_index: int


class VotingData(_Format):
    agent_votes: list[RecordedVote] = Field(min_length=1)
    dimension_scores: list[float]
    winning_location: WinningLocation


class ChatLogEntry(_Format):
    sender: str
    type: str
    content: str


class RecordedRun(_Format):
    system: str
    attempt_id: str
    dimension_labels: list[str] = Field(min_length=1)
    voting_data: VotingData
    # A list of entries, or a sentence saying why there is none (TradingAgents runs).
    chat_logs: list[ChatLogEntry] | str = ""
    ground_truth_vector: list[Literal[0, 1]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


RUN_SHAPE = (
    'a POIROT web-tool run {"system": "CORTEX" | "TradingAgents", "attempt_id": str, '
    '"dimension_labels": [str], "voting_data": {"agent_votes": [{"agent_name": str, '
    '"agent_position": [0|1], "voted_location": [0|1], "vote_weight": float, "baseline": '
    'float | null}], "dimension_scores": [float], "winning_location": {...}}, "chat_logs": '
    '[{"sender": str, "type": "HUMAN" | "AGENT" | "TOOL", "content": str}]}'
)


def read_run(path: Path) -> RecordedRun:
    """The run in `path`; raises CaseFileError naming the file, field and expected shape."""
    run = read_record(path, RecordedRun, RUN_SHAPE)
    if run.system not in SYSTEMS:
        raise CaseFileError(f"{path}: system: {run.system!r} is not one of {sorted(SYSTEMS)}")
    n = len(run.dimension_labels)
    votes = run.voting_data.agent_votes
    for i, vote in enumerate(votes):
        for field in ("agent_position", "voted_location"):
            if len(getattr(vote, field)) != n:
                raise CaseFileError(
                    f"{path}: voting_data.agent_votes.{i}.{field}: "
                    f"{len(getattr(vote, field))} entries for {n} dimension_labels"
                )
    if len(run.voting_data.dimension_scores) != n:
        raise CaseFileError(f"{path}: voting_data.dimension_scores: not one per dimension ({n})")
    return run


def benchmark_spec(run: RecordedRun, data_dir: Path) -> SystemSpec:
    """The BLAME spec of the run's system, whose regions are the run's dimensions in order."""
    spec = blame.system_spec(data_dir, SYSTEMS[run.system])
    if len(spec.region_ids) != len(run.dimension_labels):
        raise CaseFileError(
            f"run of {run.system}: {len(run.dimension_labels)} dimensions, the benchmark has "
            f"{len(spec.region_ids)} ({', '.join(spec.region_ids)})"
        )
    return spec


def voter_id(spec: SystemSpec, agent_name: str) -> str:
    """The spec's agent a vote was cast by: by id (TradingAgents logs "trader_v7318bcff"), else
    by display name (CORTEX logs "Diagnosis Doctor")."""
    candidate = blame.agent_id(agent_name)
    if candidate in spec.agent_ids:
        return candidate
    for agent in spec.agents:
        if agent.name == agent_name:
            return agent.id
    raise CaseFileError(f"voter {agent_name!r} is none of the agents {list(spec.agent_ids)}")


# ------------------------------------------------------------------ re-aggregation


@dataclass(frozen=True)
class AgentCheck:
    agent_id: str
    # Where the tool placed the agent (None: all zeros) and where the re-aggregation did.
    recorded_position: int | None
    position: int | None
    beta: float
    recorded_weight: float
    weight: float


@dataclass(frozen=True)
class Reaggregation:
    """The run as poirotd's Phase V computes it, beside what the tool recorded."""

    convention: ZeroPosition
    region_ids: tuple[str, ...]
    agents: tuple[AgentCheck, ...]
    recorded_scores: tuple[float, ...]
    scores: tuple[float, ...]
    recorded_top: tuple[int, ...]
    top: tuple[int, ...]

    @property
    def weight_error(self) -> float:
        return max(abs(a.weight - a.recorded_weight) for a in self.agents)

    @property
    def score_error(self) -> float:
        return max(abs(s - r) for s, r in zip(self.scores, self.recorded_scores, strict=True))

    @property
    def tie_broken_by_first(self) -> bool:
        """poirotd found a tie, and the tool's winner is the first of the tied regions: the tool
        took numpy's argmax, which breaks a tie by the lowest index. poirotd reports the tie
        instead of breaking it; the two agree on everything else."""
        return len(self.top) > 1 and self.recorded_top == self.top[:1]

    @property
    def agrees(self) -> bool:
        """Within the recorded rounding, with the same winner (or the tool's winner the first of
        the regions poirotd found tied)."""
        return (
            self.weight_error <= WEIGHT_TOLERANCE
            and self.score_error <= SCORE_TOLERANCE
            and (self.top == self.recorded_top or self.tie_broken_by_first)
        )


def reaggregate(
    run: RecordedRun, spec: SystemSpec, convention: ZeroPosition = "as-recorded"
) -> Reaggregation:
    """Weights and scores of the recorded votes by `aggregation.score`, each agent placed as
    `convention` says and weighed with its recorded β (DEFAULT_BETA when none is recorded)."""
    votes = run.voting_data.agent_votes
    n = len(run.dimension_labels)
    own = [spec.region_ids.index(voter_id(spec, v.agent_name)) for v in votes]
    recorded = [_one(v.agent_position) for v in votes]
    placed = recorded if convention == "as-recorded" else own
    positions = [[int(j == p) for j in range(n)] for p in placed]
    betas = [DEFAULT_BETA if v.baseline is None else v.baseline for v in votes]
    weights, attribution = score(
        positions, [v.voted_location for v in votes], betas, DecisionRuleSpec()
    )
    winner = run.voting_data.winning_location.dimension_index
    return Reaggregation(
        convention=convention,
        region_ids=spec.region_ids,
        agents=tuple(
            AgentCheck(
                agent_id=spec.region_ids[o],
                recorded_position=r,
                position=p,
                beta=b,
                recorded_weight=v.vote_weight,
                weight=float(w),
            )
            for v, o, r, p, b, w in zip(votes, own, recorded, placed, betas, weights, strict=True)
        ),
        recorded_scores=tuple(run.voting_data.dimension_scores),
        scores=attribution.scores,
        recorded_top=(winner,) if winner >= 0 else (),
        top=attribution.top,
    )


def _one(position: Sequence[int]) -> int | None:
    """The index of a one-hot position, None for all zeros."""
    ones = [i for i, bit in enumerate(position) if bit]
    return ones[0] if len(ones) == 1 else None


# ------------------------------------------------------------------ the session as a case

_PREFIXES = ("Human Message:\n", "AI Message:\n", "AI Message:")
_TOOL_RESULT = re.compile(r"Tool: (?P<tool>\S+)\nResult:\n?")
_TOOL_CALLS = re.compile(r"\n*Tool Calls: \d+\n(?P<calls>(?:\s*- \S+\n?)+)\s*$")
_PEER_TOOL = "talk_to_"
_RELAYED_REQUEST = "**Request from"


def session_length(entries: Sequence[ChatLogEntry]) -> int:
    """How many chat-log entries are the session: those before the peer consultation that leads
    to the first relayed peer request or vote of the tool's own run (all, when there is none)."""
    first = next((i for i, e in enumerate(entries) if _poirot_turn(e)), len(entries))
    start = first
    while start > 0 and _consults_a_peer(entries[start - 1]):
        start -= 1
    return start


def _poirot_turn(entry: ChatLogEntry) -> bool:
    text = _strip(entry.content)
    if entry.type == "HUMAN":
        return text.startswith(_RELAYED_REQUEST)
    return entry.type == "AGENT" and '"hazard_vector"' in text and '"location"' in text


def _consults_a_peer(entry: ChatLogEntry) -> bool:
    if entry.type == "TOOL":
        return entry.sender.startswith(_PEER_TOOL)
    _, calls = _split_calls(_strip(entry.content))
    return entry.type == "AGENT" and any(c.startswith(_PEER_TOOL) for c in calls)


def run_case(
    run: RecordedRun, spec: SystemSpec, *, session_end: int | None = None, source: str = ""
) -> EvalCase:
    """The run's session as a one-case file's case: the benchmark's spec (hazard space pinned to
    the run's dimensions), the chat log up to `session_end` (default: `session_length`), and the
    run's ground truth. Raises CaseFileError when the run records no chat log."""
    where = source or f"run {run.attempt_id}"
    if isinstance(run.chat_logs, str) or not run.chat_logs:
        why = run.chat_logs or "empty"
        raise CaseFileError(f"{where}: chat_logs: no session to replay ({why})")
    end = session_length(run.chat_logs) if session_end is None else session_end
    if not 0 < end <= len(run.chat_logs):
        raise CaseFileError(f"{where}: session end {end} outside 1..{len(run.chat_logs)}")
    case_id = f"poirot_web_{run.attempt_id}"
    truth = _truth(run, spec, where)
    messages = _session(case_id, run.chat_logs[:end], spec, where)
    return EvalCase(
        dataset=SYSTEMS[run.system],
        case_id=case_id,
        spec=spec,
        messages=tuple(messages),
        truth=GroundTruth(regions=truth),
    )


def _truth(run: RecordedRun, spec: SystemSpec, where: str) -> tuple[str, ...]:
    """The run's ground-truth vector (top level, or the metadata's string form) as region ids."""
    vector: Sequence[int] | None = run.ground_truth_vector
    if vector is None and "ground_truth_vector" in run.metadata:
        text = str(run.metadata["ground_truth_vector"])
        vector = [int(x) for x in re.findall(r"[01]", text)]
    if vector is None or len(vector) != len(spec.region_ids):
        raise CaseFileError(f"{where}: ground_truth_vector: one 0|1 per dimension expected")
    return tuple(r for r, bit in zip(spec.region_ids, vector, strict=True) if bit)


def _session(
    case_id: str, entries: Sequence[ChatLogEntry], spec: SystemSpec, where: str
) -> list[AgentMessage]:
    """Chat-log entries as session messages: the tool's display prefixes ("AI Message:",
    "Tool: X / Result:") removed, an agent's tool calls taken from its "Tool Calls:" list, and a
    tool result sent back to the agent that last called that tool."""
    callers: dict[str, str] = {}
    messages = []
    for i, entry in enumerate(entries):
        text = _strip(entry.content)
        if entry.type == "AGENT":
            agent = voter_id(spec, entry.sender)
            text, calls = _split_calls(text)
            callers |= dict.fromkeys(calls, agent)
            messages.append(message(case_id, i, MessageKind.AGENT, agent, text, tool_calls=calls))
        elif entry.type == "TOOL":
            tool = entry.sender
            caller = callers.get(tool, "")
            messages.append(
                message(
                    case_id,
                    i,
                    MessageKind.TOOL,
                    caller or tool,
                    text,
                    recipient=caller,
                    tool_name=tool,
                )
            )
        elif entry.type == "HUMAN":
            messages.append(message(case_id, i, MessageKind.HUMAN, "human", text))
        else:
            raise CaseFileError(
                f"{where}: chat_logs.{i}.type: {entry.type!r} is not HUMAN|AGENT|TOOL"
            )
    return messages


def _strip(content: str) -> str:
    for prefix in _PREFIXES:
        if content.startswith(prefix):
            return content[len(prefix) :].lstrip("\n")
    match = _TOOL_RESULT.match(content)
    return content[match.end() :] if match else content


def _split_calls(text: str) -> tuple[str, list[str]]:
    """An agent turn's text without its trailing "Tool Calls: N / - name" list, and the names."""
    match = _TOOL_CALLS.search(text)
    if match is None:
        return text, []
    calls = [line.strip()[2:] for line in match["calls"].splitlines() if line.strip()]
    return text[: match.start()].rstrip(), calls
