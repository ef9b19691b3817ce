"""Turns ingested telemetry and messages into investigations.

Rules fire HazardEvents (each rule has its own per-session cooldown in the rule engine); on top of
that, a session gets at most one investigation per cooldown whichever rule fires, so one incident
seen by several rules is investigated once. Every event is counted, opened or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import ServiceError
from poirotd.hazards import RuleEngine
from poirotd.investigations.runner import InvestigationRunner
from poirotd.model import (
    AgentMessage,
    CommitItem,
    HazardEvent,
    SessionEnd,
    TelemetryBatch,
    TelemetrySample,
)
from poirotd.observability.metrics import Metrics

log = structlog.get_logger(__name__)


class HazardMonitor:
    def __init__(self, spec: SystemSpec, runner: InvestigationRunner, metrics: Metrics) -> None:
        self._spec = spec
        self._rules = RuleEngine(spec.rules)
        self._cooldowns = {
            rule.name: timedelta(seconds=rule.cooldown_seconds) for rule in spec.rules
        }
        self._runner = runner
        self._metrics = metrics
        # Sample time of the latest investigation opened per session; dropped at session end.
        self._opened: dict[str, datetime] = {}

    @property
    def active(self) -> bool:
        return bool(self._spec.rules)

    def evaluate(self, items: Sequence[CommitItem]) -> list[HazardEvent]:
        """Runs the rules over a batch (in order) as it arrives, before its commit: an event's
        latency is then decoding and rule evaluation, not an fsync. Nothing is opened here."""
        telemetry = [i for i in items if isinstance(i, TelemetrySample)]
        events = self._rules.observe_telemetry(telemetry) if telemetry else []
        for batch in items:
            if isinstance(batch, TelemetryBatch):
                events += self._rules.observe_batch(batch)
        if messages := [i for i in items if isinstance(i, AgentMessage)]:
            events += self._rules.observe_messages(messages)
        for item in items:
            if isinstance(item, SessionEnd):
                self._rules.end_session(item.session_id)
        return sorted(events, key=lambda event: event.at)

    async def open(self, events: Sequence[HazardEvent], items: Sequence[CommitItem]) -> None:
        """Opens what a batch's events call for, once the batch is committed: every
        investigation has its evidence in the store."""
        await self._open(events)
        for item in items:
            if isinstance(item, SessionEnd):
                self._opened.pop(item.session_id, None)

    async def tick_forever(self, interval: float = 1.0) -> None:
        """Evaluates time-based rules (no data within a timeout) once per interval."""
        while True:
            await asyncio.sleep(interval)
            await self._open(self._rules.tick(datetime.now(UTC)))

    async def _open(self, events: Sequence[HazardEvent]) -> None:
        for event in events:
            self._metrics.hazard_events.labels(
                self._spec.system.name, event.rule, event.severity
            ).inc()
            last = self._opened.get(event.session_id)
            if last is not None and abs(event.at - last) < self._cooldowns[event.rule]:
                log.info(
                    "hazard event within cooldown; no new investigation",
                    rule=event.rule,
                    session_id=event.session_id,
                )
                continue
            try:
                await self._runner.submit(
                    event.session_id, f"rule {event.rule}: {event.summary}", trigger=event
                )
            except ServiceError as exc:
                log.warning(
                    "hazard event could not open an investigation",
                    rule=event.rule,
                    session_id=event.session_id,
                    error=str(exc),
                )
                continue
            self._opened[event.session_id] = event.at
