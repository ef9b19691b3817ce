"""Turns hazard events into investigations, once the ingest pipeline has committed their evidence.

Rules fire HazardEvents (each rule has its own per-session cooldown in the rule engine); on top of
that, a session gets at most one investigation per cooldown whichever rule fires, so one incident
seen by several rules is investigated once. Every event is counted, opened or not.

With replicas, each evaluates the rules over the data it ingests, and the store decides: a
session's investigation opened by any replica's hazard event holds off every other replica's
within the cooldown (`Store.queue_investigation`), so an incident whose data reached several
replicas is investigated once. What a replica's rules cannot see is the other replicas' data: a
rule over a window, or a composite over signals, fires only on what reached one replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import structlog

from poirotd.config import SystemSpec
from poirotd.errors import ServiceError
from poirotd.investigations.runner import InvestigationRunner
from poirotd.model import HazardEvent
from poirotd.observability.metrics import Metrics

log = structlog.get_logger(__name__)


class HazardTriggers:
    """The ingest pipeline's InvestigationOpener."""

    def __init__(self, spec: SystemSpec, runner: InvestigationRunner, metrics: Metrics) -> None:
        self._spec = spec
        self._cooldowns = {
            rule.name: timedelta(seconds=rule.cooldown_seconds) for rule in spec.rules
        }
        self._runner = runner
        self._metrics = metrics
        # Sample time of the latest investigation opened per session; dropped at session end.
        self._opened: dict[str, datetime] = {}

    async def open(self, events: Sequence[HazardEvent], ended: Sequence[str]) -> None:
        for event in events:
            await self._open(event)
        for session_id in ended:
            self._opened.pop(session_id, None)

    async def _open(self, event: HazardEvent) -> None:
        self._metrics.hazard_events.labels(self._spec.system.name, event.rule, event.severity).inc()
        last = self._opened.get(event.session_id)
        if last is not None and abs(event.at - last) < self._cooldowns[event.rule]:
            log.info(
                "hazard event within cooldown; no new investigation",
                rule=event.rule,
                session_id=event.session_id,
            )
            return
        try:
            opened = await self._runner.open_for(event, self._cooldowns[event.rule])
        except ServiceError as exc:
            log.warning(
                "hazard event could not open an investigation",
                rule=event.rule,
                session_id=event.session_id,
                error=str(exc),
            )
            return
        if opened is not None:
            self._opened[event.session_id] = event.at
