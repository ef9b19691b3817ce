"""Runs queued investigations through the POIROT engine and records everything they produce.

The queue is bounded (a full queue refuses new triggers); every protocol event is persisted before
it is announced, so Watch streams and the audit see the same history; on shutdown, unfinished
investigations are kept as INTERRUPTED with whatever they had produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import ResourceExhausted, Unavailable
from poirotd.hazards import summarise_window
from poirotd.investigations.bus import EventBus
from poirotd.model import (
    EventKind,
    HazardEvent,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationMethod,
    InvestigationState,
    LLMExchange,
    PhaseTiming,
    Vote,
)
from poirotd.observability.metrics import Metrics
from poirotd.protocol.engine import InvestigationEngine, ProtocolOutcome
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.events import (
    ContextCutsMade,
    ExchangeDone,
    PhaseBegun,
    PhaseEnded,
    ProtocolEvent,
    ReportFiled,
    VoteCast,
)
from poirotd.protocol.reputation import betas_in_use
from poirotd.store import Store

log = structlog.get_logger(__name__)

# Telemetry samples summarised into the incident description.
_EVIDENCE_SAMPLES = 2000


def _now() -> datetime:
    return datetime.now(UTC)


class InvestigationRunner:
    def __init__(
        self,
        spec: SystemSpec,
        store: Store,
        engine: InvestigationEngine,
        bus: EventBus,
        metrics: Metrics,
        *,
        backend_name: str,
        capacity: int,
        workers: int,
    ) -> None:
        self._spec = spec
        self._store = store
        self._engine = engine
        self._bus = bus
        self._metrics = metrics
        self._backend_name = backend_name
        self._queue: asyncio.Queue[Investigation] = asyncio.Queue(maxsize=capacity)
        self._workers = workers
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        self._submitting = asyncio.Lock()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"investigation-worker-{i}")
            for i in range(self._workers)
        ]

    @property
    def accepting(self) -> bool:
        return not self._draining

    async def submit(
        self,
        session_id: str,
        reason: str,
        trigger: HazardEvent | None = None,
        *,
        method: InvestigationMethod = "poirot",
    ) -> Investigation:
        """Queues an investigation over a stored session, to be run by `method`, and returns
        its QUEUED record."""
        async with self._submitting:  # the capacity check holds until the record is queued
            if self._draining:
                raise Unavailable(
                    "the daemon is shutting down; no new investigations", reason="draining"
                )
            if self._queue.full():
                raise ResourceExhausted(
                    f"investigation queue is full ({self._queue.maxsize} waiting)",
                    reason="queue_full",
                )
            investigation = Investigation(
                investigation_id=uuid.uuid4().hex,
                system=self._spec.system.name,
                session_id=session_id,
                state=InvestigationState.QUEUED,
                reason=reason,
                method=method,
                trigger=trigger,
                created_at=_now(),
            )
            await self._store.save_investigation(investigation)
            self._queue.put_nowait(investigation)
        self._metrics.queue_depth.labels(self._spec.system.name).set(self._queue.qsize())
        log.info(
            "investigation queued",
            investigation_id=investigation.investigation_id,
            session_id=session_id,
        )
        return investigation

    async def drain(self, seconds: float) -> None:
        """Refuses new work, lets running and queued investigations finish for up to `seconds`,
        then cancels the rest; whatever did not finish is stored as INTERRUPTED."""
        self._draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._queue.join()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.interrupt_unfinished("daemon stopped before the investigation finished")

    async def interrupt_unfinished(self, reason: str) -> None:
        """Marks every QUEUED or RUNNING investigation INTERRUPTED (at shutdown, or at start-up
        for leftovers of a crash), keeping what they had produced."""
        for investigation_id in await self._store.interrupt_unfinished(reason, _now()):
            await self._emit(investigation_id, EventKind.INTERRUPTED, reason=reason)
            record = await self._store.get_investigation(investigation_id)
            method = record.method if record is not None else "poirot"
            self._metrics.investigations.labels(self._spec.system.name, "interrupted", method).inc()

    async def _work(self) -> None:
        while True:
            investigation = await self._queue.get()
            self._metrics.queue_depth.labels(self._spec.system.name).set(self._queue.qsize())
            try:
                await _Investigating(self, investigation).run()
            finally:
                self._queue.task_done()

    async def _emit(self, investigation_id: str, kind: EventKind, **fields: object) -> None:
        event = InvestigationEvent.model_validate(
            {
                "event_id": 0,
                "investigation_id": investigation_id,
                "at": _now(),
                "kind": kind,
                **fields,
            }
        )
        stored = await self._store.append_event(event)
        await self._bus.published(stored.event_id)


class _Investigating:
    """One investigation's run: keeps its record current as protocol events arrive."""

    def __init__(self, runner: InvestigationRunner, investigation: Investigation) -> None:
        self._r = runner
        self._record = investigation
        self._phases: list[PhaseTiming] = []
        self._log = log.bind(
            investigation_id=investigation.investigation_id, session_id=investigation.session_id
        )

    async def run(self) -> None:
        r, system = self._r, self._r._spec.system.name
        started = time.monotonic()
        await self._update(state=InvestigationState.RUNNING)
        await self._emit(
            EventKind.STARTED, session_id=self._record.session_id, reason=self._record.reason
        )
        r._metrics.investigations_in_flight.labels(system).inc()
        self._log.info("investigation started")
        try:
            messages = await r._store.session_messages(self._record.session_id)
            betas = betas_in_use(r._spec, await r._store.reputations(system))
            r._metrics.record_betas(betas)
            await self._update(incident=await self._describe_incident(), betas=betas)
            outcome = await r._engine.run(
                messages,
                self._on_event,
                incident=self._record.incident,
                betas=betas,
                method=self._record.method,
            )
        except ProtocolError as exc:
            await self._fail(str(exc), started)
        except asyncio.CancelledError:
            # drain() marks the record INTERRUPTED and emits the event.
            r._metrics.investigations_in_flight.labels(system).dec()
            raise
        except Exception as exc:
            self._log.exception("investigation crashed")
            await self._fail(f"internal error: {type(exc).__name__}: {exc}", started)
        else:
            # The record is final before the event announces it, so a client that reacts to
            # the event with Get sees the finished investigation.
            await self._update(
                state=InvestigationState.SUCCEEDED,
                finished_at=_now(),
                hazard_space=outcome.hazard_space,
                reports=dict(outcome.reports),
                votes=tuple(outcome.votes),
                attribution=outcome.attribution,
                phases=tuple(outcome.phases),
                usage=outcome.usage,
                degraded_reason=degraded_reason(outcome),
            )
            if self._record.degraded_reason:
                r._metrics.investigations_degraded.labels(system).inc()
            self._count_vote_components(outcome.hazard_space, outcome.votes)
            region_ids = [region.id for region in outcome.hazard_space.regions]
            r._metrics.record_attribution(
                region_ids, outcome.attribution.scores, outcome.attribution.top
            )
            await self._emit(
                EventKind.ATTRIBUTION_READY,
                attribution=outcome.attribution,
                region_ids=tuple(region.id for region in outcome.hazard_space.regions),
                region_names=tuple(region.name for region in outcome.hazard_space.regions),
            )
            self._log.info(
                "investigation succeeded",
                top=list(outcome.attribution.top),
                degraded=self._record.degraded_reason,
            )
            self._count_finished(InvestigationState.SUCCEEDED, started)

    async def _describe_incident(self) -> str:
        """Why the investigation was opened and, when the session carries telemetry, a compact
        summary of the latest readings: the hardware evidence the agents may weigh."""
        lines = [f"Reported: {self._record.reason}"]
        if self._record.trigger is not None:
            lines.append(
                f"Rule {self._record.trigger.rule} ({self._record.trigger.severity}): "
                f"{self._record.trigger.summary}"
            )
        readings = await self._r._store.newest_readings(
            self._record.session_id, limit=_EVIDENCE_SAMPLES
        )
        if readings:
            # Thousands of readings: summarised off the event loop, which meanwhile keeps
            # evaluating hazard rules on arriving telemetry.
            summary = await asyncio.to_thread(summarise_window, readings)
            lines.append("Hardware telemetry (latest samples):\n" + summary)
        return "\n".join(lines)

    async def _fail(self, error: str, started: float) -> None:
        await self._update(state=InvestigationState.FAILED, error=error, finished_at=_now())
        await self._emit(EventKind.FAILED, reason=error)
        self._log.warning("investigation failed", error=error)
        self._count_finished(InvestigationState.FAILED, started)

    def _count_finished(self, state: InvestigationState, started: float) -> None:
        r, system = self._r, self._r._spec.system.name
        outcome = state.value
        r._metrics.investigations.labels(system, outcome, self._record.method).inc()
        r._metrics.investigation_duration.labels(system, outcome).observe(
            time.monotonic() - started
        )
        r._metrics.investigations_in_flight.labels(system).dec()

    async def _on_event(self, event: ProtocolEvent) -> None:
        r, system = self._r, self._r._spec.system.name
        if isinstance(event, PhaseBegun):
            await self._emit(EventKind.PHASE_BEGUN, phase=event.phase)
        elif isinstance(event, PhaseEnded):
            self._phases.append(PhaseTiming(phase=event.phase, seconds=event.seconds))
            r._metrics.phase_duration.labels(system, event.phase.value).observe(event.seconds)
            await self._update(phases=tuple(self._phases))
            await self._emit(EventKind.PHASE_ENDED, phase=event.phase, seconds=event.seconds)
        elif isinstance(event, ExchangeDone):
            await r._store.record_exchange(self._record.investigation_id, event.exchange)
            self._count_llm_call(event.exchange)
        elif isinstance(event, ReportFiled):
            await self._update(reports={**self._record.reports, event.agent_id: event.report})
        elif isinstance(event, ContextCutsMade):
            await self._update(context_cuts=(*self._record.context_cuts, *event.cuts))
        elif isinstance(event, VoteCast):
            self._count_vote(event.vote)
            await self._update(votes=(*self._record.votes, event.vote))
            await self._emit(EventKind.VOTE_CAST, vote=event.vote)
        # AttributionReady is announced by run() once the record is final.

    def _count_vote(self, vote: Vote) -> None:
        m, system = self._r._metrics, self._r._spec.system.name
        m.votes.labels(system, vote.agent_id, "abstained" if vote.abstained else "voted").inc()

    def _count_vote_components(self, space: HazardSpace, votes: Sequence[Vote]) -> None:
        m, system = self._r._metrics, self._r._spec.system.name
        for vote in votes:
            for region, bit in zip(space.regions, vote.location, strict=False):
                if bit:
                    m.vote_components.labels(system, vote.agent_id, region.id).inc()

    def _count_llm_call(self, exchange: LLMExchange) -> None:
        m, backend = self._r._metrics, self._r._backend_name
        m.llm_calls.labels(backend, exchange.error_reason or "ok").inc()
        m.llm_up.labels(backend).set(0 if exchange.error else 1)
        m.llm_duration.labels(backend).observe(exchange.seconds)
        m.llm_tokens.labels(backend, "prompt").inc(exchange.prompt_tokens)
        m.llm_tokens.labels(backend, "completion").inc(exchange.completion_tokens)
        m.llm_tokens.labels(backend, "cached").inc(exchange.cached_tokens or 0)

    async def _update(self, **changes: object) -> None:
        self._record = self._record.model_copy(update=changes)
        await self._r._store.save_investigation(self._record)

    async def _emit(self, kind: EventKind, **fields: object) -> None:
        await self._r._emit(self._record.investigation_id, kind, **fields)


def degraded_reason(outcome: ProtocolOutcome) -> str:
    """What a successful run lacked, for the record: "" when every agent reported and voted over
    the hazard space the LLM built (or the operator pinned)."""
    lacks = [
        f"{vote.agent_id} abstained ({vote.abstention_reason})"
        for vote in outcome.votes
        if vote.abstained
    ]
    lacks += [f"{agent} filed no valid report" for agent, r in outcome.reports.items() if r is None]
    if outcome.hazard_space.source == "spec":
        lacks.append("Phase I gave no valid hazard space; the spec's declared parts were used")
    return "; ".join(lacks)
