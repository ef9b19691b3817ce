"""What control software asks of investigations (trigger, get, list, watch, confirm, reputation),
whatever transport it comes through."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast, get_args

import structlog

from poirotd.campaigns.seeding import seed_from
from poirotd.config import SystemSpec
from poirotd.errors import FailedPrecondition, InvalidArgument, NotFound, quote
from poirotd.investigations.bus import EventBus
from poirotd.investigations.runner import InvestigationRunner
from poirotd.investigations.weights import betas_now
from poirotd.model import (
    MAX_INTEGER,
    AgentReputation,
    CampaignOutcome,
    CampaignSeed,
    CampaignValue,
    ConfirmedOutcome,
    EventKind,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationMethod,
    InvestigationState,
    LLMExchange,
)
from poirotd.observability.metrics import Metrics
from poirotd.protocol.ensemble import confirmed_reliabilities, method_reliabilities
from poirotd.protocol.errorprobe.memory import learn_from_confirmation
from poirotd.protocol.poirot.hazard_space import pinned_hazard_space
from poirotd.protocol.reputation import reassess
from poirotd.store import AlreadyConfirmedError, Store


@dataclass(frozen=True)
class MethodReliabilityView:
    """One ensemble member's reliability as GetReputation shows it."""

    method: str
    reliability: float
    confirmed: float
    confirmations: int
    campaign: CampaignValue | None


log = structlog.get_logger(__name__)

# The longest free text a caller may give (a Trigger reason, a ConfirmOutcome note).
MAX_TEXT_CHARS = 4000
# How often one investigation's confirmed outcome may be corrected: each correction is kept in
# its record, which is saved whole.
MAX_CORRECTIONS = 16

_TERMINAL_EVENTS = frozenset({EventKind.ATTRIBUTION_READY, EventKind.FAILED, EventKind.INTERRUPTED})
# How often an idle Watch re-checks the store without a wake-up (a safety net, not a poll loop).
_WATCH_IDLE_SECONDS = 5.0


