"""Records what investigations produce: the record kept current, the events Watch streams, and
the Prometheus view of both.

Every event is stored before it is announced, so Watch streams and the audit see the same
history; a record becomes final in the transaction that stores the event announcing its end.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import structlog

from poirotd.investigations.bus import EventBus
from poirotd.model import (
    EventKind,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    LLMExchange,
    LLMUsage,
    PhaseTiming,
    Vote,
)
from poirotd.observability.metrics import Metrics
from poirotd.protocol import injection
from poirotd.protocol.engine import ProtocolOutcome
from poirotd.protocol.events import (
    ContextCutsMade,
    ExchangeDone,
    HazardSpaceBuilt,
    InjectionFound,
    PhaseBegun,
    PhaseEnded,
    ProtocolEvent,
    ReportFiled,
    TokenBudgetSpent,
    VoteCast,
)
from poirotd.store import Lease, Store
from poirotd.store.leases import queued_form

log = structlog.get_logger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


# Told of each record this process made final (succeeded, failed, deferred), once it is stored;
# it must return at once (poirotd.exporters.exporter queues it).
OnFinished = Callable[[Investigation], None]


class EventLog:
    """Investigation events: stored, then announced to Watch streams."""

    def __init__(self, store: Store, bus: EventBus, on_finished: OnFinished | None = None) -> None:
        self._store = store
        self._bus = bus
        self._on_finished = on_finished

    async def emit(
        self,
        investigation_id: str,
        kind: EventKind,
        *,
        lease: Lease | None = None,
        **fields: object,
    ) -> None:
        announced = _new_event(investigation_id, kind, fields)
        stored = await self._store.append_event(announced, lease=lease)
        await self._bus.published(stored.event_id)

    async def finish(
        self, record: Investigation, kind: EventKind, *, lease: Lease | None, **fields: object
    ) -> None:
        """Stores the final record with the event that announces its end, in one transaction."""
        announced = _new_event(record.investigation_id, kind, fields)
        stored = await self._store.finish_investigation(record, announced, lease=lease)
        await self._bus.published(stored.event_id)
        if self._on_finished is not None:
            try:
                self._on_finished(record)
            except Exception:  # the record is stored: what listens must not undo the run
                log.exception("a listener of finished investigations failed")


def _new_event(
    investigation_id: str, kind: EventKind, fields: dict[str, object]
) -> InvestigationEvent:
    return InvestigationEvent.model_validate(
        {"event_id": 0, "investigation_id": investigation_id, "at": now(), "kind": kind} | fields
    )


class InvestigationRecorder:
    """One investigation's record, from RUNNING to its end, as protocol events arrive; every
    write is made under the run's lease (LeaseLostError once another replica took it over)."""

    def __init__(
        self,
        investigation: Investigation,
        store: Store,
        events: EventLog,
        metrics: Metrics,
        *,
        backend_name: str,
        lease: Lease | None = None,
    ) -> None:
        self.record = investigation
        self._lease = lease
        self._in_flight = False
        self._store = store
        self._events = events
        self._metrics = metrics
        self._system = investigation.system
        self._backend = backend_name
        self._phases: list[PhaseTiming] = []
        self._started = time.monotonic()
        # Set once the record is final: a late notice of the model's state changes nothing more.
        self._ended = False
        self.log = log.bind(
            investigation_id=investigation.investigation_id, session_id=investigation.session_id
        )

    async def started(self) -> None:
        await self.update(state=InvestigationState.RUNNING)
        await self._emit(
            EventKind.STARTED, session_id=self.record.session_id, reason=self.record.reason
        )
        self._metrics.investigations_in_flight.labels(self._system).inc()
        self._in_flight = True
        self.log.info("investigation started")

    async def succeeded(self, outcome: ProtocolOutcome) -> None:
        # The record is final when the event announces it (one transaction), so a client that
        # reacts to the event with Get sees the finished investigation.
        self._ended = True
        final = succeeded_record(self.record, outcome)
        regions = outcome.hazard_space.regions
        region_ids = [region.id for region in regions]
        await self._events.finish(
            final,
            EventKind.ATTRIBUTION_READY,
            lease=self._lease,
            attribution=outcome.attribution,
            region_ids=tuple(region_ids),
            region_names=tuple(region.name for region in regions),
        )
        self.record = final
        if self.record.degraded_reason:
            self._metrics.investigations_degraded.labels(self._system).inc()
        self._count_vote_components(outcome.hazard_space, outcome.votes)
        timed = outcome.model_time
        if timed.floor_seconds > 0:
            self._metrics.wall_floor_ratio.labels(self._system).observe(
                timed.wall_seconds / timed.floor_seconds
            )
        self._metrics.record_attribution(
            region_ids, outcome.attribution.scores, outcome.attribution.top
        )
        self.log.info(
            "investigation succeeded",
            top=list(outcome.attribution.top),
            degraded=self.record.degraded_reason,
        )
        self._count_finished(InvestigationState.SUCCEEDED)

    async def failed(self, error: str, usage: LLMUsage | None = None) -> None:
        """`usage`: what the run spent before it failed, when the protocol could tell."""
        self._ended = True
        changes: dict[str, object] = {
            "state": InvestigationState.FAILED,
            "error": error,
            "finished_at": now(),
            "waiting_for_model_since": None,
        }
        if usage is not None:
            changes["usage"] = usage
        final = self.record.model_copy(update=changes)
        await self._events.finish(final, EventKind.FAILED, lease=self._lease, reason=error)
        self.record = final
        self.log.warning("investigation failed", error=error)
        self._count_finished(InvestigationState.FAILED)

    async def deferred(self, reason: str) -> None:
        """A hazard rule's run the model failed past its outage budget: the record goes back to
        its queued form, DEFERRED (its hazard is run again, from the start, once the model
        answers: `InvestigationRunner`), with the event that says why."""
        self._ended = True
        final = queued_form(self.record).model_copy(update={"state": InvestigationState.DEFERRED})
        await self._events.finish(final, EventKind.DEFERRED, lease=self._lease, reason=reason)
        self.record = final
        self.log.warning("investigation deferred until the model answers", error=reason)
        self._metrics.investigations_deferred.labels(self._system).inc()
        self._leave_flight()

    async def waiting_for_model(self, since: datetime, reason: str) -> None:
        """The model cannot serve: the record says since when, and Watch streams are told."""
        if self._ended or self.record.waiting_for_model_since is not None:
            return
        await self.update(waiting_for_model_since=since)
        await self._emit(EventKind.WAITING_FOR_MODEL, reason=reason)
        self.log.warning("investigation waits for the model", since=since.isoformat())

    async def model_returned(self) -> None:
        """A server answers again: the run goes on with what it had."""
        since = self.record.waiting_for_model_since
        if self._ended or since is None:
            return
        waited = (now() - since).total_seconds()
        await self.update(waiting_for_model_since=None)
        await self._emit(EventKind.MODEL_RETURNED, seconds=waited)
        self.log.info("investigation goes on: the model answers", waited_seconds=round(waited, 3))

    def cancelled(self) -> None:
        """The run stopped: the runner stores the record as INTERRUPTED and emits that event
        itself, or the replica that took the investigation over owns it now."""
        self._leave_flight()

    def _leave_flight(self) -> None:
        if self._in_flight:
            self._in_flight = False
            self._metrics.investigations_in_flight.labels(self._system).dec()

    async def on_event(self, event: ProtocolEvent) -> None:
        """The protocol engine's callback: each event lands in the record as it happens."""
        if isinstance(event, PhaseBegun):
            await self._emit(EventKind.PHASE_BEGUN, phase=event.phase)
        elif isinstance(event, PhaseEnded):
            self._phases.append(PhaseTiming(phase=event.phase, seconds=event.seconds))
            self._metrics.phase_duration.labels(self._system, event.phase.value).observe(
                event.seconds
            )
            await self.update(phases=tuple(self._phases))
            await self._emit(EventKind.PHASE_ENDED, phase=event.phase, seconds=event.seconds)
        elif isinstance(event, ExchangeDone):
            await self._store.record_exchange(
                self.record.investigation_id, event.exchange, lease=self._lease
            )
            self._count_llm_call(event.exchange)
        elif isinstance(event, ReportFiled):
            await self.update(reports={**self.record.reports, event.agent_id: event.report})
        elif isinstance(event, ContextCutsMade):
            await self.update(context_cuts=(*self.record.context_cuts, *event.cuts))
        elif isinstance(event, TokenBudgetSpent):
            self._metrics.limit_rejections.labels("llm_token_budget").inc()
            self.log.warning(
                "LLM-token budget spent: no further call", used=event.used, budget=event.budget
            )
        elif isinstance(event, HazardSpaceBuilt):
            self._count_dropped_regions(event.hazard_space)
        elif isinstance(event, InjectionFound):
            await self._injection_found(event)
        elif isinstance(event, VoteCast):
            self._metrics.votes.labels(
                self._system, event.vote.agent_id, "abstained" if event.vote.abstained else "voted"
            ).inc()
            await self.update(votes=(*self.record.votes, event.vote))
            await self._emit(EventKind.VOTE_CAST, vote=event.vote)
        # AttributionReady is announced by succeeded() once the record is final.

    async def _injection_found(self, event: InjectionFound) -> None:
        kinds = Counter(f.kind for f in event.findings)
        for kind, count in kinds.items():
            self._metrics.injection_findings.labels(self._system, kind).inc(count)
        self.log.warning("signs of prompt injection in the quoted text", kinds=dict(kinds))
        await self.update(injection_findings=injection.listed(event.findings))

    async def update(self, **changes: object) -> None:
        self.record = self.record.model_copy(update=changes)
        await self._store.save_investigation(self.record, lease=self._lease)

    async def _emit(self, kind: EventKind, **fields: object) -> None:
        await self._events.emit(self.record.investigation_id, kind, lease=self._lease, **fields)

    def _count_finished(self, state: InvestigationState) -> None:
        outcome = state.value
        self._metrics.investigations.labels(self._system, outcome, self.record.method).inc()
        self._metrics.investigation_duration.labels(self._system, outcome).observe(
            time.monotonic() - self._started
        )
        self._leave_flight()

    def _count_dropped_regions(self, space: HazardSpace) -> None:
        for dropped in space.dropped:
            self._metrics.hazard_regions_dropped.labels(self._system, dropped.reason).inc()
        if space.dropped:
            self.log.warning(
                "hazard space: proposals of the model dropped",
                version=space.version,
                dropped=[d.model_dump() for d in space.dropped],
            )

    def _count_vote_components(self, space: HazardSpace, votes: Sequence[Vote]) -> None:
        for vote in votes:
            for region, bit in zip(space.regions, vote.location, strict=False):
                if bit:
                    self._metrics.vote_components.labels(
                        self._system, vote.agent_id, region.id
                    ).inc()

    def _count_llm_call(self, exchange: LLMExchange) -> None:
        m, backend = self._metrics, self._backend
        m.llm_calls.labels(backend, exchange.error_reason or "ok").inc()
        m.llm_up.labels(backend).set(0 if exchange.error else 1)
        m.llm_duration.labels(backend).observe(exchange.seconds)
        m.llm_tokens.labels(backend, "prompt").inc(exchange.prompt_tokens)
        m.llm_tokens.labels(backend, "completion").inc(exchange.completion_tokens)
        m.llm_tokens.labels(backend, "cached").inc(exchange.cached_tokens or 0)


