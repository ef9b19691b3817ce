"""This daemon's place among the replicas of one store: its identity (the owner its leases name)
and how it coordinates with the others, which is only through the store."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from poirotd.config import Settings


@dataclass(frozen=True)
class Replica:
    # The owner named in this daemon's leases.
    replica_id: str
    # Other daemons write the same store: at start-up this one leaves unfinished investigations
    # to their leases (a live replica's keep running; a dead one's are taken over once expired)
    # instead of interrupting them, and idle workers and Watch streams follow the store.
    shared: bool = False
    lease_seconds: float = 30.0
    # How often at least an idle worker or a Watch stream looks at the store (also at once on
    # a change the store notifies).
    poll_seconds: float = 0.5

    @classmethod
    def from_settings(cls, settings: Settings, *, shared: bool) -> Replica:
        return cls(
            settings.replica_id or default_replica_id(),
            shared=shared,
            lease_seconds=settings.lease_seconds,
            poll_seconds=settings.shared_poll_seconds,
        )


def default_replica_id() -> str:
    """hostname-pid: unique among live processes (in Kubernetes the hostname is the pod's name)."""
    return f"{socket.gethostname()}-{os.getpid()}"
