"""Who gets a place in the investigation queue, and what a trigger that gets none becomes, so
that a hazard is never lost.

The queue (the store's QUEUED investigations, every replica's) holds POIROTD_QUEUE_CAPACITY at
most, and its last POIROTD_QUEUE_RESERVED_FOR_RULES places are kept for hazard rules: a Trigger
call is refused (RESOURCE_EXHAUSTED) once the rest is full, or once its caller has
POIROTD_MAX_QUEUED_TRIGGERS_PER_CLIENT investigations waiting, so one client cannot take the
queue from the others nor from the rules. A hazard rule's investigation is never refused: one
that finds the whole queue full, or older hazards still waiting, is DEFERRED (kept in the store)
and queued, oldest first, once a run starts and frees a place (`Store.queue_deferred`).

A trigger of a session that has an investigation by the same method deferred, queued or running
joins it instead of opening another (coalesced: its reason is kept on that investigation), and
so does a hazard within its rule's cooldown of one a hazard opened. So repeated triggers of one
incident cost one place, and deferred investigations are at most one per session.

The decision is made in the store's transaction, on what it reads there
(`Store.admit_investigation`): replicas of a shared store admit one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from poirotd.config import Settings
from poirotd.errors import ResourceExhausted
from poirotd.model import Investigation
from poirotd.store import Admission, Admit, QueueView


@dataclass(frozen=True)
class QueueShares:
    """The queue's places, and the shares of them Trigger calls may take."""

    capacity: int
    reserved_for_rules: int
    per_client: int

    @classmethod
    def from_settings(cls, s: Settings) -> QueueShares:
        return cls(s.queue_capacity, s.queue_reserved_for_rules, s.max_queued_triggers_per_client)

    @property
    def for_triggers(self) -> int:
        """The places Trigger calls may take, all clients together."""
        return self.capacity - self.reserved_for_rules

    def admit(self, candidate: Investigation) -> Admit:
        """How to admit `candidate`, as `Store.admit_investigation` asks."""
        return partial(self.decide, candidate)

    def decide(self, candidate: Investigation, view: QueueView) -> Admission:
        """Joins the session's open investigation; else a hazard rule's is queued, or deferred
        behind the full queue or older waiting hazards; a Trigger call's is queued within its
        shares, else refused."""
        if view.open is not None:
            return Admission.COALESCED
        if candidate.trigger is not None:
            if view.deferred or view.queued >= self.capacity:
                return Admission.DEFERRED
            return Admission.QUEUED
        if view.queued >= self.for_triggers:
            raise ResourceExhausted(
                f"investigation queue is full for Trigger: {view.queued} waiting, and the last "
                f"POIROTD_QUEUE_RESERVED_FOR_RULES={self.reserved_for_rules} of "
                f"POIROTD_QUEUE_CAPACITY={self.capacity} places are kept for hazard rules; "
                "retry once it drains",
                reason="queue_full",
            )
        if view.queued_by_requester >= self.per_client:
            raise ResourceExhausted(
                f"client {candidate.requested_by} has {view.queued_by_requester} investigations "
                f"queued; the limit is POIROTD_MAX_QUEUED_TRIGGERS_PER_CLIENT={self.per_client}",
                reason="too_many_queued",
            )
        return Admission.QUEUED
