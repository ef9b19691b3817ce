"""The one lifecycle every transport has, which the daemon walks in order."""

from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    """A transport of the daemon. Started in order once the core is up (telemetry inputs last);
    on SIGTERM all are drained before investigations are, then stopped in reverse order."""

    async def start(self) -> None:
        """Binds and starts serving; raises TransportBindError if it cannot listen (a port
        taken)."""

    async def drain(self) -> None:
        """Stops taking new work; what was received is still committed and acknowledged."""

    async def stop(self, grace: float) -> None:
        """Ends open calls after at most `grace` seconds and releases the transport."""
