"""What one run of one case produced: the JSONL line the runner writes and the scorer reads.

A record holds the raw answer (decision, scores, step, votes) beside the truth and the hazard
space it is expressed in, so scores can be recomputed later without the daemon or the dataset.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from poirot_eval.cases import Dataset, GroundTruth
from poirotd.model import Frozen, InvestigationMethod, Vote

# ok: the run gave an attribution; context_exceeded: the session could not be fitted to the
# model; timeout: the run did not finish in time; failed: any other error.
Status = Literal["ok", "failed", "context_exceeded", "timeout"]


class TokenUsage(Frozen):
    prompt: int = Field(default=0, ge=0)
    completion: int = Field(default=0, ge=0)
    # Prompt tokens the server answered from its prefix cache (0 when it does not say).
    cached: int = Field(default=0, ge=0)


class CaseResult(Frozen):
    case_id: str
    dataset: Dataset
    method: InvestigationMethod
    # Label of the LLM behind the run (e.g. "qwen2.5-7b"); runs are compared per model too.
    model: str = ""
    status: Status
    error: str = ""
    # The hazard space's region ids: index i of `decision`, `scores` and every vote is region i.
    region_ids: tuple[str, ...] = Field(min_length=1)
    # The decision rule's binary vector; empty when the run gave no attribution.
    decision: tuple[int, ...] = ()
    # The attribution scores S_j (empty when there are none, as for the baseline).
    scores: tuple[float, ...] = ()
    # The predicted session index where the failure began (None: not given).
    step: int | None = Field(default=None, ge=0)
    truth: GroundTruth
    votes: tuple[Vote, ...] = ()
    tokens: TokenUsage = TokenUsage()
    seconds: float = Field(default=0.0, ge=0.0)
    # How many messages the context-budget policy dropped or shortened.
    context_cuts: int = Field(default=0, ge=0)
    # An ensemble line combined from the member lines recorded for the same case and model,
    # instead of running the members again: their methods (see ensemble_lines.py). Empty: run.
    ensemble_of: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _vectors_fit_the_space(self) -> CaseResult:
        n = len(self.region_ids)
        for name, vector in (("decision", self.decision), ("scores", self.scores)):
            if vector and len(vector) != n:
                raise ValueError(f"{name} has {len(vector)} entries for {n} regions")
        for vote in self.votes:
            if vote.location and len(vote.location) != n:
                raise ValueError(f"vote of {vote.agent_id} has {len(vote.location)} entries")
        unknown = set(self.truth.regions) - set(self.region_ids)
        if unknown:
            raise ValueError(f"truth names regions outside the space: {sorted(unknown)}")
        return self

    @property
    def predicted_regions(self) -> tuple[str, ...]:
        return tuple(r for r, bit in zip(self.region_ids, self.decision, strict=False) if bit)
