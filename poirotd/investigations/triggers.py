"""Turns hazard events into investigations, once the ingest pipeline has committed their evidence.

Rules fire HazardEvents (each rule has its own per-session cooldown in the rule engine); on top of
that, a session gets at most one investigation per cooldown whichever rule fires, so one incident
seen by several rules is investigated once. Every event is counted and none is lost: one that
opens no investigation of its own is coalesced into the one it belongs to (its reason is kept
there), and one that finds the queue full is deferred (`poirotd.investigations.admission`).

With replicas, each evaluates the rules over the data it ingests, and the store decides: a
session's investigation opened by any replica's hazard event holds off every other replica's
within the cooldown (`Store.admit_investigation`), so an incident whose data reached several
replicas is investigated once. What a replica's rules cannot see is the other replicas' data: a
rule over a window, or a composite over signals, fires only on what reached one replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import structlog

from poirotd.config import SystemSpec
from poirotd.investigations.runner import InvestigationRunner
from poirotd.model import HazardEvent
from poirotd.observability.metrics import Metrics
from poirotd.store.faults import StoreUnreachable

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
        self._unopened: list[HazardEvent] = []

    async def open(self, events: Sequence[HazardEvent]) -> None:
        """Each event in turn, after those the store could not be reached for before: one it
        cannot be reached for now is kept for the next call (the rules' tick makes one every
        second), so a store outage loses no hazard; one it fails otherwise is logged, and the
        next one tried: the data it fired on is committed, a Trigger call can open it again."""
        for event in events:
            self._metrics.hazard_events.labels(
                self._spec.system.name, event.rule, event.severity
            ).inc()
        pending, self._unopened = [*self._unopened, *events], []
        for event in pending:
            try:
                await self._runner.open_for(event, self._cooldowns[event.rule])
            except StoreUnreachable:  # its outage is logged once, by the store
                self._unopened.append(event)
            except Exception:
                log.exception(
                    "hazard event could not open an investigation: the store failed",
                    rule=event.rule,
                    session_id=event.session_id,
                )
