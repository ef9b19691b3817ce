"""Builders for the hazard rules: samples, messages, rules as from YAML, feeding in batches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from poirotd.hazards import RuleEngine, parse_rules
from poirotd.model import AgentMessage, HazardEvent, MessageKind, Reading, TelemetrySample

T0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
EXO = "d2w_exoskeleton"
ANKLE = "ankle_angle_deg"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(
    value: float,
    t: float,
    *,
    session: str = "s1",
    component: str = EXO,
    signal: str = ANKLE,
) -> TelemetrySample:
    return TelemetrySample(
        session_id=session, component=component, signal=signal, value=value, measured_at=at(t)
    )


def series(
    values: Sequence[float] | np.ndarray,
    *,
    dt: float = 0.01,
    start: float = 0.0,
    session: str = "s1",
    component: str = EXO,
    signal: str = ANKLE,
) -> list[TelemetrySample]:
    return [
        sample(float(v), start + i * dt, session=session, component=component, signal=signal)
        for i, v in enumerate(values)
    ]


def readings(*samples: TelemetrySample) -> list[Reading]:
    """The samples as the store reads them back."""
    return [Reading(s.component, s.signal, s.value, s.measured_at) for s in samples]


def message(
    content: str,
    t: float = 0.0,
    *,
    sender: str = "physio_general",
    kind: MessageKind = MessageKind.AGENT,
    index: int = 0,
    session: str = "s1",
) -> AgentMessage:
    return AgentMessage(
        session_id=session, index=index, kind=kind, sender=sender, content=content, sent_at=at(t)
    )


def engine(*rules: dict[str, Any], evidence_limit: int = 32) -> RuleEngine:
    return RuleEngine(parse_rules(rules), evidence_limit=evidence_limit)


def rule(kind: str, name: str = "r", **fields: Any) -> dict[str, Any]:
    """A rule dict as it would come from YAML; per-signal kinds default to the ankle angle."""
    base: dict[str, Any] = {"kind": kind, "name": name, "severity": "warning"}
    if kind in {"threshold", "range", "rate", "zscore", "rolling_mean", "stale"}:
        base |= {"component": EXO, "signal": ANKLE}
    return base | fields


def feed(eng: RuleEngine, samples: Sequence[TelemetrySample], batch: int) -> list[HazardEvent]:
    events: list[HazardEvent] = []
    for i in range(0, len(samples), batch):
        events += eng.observe_telemetry(samples[i : i + batch])
    return events
