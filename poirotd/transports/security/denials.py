"""Every refused call counted, logged and kept in the audit chain.

`record` may be called from any thread (the metrics server's refuse on theirs): the count and
the log line happen at once, the store write is scheduled on the daemon's event loop. At most
`_MAX_PENDING` writes wait; past that (a flood of bad tokens) a refusal is counted as unrecorded
instead, so neither memory nor the store grows with an attacker's rate.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog

from poirotd.model import AccessDenial, Door
from poirotd.observability.metrics import Metrics
from poirotd.store import Store
from poirotd.transports.security.access import Denied

log = structlog.get_logger(__name__)

_MAX_PENDING = 64


class DenialRecorder:
    def __init__(self, store: Store, metrics: Metrics, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._metrics = metrics
        self._loop = loop
        self._pending: set[asyncio.Task[None]] = set()

    def record(self, denied: Denied, *, door: Door, call: str, peer: str) -> None:
        self._metrics.auth_denials.labels(call, denied.reason.value).inc()
        denial = AccessDenial(
            at=datetime.now(UTC),
            door=door,
            call=call,
            reason=denied.reason.value,
            identity=denied.identity,
            role=denied.role,
            peer=peer,
        )
        log.warning("call refused", **denial.model_dump(exclude={"at"}))
        self._loop.call_soon_threadsafe(self._schedule, denial)

    async def flush(self) -> None:
        """Waits for the writes scheduled so far (before the store closes)."""
        await asyncio.sleep(0)  # lets call_soon_threadsafe callbacks from this loop run
        while self._pending:
            await asyncio.gather(*self._pending)

    def _schedule(self, denial: AccessDenial) -> None:
        if len(self._pending) >= _MAX_PENDING:
            self._metrics.auth_denials_unrecorded.inc()
            return
        task = self._loop.create_task(self._write(denial), name="audit-access-denial")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _write(self, denial: AccessDenial) -> None:
        try:
            await self._store.record_access_denial(denial)
        except Exception as exc:
            self._metrics.auth_denials_unrecorded.inc()
            log.error("cannot keep a refused call in the audit chain", error=repr(exc))