class InvestigationService:
    def __init__(
        self,
        spec: SystemSpec,
        store: Store,
        runner: InvestigationRunner,
        bus: EventBus,
        metrics: Metrics,
    ) -> None:
        self.spec = spec
        self._store = store
        self._runner = runner
        self._bus = bus
        self.metrics = metrics

    async def trigger(
        self, session_id: str, reason: str, *, method: str = "poirot", requested_by: str = ""
    ) -> Investigation:
        """Queues an investigation of a stored session by `method` (InvestigationMethod):
        "poirot" (the protocol), "baseline" (one LLM call over the full session, the paper's
        comparator), "echo", "errorprobe" or "ensemble"; or returns the session's open one by
        that method, which the trigger joined. `requested_by`: the caller, whose share of the
        queue it takes (`poirotd.investigations.admission`)."""
        if not session_id:
            raise InvalidArgument("session_id is empty", reason="invalid")
        _check_text("reason", reason)
        _check_method(method)
        if not await self._store.find_session(session_id):
            raise NotFound(f"session {quote(session_id)} is not known", reason="unknown_session")
        investigation = await self._runner.submit(
            session_id,
            reason or "manual trigger",
            method=cast(InvestigationMethod, method),
            requested_by=requested_by,
        )
        self.metrics.hazard_events.labels(self.spec.system.name, "manual", "warning").inc()
        return investigation

    async def exchanges(self, investigation_id: str) -> list[LLMExchange]:
        await self.get(investigation_id)
        return await self._store.exchanges(investigation_id)

    async def get(self, investigation_id: str) -> Investigation:
        investigation = await self._store.get_investigation(investigation_id)
        if investigation is None:
            raise NotFound(f"investigation {quote(investigation_id)} not found", reason="not_found")
        return investigation

    async def history(self, investigation_id: str) -> list[InvestigationEvent]:
        """The investigation's stored events, oldest first (the page's timeline)."""
        await self.get(investigation_id)
        return await self._store.events_after(0, investigation_id=investigation_id)

    async def latest_event_id(self) -> int:
        """The newest stored event's id: where a follower of every investigation starts."""
        return await self._store.latest_event_id()

    async def list(
        self,
        *,
        session_id: str | None,
        state: InvestigationState | None,
        page_size: int,
        page_token: str | None,
        method: str | None = None,
        canaries: bool = False,
    ) -> tuple[list[Investigation], str | None]:
        if method is not None:
            _check_method(method)
        try:
            return await self._store.list_investigations(
                session_id=session_id,
                state=state,
                method=method,
                limit=page_size,
                page_token=page_token,
                canaries=canaries,
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc), reason="invalid") from exc

    async def watch(
        self,
        *,
        after_event_id: int,
        investigation_id: str | None,
        component: str = "",
        min_score: float = 0.0,
    ) -> AsyncIterator[InvestigationEvent]:
        """Like `events`, keeping with a component or min_score filter only the attributions
        that meet it. Filtering happens on the stored, ordered events, so a client resuming from
        the last event id it saw still loses and repeats nothing."""
        filtered = bool(component) or min_score > 0
        async for event in self.events(
            after_event_id=after_event_id, investigation_id=investigation_id
        ):
            if not filtered or _meets(event, component, min_score):
                yield event

    async def events(
        self, *, after_event_id: int, investigation_id: str | None
    ) -> AsyncIterator[InvestigationEvent]:
        """Stored events after `after_event_id`, then live ones. A single-investigation watch
        ends once it has delivered that investigation's terminal event (attribution ready,
        failed or interrupted), which is stored after the record is final."""
        if not 0 <= after_event_id <= MAX_INTEGER:
            raise InvalidArgument(
                f"after_event_id {after_event_id} is beyond {MAX_INTEGER}", reason="invalid"
            )
        if investigation_id:
            await self.get(investigation_id)  # NOT_FOUND early rather than an endless empty stream
        last = after_event_id
        while True:
            events = await self._store.events_after(last, investigation_id=investigation_id)
            for event in events:
                yield event
                last = event.event_id
                if investigation_id and event.kind in _TERMINAL_EVENTS:
                    return
            if events:
                continue
            if investigation_id and await self._ended_before(investigation_id, last):
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_WATCH_IDLE_SECONDS):
                    await self._bus.wait_beyond(last)

    async def _ended_before(self, investigation_id: str, event_id: int) -> bool:
        """True when the investigation's terminal event is at or before event_id: a watch
        resumed past the end has nothing left to wait for."""
        if not (await self.get(investigation_id)).state.finished:
            return False
        events = await self._store.events_after(0, investigation_id=investigation_id)
        return any(e.kind in _TERMINAL_EVENTS and e.event_id <= event_id for e in events)

    async def confirm_outcome(
        self,
        investigation_id: str,
        region_ids: Sequence[str],
        note: str,
        *,
        supersede: bool = False,
    ) -> tuple[Investigation, bool]:
        """Records which region(s) truly caused a succeeded investigation's incident and, with
        reputation enabled, derives every agent's β_i anew from the whole confirmed history;
        an ErrorProbe diagnosis that blamed a confirmed region enters its memory. Returns the
        record and whether this call changed it (False: the same regions were confirmed before).
        Other regions than those confirmed are refused unless `supersede` (an operator's
        correction, which needs a note saying why): the replaced outcome stays in the record's
        `superseded` and in the audit chain."""
        _check_text("note", note)
        if supersede and not note.strip():
            raise InvalidArgument(
                "a correction (supersede) needs a note: who corrects it, and why",
                reason="missing_note",
            )
        investigation = await self.get(investigation_id)
        if investigation.canary is not None:
            raise FailedPrecondition(
                f"investigation {investigation_id!r} is a canary's (a labelled case replayed to "
                "measure attribution): its truth is its label, and it moves no β",
                reason="canary",
            )
        space = investigation.hazard_space
        if investigation.state is not InvestigationState.SUCCEEDED or space is None:
            raise FailedPrecondition(
                f"investigation {investigation_id!r} is {investigation.state.value}; only a "
                "succeeded one has votes to confirm",
                reason="not_succeeded",
            )
        if supersede and len(investigation.superseded) >= MAX_CORRECTIONS:
            raise FailedPrecondition(
                f"investigation {investigation_id!r} was corrected {MAX_CORRECTIONS} times "
                "already, the limit",
                reason="too_many_corrections",
            )
        known = [region.id for region in space.regions]
        if not region_ids:
            raise InvalidArgument("region_ids is empty: name the true cause(s)", reason="invalid")
        unknown = sorted(set(region_ids) - set(known))
        if unknown:
            named = ", ".join(quote(region) for region in unknown[:5])
            raise InvalidArgument(
                f"regions {named} are not in the investigation's hazard space {known}",
                reason="unknown_region",
            )
        outcome = ConfirmedOutcome(
            region_ids=tuple(r for r in known if r in region_ids),
            decision=tuple(int(region in region_ids) for region in known),
            note=note,
            at=datetime.now(UTC),
        )
        try:
            record, changed = await self._store.confirm_outcome(
                investigation_id,
                outcome,
                lambda history, stored: reassess(
                    self.spec, history, stored, investigation_id=investigation_id, at=outcome.at
                ),
                supersede=supersede,
            )
        except AlreadyConfirmedError as exc:
            raise FailedPrecondition(str(exc), reason="already_confirmed") from exc
        if changed and record.superseded:
            log.info(
                "confirmed outcome superseded",
                investigation_id=investigation_id,
                replaced=list(record.superseded[-1].region_ids),
                confirmed=list(outcome.region_ids),
            )
        # Also when it was confirmed before: a confirmation whose memory update a crash cut off
        # is completed by the client's retry (learning is idempotent per investigation).
        await learn_from_confirmation(self._store, record)
        self.metrics.record_betas(await self.betas())
        return record, changed

    async def reputations(self) -> dict[str, AgentReputation]:
        """The stored reputation of each agent that has one (confirmed outcomes moved it)."""
        return await self._store.reputations(self.spec.system.name)

    async def betas(self) -> dict[str, float]:
        """The β each agent's vote is weighed with from now on."""
        return await betas_now(self.spec, self._store)

    async def campaign_seed(self) -> CampaignSeed | None:
        """The fault campaign's seed in force (SeedReputation), if any."""
        return await self._store.campaign_seed(self.spec.system.name)

    async def seed_reputation(
        self, source: str, outcomes: Sequence[CampaignOutcome]
    ) -> CampaignSeed:
        """Stores what a fault campaign's labelled `outcomes` make of the agents' β and the
        methods' reliabilities, replacing the seed before; confirmed reputations are left as
        they are (`poirotd.campaigns.seeding`)."""
        _check_text("source", source)
        try:
            seed = seed_from(self.spec, outcomes, source=source, at=datetime.now(UTC))
        except ValueError as exc:
            raise InvalidArgument(str(exc), reason="invalid") from exc
        await self._store.put_campaign_seed(seed)
        log.info(
            "reputation seeded from a fault campaign",
            source=source,
            cases=seed.cases,
            agents=sorted(seed.agents),
            methods=sorted(seed.methods),
        )
        self.metrics.record_betas(await self.betas())
        return seed

    async def reliabilities(self) -> Sequence[MethodReliabilityView]:
        """The ensemble members' reliabilities: in use, from confirmed outcomes, from the
        campaign."""
        settings = self.spec.protocol.ensemble.reliability
        confirmed = await self._store.confirmed_investigations(self.spec.system.name)
        seed = await self.campaign_seed()
        learnt = confirmed_reliabilities(settings, confirmed) if settings.enabled else {}
        in_use = method_reliabilities(settings, confirmed, seed)
        campaign = seed.methods if seed is not None else {}
        views = []
        for method in self.spec.protocol.ensemble.members:
            rho, confirmations = learnt.get(method, (settings.initial, 0))
            views.append(
                MethodReliabilityView(
                    method=method,
                    reliability=in_use.get(method, settings.initial),
                    confirmed=rho,
                    confirmations=confirmations,
                    campaign=campaign.get(method),
                )
            )
        return views

    async def hazard_space(self) -> HazardSpace:
        pinned = pinned_hazard_space(self.spec)
        if pinned is not None:
            return pinned
        space = await self._store.get_hazard_space(
            self.spec.system.name, self.spec.description_version()
        )
        if space is None:
            raise NotFound(
                "no hazard space yet: it is built by the first investigation (or pin one in the "
                "spec under hazard_space.regions)",
                reason="not_found",
            )
        return space


def _check_method(method: str) -> None:
    methods = get_args(InvestigationMethod)
    if method not in methods:
        raise InvalidArgument(
            f"method must be one of {list(methods)}, got {quote(method)}", reason="invalid"
        )


def _check_text(field: str, text: str) -> None:
    """Free text a caller gives is stored with every version of the record it belongs to, and a
    Trigger reason reaches every agent's prompt: it is bounded."""
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidArgument(
            f"{field} is {len(text)} characters, the limit is {MAX_TEXT_CHARS}",
            reason="too_long",
        )


def _meets(event: InvestigationEvent, component: str, min_score: float) -> bool:
    """An attribution whose `component` (its top region when empty) scores at least min_score;
    a component outside the investigation's hazard space never matches."""
    if event.kind is not EventKind.ATTRIBUTION_READY or event.attribution is None:
        return False
    scores = event.attribution.scores
    if component:
        if component not in event.region_ids:
            return False
        return scores[event.region_ids.index(component)] >= min_score
    return any(scores[i] >= min_score for i in event.attribution.top)
