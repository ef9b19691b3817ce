"""The investigation queue and its workers: each queued investigation runs through the protocol
engine while a recorder keeps its record, events and metrics.

The queue is bounded (a full queue refuses new triggers); on shutdown, unfinished investigations
are kept as INTERRUPTED with whatever they had produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import ResourceExhausted, Unavailable
from poirotd.hazards import summarise_window
from poirotd.investigations.bus import EventBus
from poirotd.investigations.recorder import EventLog, InvestigationRecorder, now
from poirotd.model import (
    EventKind,
    HazardEvent,
    Investigation,
    InvestigationMethod,
    InvestigationState,
    Reading,
)
from poirotd.observability.metrics import Metrics
from poirotd.protocol import prompts
from poirotd.protocol.engine import InvestigationEngine
from poirotd.protocol.ensemble import method_reliabilities
from poirotd.protocol.errors import ProtocolError
from poirotd.protocol.reputation import betas_in_use
from poirotd.store import Store

log = structlog.get_logger(__name__)

# Telemetry samples summarised into the incident description (and checked by ErrorProbe).
_EVIDENCE_SAMPLES = 2000


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
        self._events = EventLog(store, bus)
        self._metrics = metrics
        self._backend = backend_name
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
                created_at=now(),
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
        for investigation_id in await self._store.interrupt_unfinished(reason, now()):
            await self._events.emit(investigation_id, EventKind.INTERRUPTED, reason=reason)
            record = await self._store.get_investigation(investigation_id)
            method = record.method if record is not None else "poirot"
            self._metrics.investigations.labels(self._spec.system.name, "interrupted", method).inc()

    async def _work(self) -> None:
        while True:
            investigation = await self._queue.get()
            self._metrics.queue_depth.labels(self._spec.system.name).set(self._queue.qsize())
            try:
                await self._run(investigation)
            finally:
                self._queue.task_done()

    async def _run(self, investigation: Investigation) -> None:
        recorder = InvestigationRecorder(
            investigation, self._store, self._events, self._metrics, backend_name=self._backend
        )
        await recorder.started()
        try:
            messages = await self._store.session_messages(investigation.session_id)
            betas = betas_in_use(self._spec, await self._store.reputations(investigation.system))
            self._metrics.record_betas(betas)
            readings = await self._store.newest_readings(
                investigation.session_id, limit=_EVIDENCE_SAMPLES
            )
            incident = await self._describe(investigation, readings)
            await recorder.update(incident=prompts.incident_section(incident), betas=betas)
            outcome = await self._engine.run(
                messages,
                recorder.on_event,
                incident=incident,
                betas=betas,
                method=investigation.method,
                readings=readings,
                reliabilities=await self._reliabilities(investigation),
                investigation_id=investigation.investigation_id,
            )
        except ProtocolError as exc:
            await recorder.failed(str(exc))
        except asyncio.CancelledError:
            recorder.cancelled()  # drain() stores the record as INTERRUPTED
            raise
        except Exception as exc:
            recorder.log.exception("investigation crashed")
            await recorder.failed(f"internal error: {type(exc).__name__}: {exc}")
        else:
            await recorder.succeeded(outcome)

    async def _reliabilities(self, investigation: Investigation) -> dict[str, float]:
        """The methods' reliabilities from confirmed outcomes, which only an ensemble weighs."""
        if investigation.method != "ensemble":
            return {}
        confirmed = await self._store.confirmed_investigations(investigation.system)
        return method_reliabilities(self._spec.protocol.ensemble.reliability, confirmed)

    async def _describe(
        self, investigation: Investigation, readings: list[Reading]
    ) -> prompts.Incident:
        # Thousands of readings: summarised off the event loop, which meanwhile keeps evaluating
        # hazard rules on arriving telemetry.
        telemetry = await asyncio.to_thread(summarise_window, readings) if readings else ""
        return prompts.Incident(investigation.reason, investigation.trigger, telemetry)
