"""Waiting for what a test expects without sleeping a fixed time."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from poirotd.model import TelemetryBatch, TelemetrySample


class Collector:
    """A sink that keeps what it is given, so tests can wait for counts instead of sleeping."""

    def __init__(self) -> None:
        self.samples: list[TelemetrySample] = []
        self._changed = asyncio.Event()

    async def __call__(self, batch: TelemetryBatch) -> None:
        self.samples.extend(batch.samples())
        self._changed.set()

    async def wait_until(self, done: Callable[[list[TelemetrySample]], bool]) -> None:
        """Returns once `done(samples)` holds; callers bound the wait with asyncio.timeout."""
        while not done(self.samples):
            self._changed.clear()
            await self._changed.wait()


async def eventually(check: Callable[[], bool | Awaitable[bool]]) -> None:
    """Polls `check` (a function or a coroutine function) until it holds; callers bound the wait
    with asyncio.timeout."""
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        await asyncio.sleep(0.01)
