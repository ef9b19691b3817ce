"""Canaries: the daemon replays labelled cases (a fault campaign's variants of its own sessions)
into shadow sessions, investigates them as it would a real incident and scores the attribution
against the label, so that a model, prompt or spec change that stopped attributing well shows on
a dashboard before a real incident does.

A canary stays out of everything real:
- it is never queued: it runs beside the investigation queue, starts only while nothing waits
  in it (no queued or deferred investigation), and so takes none of the places kept for hazard
  rules (POIROTD_QUEUE_RESERVED_FOR_RULES) nor delays one;
- its shadow session is never ingested (no hazard rule sees it) and its investigation streams
  no Watch event and publishes no attribution metric: only poirot_canary_*;
- its record is stored once finished, marked `canary`, so the audit chain keeps it (with its
  LLM exchanges) as a canary's; ConfirmOutcome refuses it, so it never moves a β;
- it reads the agents' β and ErrorProbe's memory as a real run would, and writes neither.

The agents are told what a manual Trigger would tell them, with the case's telemetry as the
hardware evidence a real run reads from the store: nothing says it is a test.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import structlog

from poirotd.campaigns.labelled import (
    LabelledCase,
    LabelledCaseError,
    case_files,
    read_labelled_case,
)
from poirotd.campaigns.schedule import seconds_until_due, utc_midnight
from poirotd.config.spec import CanarySpec, SystemSpec
from poirotd.investigations.recorder import now, succeeded_record
from poirotd.investigations.runner import EVIDENCE_SAMPLES, describe_incident
from poirotd.investigations.weights import betas_now, reliabilities_now
from poirotd.llm.base import LLMBackend
from poirotd.model import (
    CanaryLabel,
    DiagnosisMemoryEntry,
    Investigation,
    InvestigationMethod,
    InvestigationState,
    LLMExchange,
    LLMUsage,
    Reading,
)
from poirotd.observability.metrics import Metrics
from poirotd.protocol import prompts
from poirotd.protocol.engine import InvestigationEngine
from poirotd.protocol.errors import ModelUnavailableError, ProtocolError
from poirotd.protocol.events import ExchangeDone, ProtocolEvent
from poirotd.store import Store
from poirotd.store.port import MemoryUpdate

log = structlog.get_logger(__name__)

# What the agents are told: a manual Trigger's reason when its caller gave none.
_REASON = "manual trigger"
SHADOW_SESSION_PREFIX = "canary-"


class CanaryCaseError(ValueError):
    """A labelled case the canaries cannot use with this spec; the message says why."""


def fitting_case(spec: SystemSpec, case: LabelledCase) -> LabelledCase:
    """`case` when this daemon can replay it: of its system, labelled with regions its spec
    declares (the investigation is run with the daemon's own spec, as a real one is)."""
    if case.spec.system.name != spec.system.name:
        raise CanaryCaseError(
            f"case {case.case_id!r} is of system {case.spec.system.name!r}, this daemon "
            f"monitors {spec.system.name!r}"
        )
    foreign = [r for r in case.truth.regions if not spec.is_region_id(r)]
    if foreign or not case.truth.regions:
        raise CanaryCaseError(
            f"case {case.case_id!r} is labelled with {list(case.truth.regions)}: every label "
            "must be a region of the spec (an agent, a component or COMPONENT.SLUG)"
        )
    return case


def load_cases(spec: SystemSpec, metrics: Metrics) -> list[LabelledCase]:
    """The spec's canary cases that load and fit it; each other file is logged and counted
    (poirot_canary_case_errors_total), and the daemon runs the rest."""
    assert spec.canary is not None
    cases = []
    for path in case_files(spec.canary.cases):
        try:
            cases.append(fitting_case(spec, read_labelled_case(path)))
        except (LabelledCaseError, CanaryCaseError) as exc:
            metrics.canary_case_errors.labels(spec.system.name).inc()
            log.error("canary case refused", path=str(path), error=str(exc))
    metrics.canary_cases.labels(spec.system.name).set(len(cases))
    if not cases:
        log.error("no canary case to replay: canaries stay idle", cases=str(spec.canary.cases))
    return cases


@dataclass(frozen=True)
class CanaryResult:
    investigation: Investigation
    case: LabelledCase
    # Named exactly the labelled region(s); False for a wrong or failed one.
    correct: bool
    seconds: float


class ReadOnlyMemory:
    """ErrorProbe's memory as a canary sees it: recalled from like a real run's, never written
    (a canary's diagnosis is not a real incident's)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def memory_entries(
        self, system: str, *, include_deleted: bool = False
    ) -> list[DiagnosisMemoryEntry]:
        return await self._store.memory_entries(system, include_deleted=include_deleted)

    async def update_memory_entry(
        self, system: str, entry_id: str, update: MemoryUpdate
    ) -> DiagnosisMemoryEntry | None:
        return None


class Canaries:
    """Runs the spec's canaries, one at a time, while the daemon runs (`run_forever`)."""

    def __init__(
        self,
        spec: SystemSpec,
        store: Store,
        backend: LLMBackend,
        metrics: Metrics,
        cases: Sequence[LabelledCase],
    ) -> None:
        assert spec.canary is not None, "canaries need the spec's canary section"
        self._spec = spec
        self._canary: CanarySpec = spec.canary
        self._store = store
        self._backend = backend
        self._metrics = metrics
        self._system = spec.system.name
        # Every case by every method, in turn.
        self._plan = [(case, method) for case in cases for method in self._canary.methods]
        self._next = 0
        # The first canary is due one interval after the daemon starts, not at once: a daemon
        # restarted in a loop must not spend its budget on canaries.
        self._last_started = now()
        self._outcomes: dict[str, deque[bool]] = {}
        metrics.canary_accuracy_floor.labels(self._system).set(self._canary.accuracy_floor)
        for reason in ("queue_busy", "token_budget"):  # at 0, so an increase sees the first
            metrics.canary_skipped.labels(self._system, reason)
        metrics.canary_tokens.labels(self._system)

    async def run_forever(self) -> None:
        """One canary each time one is due (the first one interval after the start), until
        cancelled (the daemon's stop)."""
        if not self._plan:
            return
        try:
            await self.restore()
        except Exception:  # the accuracy then starts afresh: not worth the canaries
            log.exception("the canaries' accuracy could not be read back from the store")
        while True:
            await asyncio.sleep(seconds_until_due(self._canary, self._last_started, now()))
            try:
                if await self.seconds_until_next(now()) > 0:
                    continue  # another replica ran one meanwhile: its interval counts
                await self.run_next()
            except Exception:  # a canary is not worth the daemon: the next one tries again
                log.exception("canary crashed")
                self._last_started = now()

    async def seconds_until_next(self, at: datetime) -> float:
        """How long from `at` until a canary may start: one interval after the newest canary
        of this daemon or of any replica sharing its store (a finished one: one still running
        elsewhere is not seen), within the quiet hours when set."""
        newest, _ = await self._store.list_investigations(limit=1, canaries=True)
        if newest and newest[0].created_at > self._last_started:
            self._last_started = newest[0].created_at
        return seconds_until_due(self._canary, self._last_started, at)

    async def restore(self) -> None:
        """Each method's accuracy window from its newest stored canaries, and the plan's place
        after the newest one, so a restart resets neither (a method's gauge is published once it
        has one)."""
        newest, _ = await self._store.list_investigations(limit=1, canaries=True)
        if newest and (label := newest[0].canary) is not None:
            planned = [(c.case_id, m) for c, m in self._plan]
            last = (label.case_id, newest[0].method)
            if last in planned:
                self._next = (planned.index(last) + 1) % len(planned)
        window = self._canary.window
        for method in self._canary.methods:
            stored, _ = await self._store.list_investigations(
                method=method, limit=window, canaries=True
            )
            labels = [i.canary for i in reversed(stored) if i.canary is not None]
            if labels:
                outcomes = self._outcomes[method] = deque(maxlen=window)
                outcomes.extend(label.correct for label in labels)
                self._publish_accuracy(method)

    async def run_next(self) -> CanaryResult | None:
        """The next planned canary, now, unless the queue has waiting work or the day's token
        budget is spent (None, counted as skipped; the interval starts again either way)."""
        at = self._last_started = now()
        if not await self._queue_is_idle():
            self._metrics.canary_skipped.labels(self._system, "queue_busy").inc()
            log.info("canary skipped: investigations wait in the queue")
            return None
        budget = self._canary.token_budget - await self._spent_today(at)
        if budget <= 0:
            self._metrics.canary_skipped.labels(self._system, "token_budget").inc()
            log.info("canary skipped: the day's canary token budget is spent")
            return None
        case, method = self._plan[self._next]
        self._next = (self._next + 1) % len(self._plan)
        result = await self._investigate(case, method, token_budget=budget)
        self._scored(result)
        return result

    async def _spent_today(self, at: datetime) -> int:
        """The tokens of the canaries created since `at`'s UTC midnight, read from the store
        (newest first until an older one): neither a restart nor another replica of a shared
        store gets a fresh budget."""
        midnight = utc_midnight(at)
        spent, page_token = 0, None
        while True:
            page, page_token = await self._store.list_investigations(
                canaries=True, limit=100, page_token=page_token
            )
            today = [i for i in page if i.created_at >= midnight]
            spent += sum(i.usage.prompt_tokens + i.usage.completion_tokens for i in today)
            if page_token is None or len(today) < len(page):
                return spent

    async def _queue_is_idle(self) -> bool:
        """No investigation queued or deferred, by any replica of the store."""
        queued = await self._store.count_investigations(InvestigationState.QUEUED)
        return queued == 0 and await self._store.oldest_waiting_hazard() is None

    async def _investigate(
        self, case: LabelledCase, method: InvestigationMethod, *, token_budget: int
    ) -> CanaryResult:
        investigation_id = uuid.uuid4().hex
        session_id = f"{SHADOW_SESSION_PREFIX}{investigation_id[:12]}"
        messages = [m.model_copy(update={"session_id": session_id}) for m in case.messages]
        # The hardware evidence a real run reads from the store: the case's newest samples.
        readings = [
            Reading(s.component, s.signal, s.value, s.measured_at)
            for s in sorted(case.telemetry, key=lambda s: s.measured_at)[-EVIDENCE_SAMPLES:]
        ]
        incident = await describe_incident(_REASON, None, readings)
        betas = await betas_now(self._spec, self._store)
        exchanges: list[LLMExchange] = []

        async def on_event(event: ProtocolEvent) -> None:
            if isinstance(event, ExchangeDone):
                exchanges.append(event.exchange)

        label = CanaryLabel(case_id=case.case_id, dataset=case.dataset, truth=case.truth.regions)
        record = Investigation(
            investigation_id=investigation_id,
            system=self._system,
            session_id=session_id,
            state=InvestigationState.RUNNING,
            reason=(
                f"canary: labelled case {case.case_id} ({case.dataset}), truth "
                f"{', '.join(case.truth.regions)}"
            ),
            method=method,
            incident=prompts.incident_section(incident),
            created_at=now(),
            betas=betas,
            canary=label,
        )
        engine = InvestigationEngine(
            self._spec,
            self._backend,
            self._store,
            token_budget=token_budget,
            memory=ReadOnlyMemory(self._store),
        )
        log.info("canary started", investigation_id=investigation_id, case=case.case_id)
        started = time.monotonic()
        try:
            outcome = await engine.run(
                messages,
                on_event,
                incident=incident,
                betas=betas,
                method=method,
                readings=readings,
                reliabilities=await reliabilities_now(self._spec, self._store, method),
                investigation_id=investigation_id,
            )
        except (ProtocolError, ModelUnavailableError) as exc:
            record = _failed(record, str(exc), exc.usage)
        except Exception as exc:
            log.exception("canary investigation crashed", investigation_id=investigation_id)
            record = _failed(record, f"internal error: {type(exc).__name__}: {exc}", None)
        else:
            record = succeeded_record(record, outcome)
        seconds = time.monotonic() - started
        correct = _names_the_label(record, case)
        label = label.model_copy(update={"correct": correct})
        record = record.model_copy(update={"canary": label})
        await self._store.save_investigation(record)
        for exchange in exchanges:
            await self._store.record_exchange(investigation_id, exchange)
        log.info(
            "canary finished",
            investigation_id=investigation_id,
            case=case.case_id,
            method=method,
            state=record.state.value,
            correct=correct,
        )
        return CanaryResult(record, case, correct, seconds)

    def _scored(self, result: CanaryResult) -> None:
        method = result.investigation.method
        usage = result.investigation.usage
        m, system = self._metrics, self._system
        m.canary_tokens.labels(system).inc(usage.prompt_tokens + usage.completion_tokens)
        if result.investigation.state is InvestigationState.SUCCEEDED:
            m.canary_attribution_duration.labels(system, method).observe(result.seconds)
            outcome = "correct" if result.correct else "wrong"
        else:
            outcome = "failed"
        m.canary_runs.labels(system, method, outcome).inc()
        self._outcomes.setdefault(method, deque(maxlen=self._canary.window)).append(result.correct)
        self._publish_accuracy(method)

    def _publish_accuracy(self, method: str) -> None:
        outcomes = self._outcomes[method]
        accuracy = sum(outcomes) / len(outcomes)
        self._metrics.canary_accuracy.labels(self._system, method).set(accuracy)


def _failed(record: Investigation, error: str, usage: LLMUsage | None) -> Investigation:
    changes: dict[str, object] = {
        "state": InvestigationState.FAILED,
        "error": error,
        "finished_at": now(),
    }
    if usage is not None:
        changes["usage"] = usage
    return record.model_copy(update=changes)


def _names_the_label(record: Investigation, case: LabelledCase) -> bool:
    """The attribution's decision names exactly the labelled region(s)."""
    if record.attribution is None or record.hazard_space is None:
        return False
    regions = [region.id for region in record.hazard_space.regions]
    named = {r for r, bit in zip(regions, record.attribution.decision, strict=False) if bit}
    return named == set(case.truth.regions)
