"""Records as the store keeps them, for a "cortex" session s1 from T0: sessions, messages, samples,
investigations, events, hazard spaces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from poirotd.model import (
    AgentMessage,
    EventKind,
    HazardEvent,
    HazardRegion,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    MessageKind,
    Session,
    TelemetrySample,
)
from poirotd.store import Admission, Admitted, Store

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def session(sid: str = "s1", **kw: object) -> Session:
    fields: dict[str, object] = {"session_id": sid, "system": "cortex", "started_at": T0}
    return Session.model_validate({**fields, **kw})


def message(index: int, sid: str = "s1", content: str = "") -> AgentMessage:
    return AgentMessage(
        session_id=sid,
        index=index,
        kind=MessageKind.AGENT,
        sender="planner",
        recipient="controller",
        content=content or f"message {index}",
        sent_at=T0 + timedelta(seconds=index),
    )


def sample(seconds: float, value: float, sid: str = "s1") -> TelemetrySample:
    return TelemetrySample(
        session_id=sid,
        component="knee_motor",
        signal="torque",
        value=value,
        measured_at=T0 + timedelta(seconds=seconds),
    )


def investigation(
    iid: str,
    *,
    sid: str = "s1",
    state: InvestigationState = InvestigationState.QUEUED,
    created_at: datetime = T0,
) -> Investigation:
    return Investigation(
        investigation_id=iid,
        system="cortex",
        session_id=sid,
        state=state,
        reason="torque spike",
        created_at=created_at,
    )


def triggered(iid: str, seconds: float = 0, rule: str = "spike", sid: str = "s1") -> Investigation:
    """A hazard rule's investigation, its event `seconds` after T0."""
    trigger = HazardEvent(
        rule=rule,
        severity="warning",
        session_id=sid,
        at=T0 + timedelta(seconds=seconds),
        summary="torque spike",
    )
    return investigation(iid, sid=sid).model_copy(
        update={"trigger": trigger, "reason": f"rule {rule}: torque spike"}
    )


async def queue(store: Store, inv: Investigation) -> Admitted:
    """Stores `inv` QUEUED, whatever the queue holds (an admission that always queues)."""
    return await store.admit_investigation(inv, lambda _: Admission.QUEUED)


def event(iid: str, kind: EventKind = EventKind.STARTED) -> InvestigationEvent:
    return InvestigationEvent(event_id=999, investigation_id=iid, at=T0, kind=kind)


def space(version: str = "v1") -> HazardSpace:
    return HazardSpace(
        system="cortex",
        version=version,
        regions=(
            HazardRegion(id="planner", name="Planner", type="agent", description="plans"),
            HazardRegion(id="knee_motor", name="Knee motor", type="hardware", description="moves"),
        ),
        source="llm",
    )
