"""Every refused call counted, logged and kept in the audit chain, in rows that do not grow with
an attacker's rate.

Refusals alike (the same transport, call, reason, identity, role and peer host) are summarised
over a window: the first is written at once, opening the window; those after it are counted and
written as one summary row (`count`, `at` the first of them, `until` the last) when the window
closes, or at stop (`flush`), so nothing counted is lost. A flood of bad tokens from one host
then costs two rows a window, each chained like any other. At most `max_summaries` windows are
open at once: refusals that would open another are summarised with every such peer's, as
"other peers", per transport, call and reason (counted in `poirot_auth_denials_folded_total`).
`poirot_auth_denials_total` counts each refusal as it happens, and a refusal written at once is
logged; a summary is logged when written.

`record` may be called from any thread: the count happens at once, the rest on the daemon's
event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog

from poirotd.model import AccessDenial, TransportName
from poirotd.observability.metrics import Metrics
from poirotd.store import Store
from poirotd.transports.peers import peer_host
from poirotd.transports.security.access import AccessDeniedError

log = structlog.get_logger(__name__)

OTHER_PEERS = "(other peers)"


@dataclass(frozen=True)
class _Alike:
    """What refusals summarised together share."""

    transport: TransportName
    call: str
    reason: str
    identity: str
    role: str
    peer: str  # a host

    def other_peers(self) -> _Alike:
        return _Alike(self.transport, self.call, self.reason, "", "", OTHER_PEERS)


@dataclass
class _Window:
    closes: asyncio.TimerHandle
    count: int = 0  # refusals after the first, to be written as a summary
    first: datetime | None = None
    last: datetime | None = None


class DenialRecorder:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
        *,
        window_seconds: float,
        max_summaries: int,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._loop = loop
        self._window_seconds = window_seconds
        self._max_summaries = max_summaries
        self._windows: dict[_Alike, _Window] = {}
        self._pending: set[asyncio.Task[None]] = set()

    def record(
        self, denied: AccessDeniedError, *, transport: TransportName, call: str, peer: str
    ) -> None:
        self._metrics.auth_denials.labels(call, denied.reason.value).inc()
        denial = AccessDenial(
            at=datetime.now(UTC),
            transport=transport,
            call=call,
            reason=denied.reason.value,
            identity=denied.identity,
            role=denied.role,
            peer=peer,
        )
        self._loop.call_soon_threadsafe(self._admit, denial)

    async def flush(self) -> None:
        """Closes every window and waits for the writes (before the store closes)."""
        await asyncio.sleep(0)  # lets call_soon_threadsafe callbacks from this loop run
        for alike, window in list(self._windows.items()):
            window.closes.cancel()
            self._close(alike)
        while self._pending:
            await asyncio.gather(*self._pending)

    def _admit(self, denial: AccessDenial) -> None:
        alike = _Alike(
            denial.transport,
            denial.call,
            denial.reason,
            denial.identity,
            denial.role,
            peer_host(denial.peer),
        )
        if alike not in self._windows and len(self._windows) >= self._max_summaries:
            self._metrics.auth_denials_folded.inc()
            alike = alike.other_peers()
        window = self._windows.get(alike)
        if window is None:
            closes = self._loop.call_later(self._window_seconds, self._close, alike)
            self._windows[alike] = _Window(closes)
            log.warning("call refused", **denial.model_dump(exclude={"at"}))
            self._write(denial, 1)
            return
        window.count += 1
        window.first = window.first or denial.at
        window.last = denial.at

    def _close(self, alike: _Alike) -> None:
        window = self._windows.pop(alike)
        if not window.count:
            return
        assert window.first is not None and window.last is not None, "set with the count"
        summary = AccessDenial(
            at=window.first,
            until=window.last,
            count=window.count,
            transport=alike.transport,
            call=alike.call,
            reason=alike.reason,
            identity=alike.identity,
            role=alike.role,
            peer=alike.peer,
        )
        log.warning("calls refused", **summary.model_dump(mode="json"))
        self._write(summary, window.count)

    def _write(self, denial: AccessDenial, refusals: int) -> None:
        task = self._loop.create_task(self._chain(denial, refusals), name="audit-access-denial")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _chain(self, denial: AccessDenial, refusals: int) -> None:
        try:
            await self._store.record_access_denial(denial)
        except Exception as exc:
            self._metrics.auth_denials_unrecorded.inc(refusals)
            log.error("cannot keep a refused call in the audit chain", error=repr(exc))
