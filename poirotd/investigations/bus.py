"""Wakes Watch streams when an investigation event is stored; the store stays the truth."""

from __future__ import annotations

import asyncio


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
