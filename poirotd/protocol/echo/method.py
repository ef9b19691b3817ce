"""ECHO as an attribution method: hierarchical context, a panel of analysts, consensus.

The panel is drawn from the spec's roles, seeded by the session id (a re-run of a session draws
the same panel). Every analyst reads the same layered context (cut to fit the model once for
the panel, on the record) at its own temperature and answers under the analysis schema; its
primary conclusion is its vote (agent id "echo.<role>", weight its confidence, 0 below δ), or an
abstention when it gave no valid analysis. The consensus (consensus.py) is the attribution:
score_j is the share of the winning conclusion kind's confidence that blames region j, the
decision is the consensus regions, the step the consensus step. With no conclusion at δ or above
the run still succeeds, blaming nothing, and says so in its degraded reason.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from poirotd.config.spec import DecisionRuleSpec, EchoRole, EchoSpec
from poirotd.model import AgentMessage, Attribution, HazardSpace, Phase, Vote
from poirotd.protocol.aggregation import decide
from poirotd.protocol.echo.consensus import Ballot, Consensus, consensus
from poirotd.protocol.echo.context import LAYERS, LayeredContext, hierarchical_context
from poirotd.protocol.echo.prompts import analysis_request
from poirotd.protocol.echo.schemas import Analysis, analysis_format
from poirotd.protocol.errors import AnswerFailedError
from poirotd.protocol.events import VoteCast
from poirotd.protocol.method import Case, MethodResult, require_a_vote
from poirotd.protocol.run import CallSite, RunContext, concurrently

VOTER_PREFIX = "echo."


@dataclass(frozen=True)
class Analyst:
    role: EchoRole
    temperature: float

    @property
    def voter(self) -> str:
        return f"{VOTER_PREFIX}{self.role}"


def draw_panel(settings: EchoSpec, seed: str) -> tuple[Analyst, ...]:
    """`settings.analysts` distinct roles drawn from `settings.roles`, seeded by `seed`;
    analyst k samples at temperatures[k % len(temperatures)]."""
    roles = random.Random(seed).sample(list(settings.roles), settings.analysts)
    temperatures = settings.temperatures
    return tuple(Analyst(role, temperatures[k % len(temperatures)]) for k, role in enumerate(roles))


async def attribute(case: Case, run: RunContext) -> MethodResult:
    spec, space, settings = case.spec, case.space, case.spec.protocol.echo
    context = hierarchical_context(case.messages)
    seed = case.messages[0].session_id if case.messages else ""
    panel = draw_panel(settings, seed)
    async with run.phase(Phase.ANALYSIS):
        view = await _fitted(case, context, panel, run)
        answer = analysis_format(space, {m.index for m in view})

        async def analyse(analyst: Analyst) -> tuple[Analysis | None, Vote]:
            try:
                analysis = await run.until_valid(
                    CallSite(Phase.ANALYSIS, analyst.voter, "analysis"),
                    analysis_request(
                        spec, space, context, view, case.incident, case.spotlight, analyst.role
                    ),
                    answer,
                    max_tokens=settings.analysis_max_tokens,
                    retries=spec.protocol.invalid_json_retries,
                    temperature=analyst.temperature,
                )
            except AnswerFailedError as exc:
                vote = Vote(agent_id=analyst.voter, abstention_reason=f"analysis: {exc}")
                await run.emit(VoteCast(vote=vote))
                return None, vote
            vote = _vote(space, analyst, analysis, settings.delta)
            await run.emit(VoteCast(vote=vote))
            return analysis, vote

        answered = await concurrently(analyse(a) for a in panel)
    votes = [vote for _, vote in answered]
    require_a_vote(votes, "analyst")
    async with run.phase(Phase.AGGREGATION):
        ballots = [
            Ballot(
                a.voter,
                x.conclusion.kind,
                x.conclusion.regions,
                x.conclusion.step,
                x.conclusion.confidence,
            )
            for a, (x, _) in zip(panel, answered, strict=True)
            if x is not None
        ]
        senders = {m.index: m.sender for m in case.messages}
        agreed = consensus(ballots, settings.delta, senders)
        attribution = consensus_attribution(space, agreed, settings.delta)
    lacks = (
        ()
        if agreed.kind
        else (
            f"no analyst's conclusion reached the confidence threshold δ={settings.delta:g}; "
            "nothing is blamed",
        )
    )
    return MethodResult(
        attribution=attribution,
        votes=tuple(votes),
        findings=_findings(panel, context, [x for x, _ in answered], agreed),
        lacks=lacks,
    )


def consensus_attribution(space: HazardSpace, agreed: Consensus, delta: float) -> Attribution:
    """The consensus over the hazard space (see the module docstring)."""
    total = sum(w for w in agreed.region_votes.values())
    ids = [r.id for r in space.regions]
    scores = tuple(agreed.region_votes.get(i, 0.0) / total if total else 0.0 for i in ids)
    top, _ = decide(np.asarray(scores), DecisionRuleSpec())
    return Attribution(
        scores=scores,
        top=top,
        tie=len(top) > 1,
        decision=tuple(int(i in agreed.regions) for i in ids),
        rule=f"echo(delta={delta:g})",
        beta=0.0,
        step=agreed.step,
    )


def _vote(space: HazardSpace, analyst: Analyst, analysis: Analysis, delta: float) -> Vote:
    """The analyst's primary conclusion as its vote, weighed by its confidence (0 below δ)."""
    conclusion = analysis.conclusion
    return Vote(
        agent_id=analyst.voter,
        location=tuple(int(r.id in conclusion.regions) for r in space.regions),
        hazard_vector=analysis.summary,
        justification=conclusion.reasoning,
        weight=conclusion.confidence if conclusion.confidence >= delta else 0.0,
        step=conclusion.step,
    )


async def _fitted(
    case: Case, context: LayeredContext, panel: Sequence[Analyst], run: RunContext
) -> tuple[AgentMessage, ...]:
    """The layered session cut (once, for the whole panel) so the longest analyst request and
    its answer fit the model."""
    render = partial(
        analysis_request,
        case.spec,
        case.space,
        context,
        incident=case.incident,
        spotlight=case.spotlight,
    )
    longest = max(panel, key=lambda a: run.count_tokens(render((), role=a.role)))
    return await run.fit(
        "",
        context.messages,
        partial(render, role=longest.role),
        reserve=case.spec.protocol.echo.analysis_max_tokens,
    )


def _findings(
    panel: Sequence[Analyst],
    context: LayeredContext,
    analyses: Sequence[Analysis | None],
    agreed: Consensus,
) -> dict[str, Any]:
    layers = list(context.layers.values())
    return {
        "method": "echo",
        "panel": [{"analyst": a.voter, "temperature": a.temperature} for a in panel],
        "context": {
            "anchors": list(context.anchors),
            "layers": {layer: layers.count(layer) for layer in LAYERS},
        },
        "analyses": {
            a.voter: x.model_dump(mode="json") if x else None
            for a, x in zip(panel, analyses, strict=True)
        },
        "consensus": agreed.model_dump(mode="json"),
    }
