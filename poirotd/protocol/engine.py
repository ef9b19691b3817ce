"""The POIROT engine: the five phases in order, for one system spec, one incident per `run`.

Everything the run learns is pushed to `on_event` as it happens (each LLM exchange, report and
vote) and returned as a `ProtocolOutcome` at the end. A run holds no state beyond its own call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from poirotd.config.spec import SystemSpec
from poirotd.llm.base import LLMBackend
from poirotd.model import (
    AgentMessage,
    Attribution,
    Frozen,
    HazardSpace,
    LLMUsage,
    Phase,
    PhaseTiming,
    Vote,
)
from poirotd.protocol import prompts
from poirotd.protocol.aggregation import aggregate
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import AttributionReady, ProtocolEvent
from poirotd.protocol.hazard_space import HazardSpaceCache, resolve_hazard_space
from poirotd.protocol.interrogation import interrogate
from poirotd.protocol.run import RunContext
from poirotd.protocol.self_assessment import self_assess


class ProtocolOutcome(Frozen):
    hazard_space: HazardSpace
    # Phase II report per agent, as JSON; None when the agent gave no valid report.
    reports: dict[str, dict[str, Any] | None]
    votes: tuple[Vote, ...]
    attribution: Attribution
    phases: tuple[PhaseTiming, ...]
    usage: LLMUsage


class InvestigationEngine:
    def __init__(
        self, spec: SystemSpec, backend: LLMBackend, hazard_spaces: HazardSpaceCache
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._hazard_spaces = hazard_spaces

    async def run(
        self,
        messages: Sequence[AgentMessage],
        on_event: Callable[[ProtocolEvent], Awaitable[None]],
        *,
        incident: str = "",
    ) -> ProtocolOutcome:
        """Investigate the session `messages` (in session order); `incident` tells the agents
        why the investigation was opened and what the hardware reported around it.

        Raises ProtocolError when no hazard space can be built or every agent abstains;
        cancellation propagates and cancels every LLM call in flight.
        """
        spec, run = self._spec, RunContext(self._backend, on_event)
        async with run.phase(Phase.HAZARD_SPACE):
            space = await resolve_hazard_space(spec, self._hazard_spaces, run)
        prefixes = {a.id: prompts.agent_prefix(a, messages, incident) for a in spec.agents}
        async with run.phase(Phase.SELF_ASSESSMENT):
            reports = await self_assess(spec, prefixes, run)
        votes = await interrogate(spec, space, prefixes, reports, run)
        if all(v.abstained for v in votes):
            reasons = "; ".join(f"{v.agent_id}: {v.abstention_reason}" for v in votes)
            raise ProtocolError(f"no agent cast a valid vote: {reasons}")
        async with run.phase(Phase.AGGREGATION):
            attribution = aggregate(space, votes, spec.protocol.beta, spec.protocol.decision)
            await run.emit(AttributionReady(attribution=attribution, hazard_space=space))
        return ProtocolOutcome(
            hazard_space=space,
            reports={a: r.model_dump(mode="json") if r else None for a, r in reports.items()},
            votes=tuple(votes),
            attribution=attribution,
            phases=run.timings(),
            usage=run.usage,
        )
