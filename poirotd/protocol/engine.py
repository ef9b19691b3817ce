"""The engine: for one system spec, one incident per `run`, by the method the investigation
chose after Phase I: POIROT's Phases II to V, the all-at-once baseline (`baseline.py`), ECHO
(`echo/`), ErrorProbe (`errorprobe/`) or an ensemble of these (`ensemble.py`).

Everything the run learns is pushed to `on_event` as it happens (each LLM exchange, report and
vote) and returned as a `ProtocolOutcome` at the end. A run holds no state beyond its own call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

from pydantic import Field

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import ChatMessage, LLMBackend
from poirotd.model import (
    AgentMessage,
    Attribution,
    Frozen,
    HazardSpace,
    InvestigationMethod,
    LLMUsage,
    ModelTime,
    Phase,
    PhaseTiming,
    Reading,
    Vote,
)
from poirotd.protocol import baseline, echo, ensemble, errorprobe, injection, prompts
from poirotd.protocol.aggregation import aggregate
from poirotd.protocol.errorprobe.memory import DiagnosisMemory
from poirotd.protocol.errors import ModelUnavailableError, ProtocolError
from poirotd.protocol.events import AttributionReady, InjectionFound, ProtocolEvent
from poirotd.protocol.method import Case, Method, MethodResult, require_a_vote
from poirotd.protocol.poirot.hazard_space import HazardSpaceCache, resolve_hazard_space
from poirotd.protocol.poirot.interrogation import closing_request, interrogate, one_more_round
from poirotd.protocol.poirot.peer_tools import tools_text
from poirotd.protocol.poirot.prompts import interrogation_opening, self_assessment
from poirotd.protocol.poirot.self_assessment import self_assess
from poirotd.protocol.prompts import Incident
from poirotd.protocol.run import RunContext
from poirotd.protocol.spotlight import Spotlight


class ProtocolOutcome(Frozen):
    hazard_space: HazardSpace
    # Phase II report per agent, as JSON; None when the agent gave no valid report.
    reports: dict[str, dict[str, Any] | None]
    votes: tuple[Vote, ...]
    attribution: Attribution
    phases: tuple[PhaseTiming, ...]
    usage: LLMUsage
    # The model's busy time and critical path against the run's wall time (model_time.py).
    model_time: ModelTime = ModelTime()
    # True when the LLM-token budget ran out: later calls were not made (missing answers are
    # abstentions and absent reports saying so).
    budget_spent: bool = False
    # The method's own findings (Investigation.findings) and what it lacked besides abstentions.
    findings: dict[str, Any] = Field(default_factory=dict)
    lacks: tuple[str, ...] = ()


class InvestigationEngine:
    def __init__(
        self,
        spec: SystemSpec,
        backend: LLMBackend,
        hazard_spaces: HazardSpaceCache,
        *,
        token_budget: int = 0,
        memory: DiagnosisMemory | None = None,
    ) -> None:
        """`token_budget`: LLM tokens (prompt + completion) each run may spend; 0: no budget.
        `memory`: where ErrorProbe keeps its verified diagnoses (None: it runs without)."""
        self._spec = spec
        self._backend = backend
        self._hazard_spaces = hazard_spaces
        self._token_budget = token_budget
        members: dict[str, Method] = {
            "poirot": self._poirot,
            "baseline": baseline.attribute,
            "echo": echo.attribute,
            "errorprobe": partial(errorprobe.attribute, memory=memory),
        }
        self._methods: dict[str, Method] = {
            **members,
            "ensemble": partial(ensemble.attribute, members=members),
        }

    async def run(
        self,
        messages: Sequence[AgentMessage],
        on_event: Callable[[ProtocolEvent], Awaitable[None]],
        *,
        incident: Incident | None = None,
        betas: Mapping[str, float] | None = None,
        method: InvestigationMethod = "poirot",
        readings: Sequence[Reading] = (),
        reliabilities: Mapping[str, float] | None = None,
        investigation_id: str = "",
    ) -> ProtocolOutcome:
        """Investigate the session `messages` (in session order); `incident` tells the agents
        why the investigation was opened and what the hardware reported around it; `betas`
        are the agents' β_i (the reputation variant), the spec's β for all when None;
        `method` picks the attribution method (only POIROT weighs `betas`); `readings` are the
        session's newest telemetry (ErrorProbe checks claims on them); `reliabilities` are the
        methods' rho_m from confirmed outcomes (the ensemble's weights); `investigation_id` is
        what ErrorProbe's memory records a diagnosis under.

        Once the token budget is spent no further call starts: the agents still waiting for one
        abstain (or file no report), and the votes already cast are aggregated.
        Every untrusted text is quoted under one fresh spotlight for the whole run, which
        breaks the serving model's control spellings in it; signs of an injection attempt in
        the session or the incident are reported first (InjectionFound).
        Raises ProtocolError when every voter abstains, ModelUnavailableError when no LLM
        server could serve a call within the backend's outage budget;
        cancellation propagates and cancels every LLM call in flight.
        """
        spec, controls = self._spec, await self._backend.control_tokens()
        run = RunContext(
            self._backend, on_event, token_budget=self._token_budget, controls=controls
        )
        spotlight = Spotlight.fresh(spec.protocol.spotlighting, controls)
        findings = injection.scan(messages, incident.texts() if incident else (), controls)
        if findings:
            await run.emit(InjectionFound(findings=findings))
        if betas is None:
            betas = {agent: spec.protocol.beta for agent in spec.agent_ids}
        try:
            async with run.phase(Phase.HAZARD_SPACE):
                space = await resolve_hazard_space(spec, self._hazard_spaces, run)
            case = Case(
                spec=spec,
                space=space,
                messages=tuple(messages),
                incident=incident,
                spotlight=spotlight,
                betas=betas,
                readings=tuple(readings),
                reliabilities=reliabilities or {},
                investigation_id=investigation_id,
            )
            result = await self._methods[method](case, run)
        except (ProtocolError, ModelUnavailableError) as exc:
            exc.usage = run.usage
            raise
        await run.emit(AttributionReady(attribution=result.attribution, hazard_space=space))
        return ProtocolOutcome(
            hazard_space=space,
            reports=result.reports,
            votes=result.votes,
            attribution=result.attribution,
            phases=run.timings(),
            usage=run.usage,
            model_time=run.model_time(),
            budget_spent=run.budget_spent,
            findings=result.findings,
            lacks=result.lacks,
        )

    async def _poirot(self, case: Case, run: RunContext) -> MethodResult:
        """POIROT's Phases II to V over the case's hazard space."""
        spec, space, incident, spotlight = case.spec, case.space, case.incident, case.spotlight
        views = await self._views(space, case.messages, incident, spotlight, run)
        prefixes = {
            a.id: prompts.agent_prefix(a, views[a.id], incident, spotlight) for a in spec.agents
        }
        async with run.phase(Phase.SELF_ASSESSMENT):
            reports = await self_assess(spec, prefixes, run)
        seen = {agent: {m.index for m in view} for agent, view in views.items()}
        votes = await interrogate(spec, space, prefixes, reports, run, case.betas, seen, spotlight)
        require_a_vote(votes)
        async with run.phase(Phase.AGGREGATION):
            attribution = aggregate(space, votes, case.betas, spec.protocol.decision)
        return MethodResult(
            attribution=attribution,
            votes=tuple(votes),
            reports={a: r.model_dump(mode="json") if r else None for a, r in reports.items()},
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
            task = [ChatMessage(role="user", content=self_assessment(spec, agent.id))]
            opening = [
                ChatMessage(
                    role="user",
                    content=interrogation_opening(spec, space, {}, agent.id, spotlight),
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
