"""The engine: for one system spec, one incident per `run`, by the method the investigation
chose: POIROT's five phases in order, or the all-at-once baseline (`baseline.py`) after Phase I.

Everything the run learns is pushed to `on_event` as it happens (each LLM exchange, report and
vote) and returned as a `ProtocolOutcome` at the end. A run holds no state beyond its own call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import ChatMessage, LLMBackend
from poirotd.model import (
    AgentMessage,
    Attribution,
    Frozen,
    HazardSpace,
    InvestigationMethod,
    LLMUsage,
    Phase,
    PhaseTiming,
    Vote,
)
from poirotd.protocol import baseline, injection, prompts
from poirotd.protocol.aggregation import aggregate
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import AttributionReady, InjectionFound, ProtocolEvent
from poirotd.protocol.hazard_space import HazardSpaceCache, resolve_hazard_space
from poirotd.protocol.interrogation import closing_request, interrogate, one_more_round
from poirotd.protocol.peer_tools import tools_text
from poirotd.protocol.prompts import Incident
from poirotd.protocol.run import RunContext
from poirotd.protocol.schemas import SelfReport
from poirotd.protocol.self_assessment import self_assess
from poirotd.protocol.spotlight import Spotlight


class ProtocolOutcome(Frozen):
    hazard_space: HazardSpace
    # Phase II report per agent, as JSON; None when the agent gave no valid report.
    reports: dict[str, dict[str, Any] | None]
    votes: tuple[Vote, ...]
    attribution: Attribution
    phases: tuple[PhaseTiming, ...]
    usage: LLMUsage
    # True when the LLM-token budget ran out: later calls were not made (missing answers are
    # abstentions and absent reports saying so).
    budget_spent: bool = False


class InvestigationEngine:
    def __init__(
        self,
        spec: SystemSpec,
        backend: LLMBackend,
        hazard_spaces: HazardSpaceCache,
        *,
        token_budget: int = 0,
    ) -> None:
        """`token_budget`: LLM tokens (prompt + completion) each run may spend; 0: no budget."""
        self._spec = spec
        self._backend = backend
        self._hazard_spaces = hazard_spaces
        self._token_budget = token_budget

    async def run(
        self,
        messages: Sequence[AgentMessage],
        on_event: Callable[[ProtocolEvent], Awaitable[None]],
        *,
        incident: Incident | None = None,
        betas: Mapping[str, float] | None = None,
        method: InvestigationMethod = "poirot",
    ) -> ProtocolOutcome:
        """Investigate the session `messages` (in session order); `incident` tells the agents
        why the investigation was opened and what the hardware reported around it; `betas`
        are the agents' β_i (the reputation variant), the spec's β for all when None;
        `method` picks POIROT or the baseline (which ignores `betas`: it weighs nothing).

        Once the token budget is spent no further call starts: the agents still waiting for one
        abstain (or file no report), and the votes already cast are aggregated.
        Every untrusted text is quoted under one fresh spotlight for the whole run; signs of
        an injection attempt in the session or the incident are reported first (InjectionFound).
        Raises ProtocolError when every voter abstains;
        cancellation propagates and cancels every LLM call in flight.
        """
        spec, run = self._spec, RunContext(self._backend, on_event, token_budget=self._token_budget)
        spotlight = Spotlight.fresh(spec.protocol.spotlighting)
        findings = injection.scan(messages, incident.texts() if incident else ())
        if findings:
            await run.emit(InjectionFound(findings=findings))
        async with run.phase(Phase.HAZARD_SPACE):
            space = await resolve_hazard_space(spec, self._hazard_spaces, run)
        if betas is None:
            betas = {agent: spec.protocol.beta for agent in spec.agent_ids}
        reports: dict[str, SelfReport | None] = {}
        if method == "baseline":
            async with run.phase(Phase.VOTING):
                votes = [
                    await baseline.baseline_vote(spec, space, messages, incident, spotlight, run)
                ]
        else:
            views = await self._views(space, messages, incident, spotlight, run)
            prefixes = {
                a.id: prompts.agent_prefix(a, views[a.id], incident, spotlight) for a in spec.agents
            }
            async with run.phase(Phase.SELF_ASSESSMENT):
                reports = await self_assess(spec, prefixes, run)
            seen = {agent: {m.index for m in view} for agent, view in views.items()}
            votes = await interrogate(spec, space, prefixes, reports, run, betas, seen, spotlight)
        if all(v.abstained for v in votes):
            reasons = "; ".join(f"{v.agent_id or 'baseline'}: {v.abstention_reason}" for v in votes)
            raise ProtocolError(f"no agent cast a valid vote: {reasons}")
        async with run.phase(Phase.AGGREGATION):
            if method == "baseline":
                attribution = baseline.attribution(votes[0])
            else:
                attribution = aggregate(space, votes, betas, spec.protocol.decision)
            await run.emit(AttributionReady(attribution=attribution, hazard_space=space))
        return ProtocolOutcome(
            hazard_space=space,
            reports={a: r.model_dump(mode="json") if r else None for a, r in reports.items()},
            votes=tuple(votes),
            attribution=attribution,
            phases=run.timings(),
            usage=run.usage,
            budget_spent=run.budget_spent,
        )

    async def _views(
        self,
        space: HazardSpace,
        messages: Sequence[AgentMessage],
        incident: Incident | None,
        spotlight: Spotlight,
        run: RunContext,
    ) -> dict[str, tuple[AgentMessage, ...]]:
        """Each agent's session view, cut by the context budget to leave room for its longest
        request known in advance plus its answer: the Phase II task, or the Phase III opening
        (measured before any report exists) with one full consultation round and the vote after
        it, tool definitions included. Later rounds get the room that is left: when none is, the
        consultation ends early (see interrogation.py); the reports' summary in the opening is
        not reserved."""
        spec, limits = self._spec, self._spec.protocol
        views = {}
        for agent in spec.agents:
            task = [ChatMessage(role="user", content=prompts.self_assessment(spec, agent.id))]
            opening = [
                ChatMessage(
                    role="user",
                    content=prompts.interrogation_opening(spec, space, {}, agent.id, spotlight),
                )
            ]
            # Steps the agent's votes may name: at most every session index.
            offered = tools_text(spec, agent.id, space.size, range(len(messages)))
            consultation = closing_request(space, opening, offered)
            reserve = max(
                run.count_tokens(task) + limits.report_max_tokens,
                run.count_tokens(consultation) + one_more_round(limits, spotlight),
            )
            views[agent.id] = await run.fit(
                agent.id,
                [m for m in messages if prompts.in_view(agent.id, m)],
                partial(prompts.agent_prefix, agent, incident=incident, spotlight=spotlight),
                reserve=reserve,
            )
        return views
