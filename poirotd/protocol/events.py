"""What the engine reports while it runs, so votes and exchanges stream out as they land.

The `kind` tag lets a consumer (store, Watch stream) dispatch and round-trip an event without
guessing its type from its fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from poirotd.model import (
    Attribution,
    ContextCut,
    Frozen,
    HazardSpace,
    LLMExchange,
    Phase,
    Vote,
)
from poirotd.protocol.injection import InjectionFinding


class PhaseBegun(Frozen):
    kind: Literal["phase_begun"] = "phase_begun"
    phase: Phase


class PhaseEnded(Frozen):
    kind: Literal["phase_ended"] = "phase_ended"
    phase: Phase
    seconds: float


class ExchangeDone(Frozen):
    """One LLM call, successful or not, with everything the audit needs."""

    kind: Literal["exchange_done"] = "exchange_done"
    exchange: LLMExchange


class ReportFiled(Frozen):
    """An agent's Phase II report; `report` is None (and `error` says why) when none was valid."""

    kind: Literal["report_filed"] = "report_filed"
    agent_id: str
    report: dict[str, Any] | None
    error: str = ""


class VoteCast(Frozen):
    """An agent's vote (or abstention) with its weight, as soon as the agent has decided."""

    kind: Literal["vote_cast"] = "vote_cast"
    vote: Vote


class ContextCutsMade(Frozen):
    """What the context-budget policy cut from one viewer's session view so its prompts fit."""

    kind: Literal["context_cuts"] = "context_cuts"
    cuts: tuple[ContextCut, ...]


class TokenBudgetSpent(Frozen):
    """The investigation has used its LLM-token budget: no further call starts (once per run)."""

    kind: Literal["token_budget_spent"] = "token_budget_spent"
    budget: int
    used: int


class HazardSpaceBuilt(Frozen):
    """Phase I built (and cached) a new hazard space, with what it dropped of the answer."""

    kind: Literal["hazard_space_built"] = "hazard_space_built"
    hazard_space: HazardSpace


class InjectionFound(Frozen):
    """Signs of a prompt-injection attempt in what the run quotes (the session, the incident)."""

    kind: Literal["injection_found"] = "injection_found"
    findings: tuple[InjectionFinding, ...]


class AttributionReady(Frozen):
    kind: Literal["attribution_ready"] = "attribution_ready"
    attribution: Attribution
    hazard_space: HazardSpace


ProtocolEvent = Annotated[
    PhaseBegun
    | PhaseEnded
    | ExchangeDone
    | ReportFiled
    | VoteCast
    | ContextCutsMade
    | TokenBudgetSpent
    | HazardSpaceBuilt
    | InjectionFound
    | AttributionReady,
    Field(discriminator="kind"),
]