def succeeded_record(record: Investigation, outcome: ProtocolOutcome) -> Investigation:
    """`record` as it ends with `outcome`: SUCCEEDED, with everything the run produced."""
    return record.model_copy(
        update={
            "state": InvestigationState.SUCCEEDED,
            "waiting_for_model_since": None,
            "finished_at": now(),
            "hazard_space": outcome.hazard_space,
            "reports": dict(outcome.reports),
            "votes": tuple(outcome.votes),
            "attribution": outcome.attribution,
            "phases": tuple(outcome.phases),
            "usage": outcome.usage,
            "model_time": outcome.model_time,
            "degraded_reason": degraded_reason(outcome),
            "findings": outcome.findings,
        }
    )


def degraded_reason(outcome: ProtocolOutcome) -> str:
    """What a successful run lacked, for the record: "" when every agent reported and voted over
    the hazard space the LLM built (or the operator pinned)."""
    lacks = []
    if outcome.budget_spent:
        used = outcome.usage.prompt_tokens + outcome.usage.completion_tokens
        lacks.append(
            f"the LLM-token budget ran out ({used:,} tokens used, POIROTD_LLM_TOKEN_BUDGET): "
            "no further LLM call was made"
        )
    lacks += [
        f"{vote.agent_id} abstained ({vote.abstention_reason})"
        for vote in outcome.votes
        if vote.abstained
    ]
    lacks += [f"{agent} filed no valid report" for agent, r in outcome.reports.items() if r is None]
    if outcome.hazard_space.source == "spec":
        lacks.append("Phase I gave no valid hazard space; the spec's declared parts were used")
    lacks += outcome.lacks
    return "; ".join(lacks)
