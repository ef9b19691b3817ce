"""Wakes Watch streams when an investigation event is stored; the store stays the truth.

Alone on its store, the daemon's own writes are every event there is. With replicas, `follow`
also reads the events the others stored, when the store tells of another process's write
(PostgreSQL's LISTEN/NOTIFY) and at least every poll interval, so a Watch on any replica sees
every replica's events at once, or within the interval should a notice be lost.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from poirotd.store import Store
from poirotd.store.faults import StoreUnreachable

log = structlog.get_logger(__name__)

_FOLLOW_BATCH = 500


class EventBus:
    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._latest = 0

    async def published(self, event_id: int) -> None:
        """Called after an event is committed, so a woken reader always finds it in the store."""
        async with self._condition:
            self._latest = max(self._latest, event_id)
            self._condition.notify_all()

    async def wait_beyond(self, event_id: int) -> None:
        """Returns once an event newer than event_id exists."""
        async with self._condition:
            await self._condition.wait_for(lambda: self._latest > event_id)

    async def follow(self, store: Store, interval: float) -> None:
        """Announces the newest event in the store (whichever replica stored it) whenever the
        store says another process wrote, and at least every `interval` seconds; runs until
        cancelled. It starts from the store's newest event: what is older was announced (or
        is read by a Watch from the store) already, and a store of long standing would otherwise
        be read through from its first event."""
        try:
            await self.published(await store.latest_event_id())
        except StoreUnreachable:  # logged by the store: read from the first event, as it comes
            pass
        except Exception:
            log.exception("reading the store's newest event failed")
        while True:
            mark = store.change_mark()
            try:
                while events := await store.events_after(self._latest, limit=_FOLLOW_BATCH):
                    await self.published(events[-1].event_id)
                    if len(events) < _FOLLOW_BATCH:
                        break
            except StoreUnreachable:  # its outage is logged once: the next round tries again
                pass
            except Exception:
                log.exception("following the store's events failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await store.wait_for_change(mark)
