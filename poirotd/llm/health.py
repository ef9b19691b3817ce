"""Which of an OpenAI-compatible backend's servers answer, so that a dead one is not hammered.

Each base URL has a circuit breaker: after `breaker_failures` failures in a row that say the
server cannot serve at all (connection refused or reset, connect timeout, 502/503/504), its
circuit opens. Calls then skip it, and one probe (``GET /v1/models``) every `probe_seconds`
asks whether it is back; the first answer, a probe's or a call's, closes it. A server that says
how long to wait (``Retry-After`` on 429 or 503) is held back for that long, circuit open or not.
The servers together are the model: it is up while one of them is (`ServerPool` is the
`PartState` that investigations wait on).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial

import structlog

from poirotd.observability.outages import Availability

log = structlog.get_logger(__name__)


class Server:
    """One base URL: its circuit (`availability`: up while closed) and its Retry-After."""

    def __init__(self, root: str, display: str, breaker_failures: int) -> None:
        self.root = root
        self.display = display
        self.availability = Availability("llm", base_url=display)
        self._breaker_failures = breaker_failures
        self._failures = 0
        # time.monotonic() before which the server asked not to be called (Retry-After).
        self.resume_at = 0.0

    @property
    def closed(self) -> bool:
        """The circuit lets calls through: the server was not seen dead."""
        return self.availability.up

    def wait_seconds(self) -> float:
        """How long its Retry-After still holds it back (0: callable now, circuit allowing)."""
        return max(self.resume_at - time.monotonic(), 0.0)

    def succeeded(self) -> None:
        self._failures = 0
        self.availability.answered()

    def unreachable(self, kind: str, detail: str) -> None:
        """A failure that says the server cannot serve; the last one allowed opens the circuit."""
        self._failures += 1
        if self._failures >= self._breaker_failures:
            self.availability.failed(kind, detail)

    def hold_back(self, seconds: float) -> None:
        self.resume_at = max(self.resume_at, time.monotonic() + seconds)


Probe = Callable[[Server], Awaitable[bool]]


class ServerPool:
    """The servers in the order calls try them, and the model's availability: up while one
    circuit is closed. Probes run as tasks of their own while a circuit is open."""

    def __init__(self, servers: list[Server], probe: Probe, *, probe_seconds: float) -> None:
        self.servers = servers
        self._probe = probe
        self._probe_seconds = probe_seconds
        self._probes: dict[int, asyncio.Task[None]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._was_up = True
        self.down_since: datetime | None = None
        self._changed = asyncio.Event()
        for index, server in enumerate(servers):
            server.availability.subscribe(partial(self._server_changed, index))

    @property
    def up(self) -> bool:
        return any(server.closed for server in self.servers)

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` is called when the last server goes down, and when one comes back."""
        self._listeners.append(listener)

    async def wait_up(self) -> None:
        while not self.up:
            await self.wait_for_change()

    async def wait_for_change(self) -> None:
        """Returns once a circuit opened or closed."""
        changed = self._changed
        await changed.wait()

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _server_changed(self, index: int) -> None:
        server = self.servers[index]
        if not server.closed and index not in self._probes:
            self._probes[index] = asyncio.create_task(
                self._probe_until_back(server), name=f"llm-probe-{server.display}"
            )
        up = self.up
        if up != self._was_up:
            self._was_up = up
            self.down_since = None if up else server.availability.down_since
            for listener in self._listeners:
                listener()
        self._changed_now()

    async def _probe_until_back(self, server: Server) -> None:
        index = self.servers.index(server)
        try:
            while not server.closed:
                await asyncio.sleep(max(self._probe_seconds, server.wait_seconds()))
                # A call may have found it back meanwhile.
                if not server.closed and await self._probe(server):
                    server.succeeded()
        finally:
            self._probes.pop(index, None)

    async def aclose(self) -> None:
        probes = list(self._probes.values())
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
