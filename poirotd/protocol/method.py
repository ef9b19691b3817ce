"""What every attribution method is given and gives back, so that the engine (and the ensemble,
which runs several) call any of them alike: POIROT, the baseline, ECHO, ErrorProbe.

A method gets the case (the spec, the hazard space built for it, the session, the incident, the
run's spotlight, and what the store knows around it) and the run's `RunContext` for its LLM
calls and events; it returns its attribution over the hazard space, the votes it cast on the way
and what else it found. It raises ProtocolError when it can give no attribution at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from poirotd.config.spec import DecisionRuleSpec, SystemSpec
from poirotd.model import AgentMessage, Attribution, Frozen, HazardSpace, Reading, Vote
from poirotd.protocol.aggregation import decide
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.prompts import Incident
from poirotd.protocol.run import RunContext
from poirotd.protocol.spotlight import Spotlight


@dataclass(frozen=True)
class Case:
    """One investigation as every method sees it."""

    spec: SystemSpec
    space: HazardSpace
    # The session, in index order.
    messages: tuple[AgentMessage, ...]
    # Why the investigation was opened, and the hardware readings around it (None: unknown).
    incident: Incident | None
    # How every untrusted text (messages, tool outputs, the incident, what judges wrote about
    # them) is quoted in this run's prompts: one spotlight for the whole run.
    spotlight: Spotlight
    # The β each agent's POIROT vote is weighed with.
    betas: Mapping[str, float]
    # The session's newest telemetry readings, oldest first (ErrorProbe checks claims on them).
    readings: tuple[Reading, ...] = ()
    # Each method's reliability from confirmed outcomes (the ensemble's rho_m).
    reliabilities: Mapping[str, float] = field(default_factory=dict)
    # The investigation's id, which ErrorProbe's memory records its diagnoses under.
    investigation_id: str = ""


class MethodResult(Frozen):
    attribution: Attribution
    votes: tuple[Vote, ...] = ()
    # POIROT's Phase II reports by agent (None: no valid report).
    reports: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    # The method's own findings, as JSON (Investigation.findings).
    findings: dict[str, Any] = Field(default_factory=dict)
    # What the run lacked beyond abstentions and missing reports, for the degraded reason.
    lacks: tuple[str, ...] = ()


Method = Callable[[Case, RunContext], Awaitable[MethodResult]]


def require_a_vote(votes: Sequence[Vote], who: str = "agent") -> None:
    """Raises ProtocolError, naming every abstention's reason, when no vote was cast."""
    if all(v.abstained for v in votes):
        reasons = "; ".join(f"{v.agent_id or 'baseline'}: {v.abstention_reason}" for v in votes)
        raise ProtocolError(f"no {who} cast a valid vote: {reasons}")


def argmax_attribution(scores: Sequence[float], rule: str, step: int | None) -> Attribution:
    """Scores decided by argmax (a tie keeps every tied region; all zeros: no anomaly), for the
    methods that weigh no agent's β."""
    top, decision = decide(np.asarray(scores, dtype=np.float64), DecisionRuleSpec())
    return Attribution(
        scores=tuple(float(s) for s in scores),
        top=top,
        tie=len(top) > 1,
        decision=decision,
        rule=rule,
        beta=0.0,
        step=step,
    )
