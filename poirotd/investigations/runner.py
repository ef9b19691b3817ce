"""The investigation queue and its workers: each queued investigation runs through the protocol
engine while a recorder keeps its record, events and metrics.

The queue is the store's QUEUED investigations, so that any replica of a shared store runs what
any other queued: a worker claims one with a lease (`Store.claim_investigation`), renews it while
the investigation runs and writes under it (fenced: a replica that lost its lease can store
nothing more of that investigation, its completion least of all). A replica that dies leaves its
lease to expire; another then claims the investigation and re-runs it from the start
(`poirotd.store.leases`). Who gets a place in the bounded queue, and what a hazard that finds it
full becomes (DEFERRED, queued once a run starts and frees a place), is
`poirotd.investigations.admission`. On shutdown, alone on its store, the daemon keeps what
Trigger calls asked for and it could not finish in time (queued or running) as INTERRUPTED with
whatever it had produced, and at start-up what a crash left; a hazard rule's is queued again
instead, to run from the start (a hazard is never lost). A replica of a shared store leaves its
queued work to the others and hands its unfinished runs back (their leases end at once): another
replica re-runs them.

A model that cannot serve (its servers restart) is waited out where the work is: each LLM call
waits within the backend's outage budget (`poirotd.llm.openai_http`), so a run keeps what its
phases have done and goes on once a server answers, its record saying meanwhile since when it
waits (`waiting_for_model_since`, and Watch events); no worker starts another run until then.
A call still unserved at the end of its budget ends the run: a Trigger call's investigation
fails with that reason, a hazard rule's is DEFERRED and run again once the model answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Sequence
from datetime import datetime, timedelta

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import Unavailable
from poirotd.hazards import summarise_window
from poirotd.investigations.admission import QueueShares
from poirotd.investigations.bus import EventBus
from poirotd.investigations.recorder import EventLog, InvestigationRecorder, OnFinished, now
from poirotd.investigations.replica import Replica
from poirotd.investigations.weights import betas_now, reliabilities_now
from poirotd.model import (
    EventKind,
    HazardEvent,
    Investigation,
    InvestigationMethod,
    InvestigationState,
    LLMUsage,
    Reading,
)
from poirotd.observability.metrics import Metrics
from poirotd.observability.outages import PartState
from poirotd.protocol import prompts
from poirotd.protocol.engine import InvestigationEngine, ProtocolOutcome
from poirotd.protocol.errors import ModelUnavailableError, ProtocolError
from poirotd.store import Admission, Admitted, Lease, LeaseLostError, Store
from poirotd.store.faults import StoreUnreachable

log = structlog.get_logger(__name__)

# Telemetry samples summarised into the incident description (and checked by ErrorProbe).
EVIDENCE_SAMPLES = 2000


async def describe_incident(
    reason: str, trigger: HazardEvent | None, readings: Sequence[Reading]
) -> prompts.Incident:
    """What the agents are told of an incident: its reason, the rule event that opened it and
    a summary of the session's newest `readings` (at most EVIDENCE_SAMPLES) as hardware
    evidence. Thousands of readings are summarised off the event loop, which meanwhile keeps
    evaluating hazard rules on arriving telemetry."""
    telemetry = await asyncio.to_thread(summarise_window, readings) if readings else ""
    return prompts.Incident(reason, trigger, telemetry)


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
        shares: QueueShares,
        workers: int,
        replica: Replica,
        model: PartState | None = None,
        on_finished: OnFinished | None = None,
    ) -> None:
        """`model`: whether the LLM's servers answer (None: a backend in this process, never
        down); while they do not, no investigation is started, and running ones say they wait.
        `on_finished`: told of each record this replica made final (the OTLP exporter)."""
        self._spec = spec
        self._store = store
        self._engine = engine
        self._events = EventLog(store, bus, on_finished)
        self._metrics = metrics
        self._backend = backend_name
        self._shares = shares
        self._workers = workers
        self.replica = replica
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        # Set when this daemon queued something (or drains), so idle workers claim at once.
        self._wake = asyncio.Event()
        # The leases of the runs in progress, and of those stopped because another replica took
        # their investigation over.
        self._running: set[Lease] = set()
        self._lost_leases: set[Lease] = set()
        # When the oldest hazard's investigation not started yet was opened, as last read.
        self._oldest_waiting: datetime | None = None
        metrics.oldest_hazard_wait.labels(spec.system.name).set_function(self._hazard_wait)
        self._model = model
        # Set, and replaced, each time the model goes down or comes back.
        self._model_changed = asyncio.Event()
        if model is not None:
            model.subscribe(self._model_changed_now)

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
        *,
        method: InvestigationMethod = "poirot",
        requested_by: str = "",
    ) -> Investigation:
        """Queues an investigation over a stored session, to be run by `method`, for
        `requested_by` (counted against its share of the queue), and returns its QUEUED record;
        or the session's open investigation by `method`, which the request joined.
        ResourceExhausted beyond the shares of Trigger calls (`admission.QueueShares`)."""
        if self._draining:
            raise Unavailable(
                "the daemon is shutting down; no new investigations", reason="draining"
            )
        candidate = self._candidate(session_id, reason, method=method, requested_by=requested_by)
        return (await self._admit(candidate, None)).investigation

    async def open_for(self, event: HazardEvent, cooldown: timedelta) -> Admitted:
        """Opens the investigation of a rule's hazard event; never refused, also while the
        daemon drains: it is queued, deferred until the queue has room, or coalesced into the
        session's open investigation (or the one a hazard of the session opened within
        `cooldown` of this one, by any replica)."""
        reason = f"rule {event.rule}: {event.summary}"
        candidate = self._candidate(event.session_id, reason, trigger=event)
        return await self._admit(candidate, cooldown)

    def _candidate(
        self,
        session_id: str,
        reason: str,
        *,
        method: InvestigationMethod = "poirot",
        trigger: HazardEvent | None = None,
        requested_by: str = "",
    ) -> Investigation:
        return Investigation(
            investigation_id=uuid.uuid4().hex,
            system=self._spec.system.name,
            session_id=session_id,
            state=InvestigationState.QUEUED,
            reason=reason,
            method=method,
            trigger=trigger,
            created_at=now(),
            requested_by=requested_by,
        )

    async def _admit(self, candidate: Investigation, cooldown: timedelta | None) -> Admitted:
        admitted = await self._store.admit_investigation(
            candidate, self._shares.admit(candidate), cooldown=cooldown
        )
        investigation = admitted.investigation
        context = {
            "investigation_id": investigation.investigation_id,
            "session_id": investigation.session_id,
        }
        system = self._spec.system.name
        if admitted.admission is Admission.QUEUED:
            self._wake.set()
            log.info("investigation queued", **context)
        elif admitted.admission is Admission.DEFERRED:
            self._metrics.investigations_deferred.labels(system).inc()
            log.warning(
                "investigation deferred: the queue is full, or older hazards wait", **context
            )
            await self._queue_deferred()  # a place may have freed meanwhile
        else:
            trigger = "manual" if candidate.trigger is None else "rule"
            self._metrics.investigations_coalesced.labels(system, trigger).inc()
            log.info(
                "trigger coalesced into the session's open investigation",
                state=investigation.state.value,
                **context,
            )
        await self._count_queued()
        return admitted

    async def _queue_deferred(self) -> None:
        """Queues deferred hazards into the places the queue has (oldest first); a store that
        cannot be reached leaves them to the next run's start, or the next idle worker."""
        try:
            queued = await self._store.queue_deferred(self._shares.capacity)
        except StoreUnreachable:  # its outage is logged once, by the store
            return
        except Exception:
            log.exception("queueing deferred investigations failed")
            return
        for investigation in queued:
            log.info(
                "deferred investigation queued",
                investigation_id=investigation.investigation_id,
                session_id=investigation.session_id,
            )
        if queued:
            self._wake.set()

    async def _left_queue(self) -> None:
        """A run started: its place in the queue is free for the oldest deferred hazard, and
        it waits no more."""
        await self._queue_deferred()
        await self._count_queued()

    def _hazard_wait(self) -> float:
        """The oldest waiting hazard's age, from the time last read (the gauge's callback)."""
        if self._oldest_waiting is None:
            return 0.0
        return max((now() - self._oldest_waiting).total_seconds(), 0.0)

    async def drain(self, seconds: float) -> None:
        """Refuses new Trigger calls and lets running investigations (alone on the store: the
        queued ones too) finish for up to `seconds`, then cancels the rest. Alone on the store,
        what did not finish is stored as INTERRUPTED, or queued again for a hazard rule's; with
        replicas, its leases end at once, so that another replica takes those investigations
        over and runs them again."""
        self._draining = True
        self._wake.set()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=seconds)
        unfinished = set(self._running)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.replica.shared:
            try:
                await self._settle_unfinished("daemon stopped before the investigation finished")
            except StoreUnreachable:  # the next start settles what this one could not
                log.warning("unfinished investigations left to the next start: no store")
            return
        for lease in unfinished:
            with contextlib.suppress(Exception):  # unreachable store: the lease expires anyway
                await self._store.hand_back_lease(lease)
                log.info("investigation handed back", investigation_id=lease.investigation_id)

    async def recover(self) -> None:
        """At start-up, alone on the store: what a crash left queued or running is kept as
        INTERRUPTED (a hazard rule's is queued again), and deferred hazards get the queue's free
        places. With replicas nothing is touched: live replicas' investigations run on, a dead
        one's are taken over once their leases expire, and idle workers queue deferred ones."""
        if not self.replica.shared:
            await self._settle_unfinished("daemon restarted before the investigation finished")
            await self._queue_deferred()
        await self._count_queued()

    async def _settle_unfinished(self, reason: str) -> None:
        """Alone on the store: Trigger calls' QUEUED or RUNNING investigations INTERRUPTED
        (keeping what they had produced), hazard rules' queued again (`Store.settle_unfinished`)."""
        settled = await self._store.settle_unfinished(reason, now())
        for investigation_id in settled.interrupted:
            await self._events.emit(investigation_id, EventKind.INTERRUPTED, reason=reason)
            record = await self._store.get_investigation(investigation_id)
            method = record.method if record is not None else "poirot"
            self._metrics.investigations.labels(self._spec.system.name, "interrupted", method).inc()
        for investigation_id in settled.requeued:
            log.info("hazard's investigation kept queued", investigation_id=investigation_id)

    def _model_changed_now(self) -> None:
        self._model_changed.set()
        self._model_changed = asyncio.Event()

    async def _work(self) -> None:
        """Claims and runs investigations until the daemon drains (with replicas, it leaves the
        queue to them at once; alone, it empties the queue first). While the model cannot
        serve, nothing is claimed: a run started then would only wait in its first call."""
        replica = self.replica
        while not (self._draining and replica.shared):
            self._wake.clear()
            if self._model is not None and not self._model.up and not self._draining:
                await self._until_woken(self._model.wait_up())
                continue
            mark = self._store.change_mark()
            try:
                claim = await self._store.claim_investigation(
                    replica.replica_id, replica.lease_seconds
                )
            except Exception as exc:  # the store is unreachable: try again after a pause
                if not isinstance(exc, StoreUnreachable):  # whose outage the store logs once
                    log.exception("claiming an investigation failed")
                await asyncio.sleep(replica.poll_seconds)
                continue
            if claim is None:
                # Nothing claimable: nothing waits that a worker could start, unless deferred.
                self._metrics.queue_depth.labels(self._spec.system.name).set(0)
                if self._draining:
                    return
                await self._queue_deferred()
                if self._oldest_waiting is not None:
                    await self._count_queued()
                await self._idle(mark)
                continue
            await self._run_leased(*claim)
            await self._count_queued()

    async def _idle(self, mark: int) -> None:
        """Until this daemon queues something or drains; with replicas, also until the store
        tells of another's write after `mark`, and at most a poll interval."""
        if not self.replica.shared:
            await self._until_woken()
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.replica.poll_seconds):
                await self._until_woken(self._store.wait_for_change(mark))

    async def _until_woken(self, event: Awaitable[object] | None = None) -> None:
        """Until this daemon queues something or drains, or `event` happens."""
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._wake.wait())]
        if event is not None:
            waits.append(asyncio.ensure_future(event))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _count_queued(self) -> None:
        """The queue-depth gauge (the store's queue, every replica's submissions included) and
        the time the oldest waiting hazard's wait is measured from."""
        with contextlib.suppress(Exception):  # a gauge is not worth a failed worker
            self._metrics.queue_depth.labels(self._spec.system.name).set(
                await self._store.count_investigations(InvestigationState.QUEUED)
            )
            self._oldest_waiting = await self._store.oldest_waiting_hazard()

    async def _run_leased(self, investigation: Investigation, lease: Lease) -> None:
        """Runs the investigation while a heartbeat renews its lease; a lease lost (renewal
        refused, or a fenced write) stops the run and leaves the record to its new holder."""
        if lease.taken_over_from:
            self._metrics.investigations_taken_over.labels(self._spec.system.name).inc()
            log.warning(
                "investigation taken over: its replica's lease expired; re-running it",
                investigation_id=investigation.investigation_id,
                previous_owner=lease.taken_over_from,
            )
        self._running.add(lease)
        run = asyncio.create_task(self._run(investigation, lease))
        heartbeat = asyncio.create_task(self._heartbeat(lease, run))
        try:
            await asyncio.shield(run)
        except asyncio.CancelledError:
            if not run.done():  # drain() cancelled the worker: the run goes with it
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
            if not (run.cancelled() and lease in self._lost_leases):
                raise
        finally:
            self._running.discard(lease)
            self._lost_leases.discard(lease)
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _heartbeat(self, lease: Lease, run: asyncio.Task[None]) -> None:
        interval = self.replica.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                held = await self._store.renew_lease(lease, self.replica.lease_seconds)
            except Exception as exc:  # the store is unreachable: the next beat tries again
                if not isinstance(exc, StoreUnreachable):  # whose outage the store logs once
                    log.exception("lease renewal failed", investigation_id=lease.investigation_id)
                continue
            if not held:
                self._lease_lost(lease)
                run.cancel()
                return

    def _lease_lost(self, lease: Lease) -> None:
        self._lost_leases.add(lease)
        self._metrics.leases_lost.labels(self._spec.system.name).inc()
        log.warning(
            "investigation lease lost: another replica took it over; this run stops",
            investigation_id=lease.investigation_id,
        )

    async def _run(self, investigation: Investigation, lease: Lease) -> None:
        recorder = InvestigationRecorder(
            investigation,
            self._store,
            self._events,
            self._metrics,
            backend_name=self._backend,
            lease=lease,
        )
        try:
            await recorder.started()
            await self._left_queue()
            outcome = await self._investigate_noting_waits(investigation, recorder)
        except LeaseLostError:
            self._lease_lost(lease)
            recorder.cancelled()
        except ProtocolError as exc:
            await self._failed(recorder, lease, str(exc), exc.usage)
        except ModelUnavailableError as exc:
            await self._model_failed(recorder, lease, exc)
        except asyncio.CancelledError:
            recorder.cancelled()  # drain() stores the record as INTERRUPTED
            raise
        except StoreUnreachable:  # nothing of the run can be stored: as a crash, run again
            recorder.log.warning(
                "investigation stopped: the store cannot be written; run again once its lease "
                "lapses"
            )
            recorder.cancelled()
        except Exception as exc:
            recorder.log.exception("investigation crashed")
            await self._failed(recorder, lease, f"internal error: {type(exc).__name__}: {exc}")
        else:
            # Fenced: once it is stored, the record is final and no replica can claim it again,
            # so an investigation completes once.
            await self._ended(recorder, lease, recorder.succeeded(outcome))

    async def _investigate_noting_waits(
        self, investigation: Investigation, recorder: InvestigationRecorder
    ) -> ProtocolOutcome:
        """`_investigate`, its record and Watch streams told while it waits for the model."""
        if self._model is None:
            return await self._investigate(investigation, recorder)
        notes = asyncio.create_task(self._note_model_waits(self._model, recorder))
        try:
            return await self._investigate(investigation, recorder)
        finally:
            notes.cancel()
            await asyncio.gather(notes, return_exceptions=True)

    async def _note_model_waits(self, model: PartState, recorder: InvestigationRecorder) -> None:
        """Each time the model goes down or comes back while the run lasts, the record says so
        (`waiting_for_model_since`) and an event tells Watch streams."""
        while True:
            changed = self._model_changed
            try:
                if model.up:
                    await recorder.model_returned()
                elif model.down_since is not None:
                    since = model.down_since
                    reason = (
                        f"no LLM server answers since {since.isoformat()}: the run waits, with "
                        "what it has, and goes on once one does"
                    )
                    await recorder.waiting_for_model(since, reason)
            except Exception as exc:  # the run's own writes meet the same store or lease
                recorder.log.warning("the model's state could not be recorded", error=repr(exc))
            await changed.wait()

    async def _model_failed(
        self, recorder: InvestigationRecorder, lease: Lease, exc: ModelUnavailableError
    ) -> None:
        """The model stayed unavailable past its outage budget. A Trigger call's investigation
        fails with that reason; a hazard rule's is DEFERRED, its lease handed back, and queued
        again (no worker claims it before the model answers), so its hazard is attributed."""
        reason = f"the model was unavailable: {exc}"
        if recorder.record.trigger is None:
            await self._failed(recorder, lease, reason, exc.usage)
            return
        deferral = recorder.deferred(f"{reason}; run again once it answers")
        await self._ended(recorder, lease, deferral)
        with contextlib.suppress(Exception):  # unreachable store: the lease expires anyway
            await self._store.hand_back_lease(lease)
        await self._queue_deferred()

    async def _investigate(
        self, investigation: Investigation, recorder: InvestigationRecorder
    ) -> ProtocolOutcome:
        messages = await self._store.session_messages(investigation.session_id)
        betas = await betas_now(self._spec, self._store)
        self._metrics.record_betas(betas)
        readings = await self._store.newest_readings(
            investigation.session_id, limit=EVIDENCE_SAMPLES
        )
        incident = await describe_incident(investigation.reason, investigation.trigger, readings)
        await recorder.update(incident=prompts.incident_section(incident), betas=betas)
        return await self._engine.run(
            messages,
            recorder.on_event,
            incident=incident,
            betas=betas,
            method=investigation.method,
            readings=readings,
            reliabilities=await reliabilities_now(self._spec, self._store, investigation.method),
            investigation_id=investigation.investigation_id,
        )

    async def _failed(
        self,
        recorder: InvestigationRecorder,
        lease: Lease,
        error: str,
        usage: LLMUsage | None = None,
    ) -> None:
        await self._ended(recorder, lease, recorder.failed(error, usage))

    async def _ended(
        self, recorder: InvestigationRecorder, lease: Lease, end: Awaitable[None]
    ) -> None:
        """Awaits the write that ends the run. A lost lease leaves the record to its new holder;
        a store that fails the write leaves it to the lease, which lapses (the heartbeat ends
        with the run): the investigation is run again by whoever claims it, and the worker
        goes on."""
        try:
            await end
        except LeaseLostError:
            self._lease_lost(lease)
            recorder.cancelled()
        except Exception as exc:
            if isinstance(exc, StoreUnreachable):  # whose outage the store logs once
                recorder.log.warning("the run's end could not be stored; run again later")
            else:
                recorder.log.exception(
                    "the run's end could not be stored; run again once its lease lapses"
                )
            recorder.cancelled()
