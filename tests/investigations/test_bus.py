"""The event bus that wakes Watch streams: a follower of a shared store starts at its newest
event instead of reading the store through from the first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from poirotd.investigations.bus import EventBus
from poirotd.store import SqliteStore
from tests.support.store import event, investigation
from tests.support.waiting import eventually


class _Reads:
    """The store, with the `after` of every `events_after` the follower asked."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self.asked: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def events_after(self, after_event_id: int, **options: Any) -> Any:
        self.asked.append(after_event_id)
        return await self._store.events_after(after_event_id, **options)


async def test_a_follower_starts_at_the_newest_stored_event(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "poirotd.db")
    try:
        await store.save_investigation(investigation("a"))
        for _ in range(3):
            await store.append_event(event("a"))
        reads, bus = _Reads(store), EventBus()
        follower = asyncio.create_task(bus.follow(reads, interval=0.05))
        async with asyncio.timeout(10):
            await bus.wait_beyond(2)  # the stored events were announced at once
            await eventually(lambda: len(reads.asked) >= 2)  # it has read once, and waits
            stored = await store.append_event(event("a"))
            await bus.wait_beyond(3)  # and what is stored next, within the interval
        follower.cancel()
        assert stored.event_id == 4
        assert min(reads.asked) == 3, "never read from the first event"
    finally:
        await store.close()
