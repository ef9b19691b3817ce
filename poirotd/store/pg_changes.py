"""Replicas told of each other's writes at once: PostgreSQL's LISTEN/NOTIFY.

A write transaction that stores an investigation event, queues an investigation or moves a lease
sends a notification on `CHANNEL`; PostgreSQL delivers it to every listening connection when (and
only if) the transaction commits, in commit order. `ChangeListener` keeps one connection
listening (opened at the first wait, opened again after a loss) and wakes whoever waits, also
each time it starts listening (what was notified meanwhile reached no one). A notification is a
hint, not the truth: the waiter then reads the store, and bounds its wait, so a
notification lost with a connection costs at most that bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import structlog

log = structlog.get_logger(__name__)

CHANNEL = "poirotd_changes"
# Within a write transaction: delivered to the listeners when it commits.
NOTIFY = f"SELECT pg_notify('{CHANNEL}', '')".encode()
# After a lost listening connection, the pause before the next one.
_RETRY_SECONDS = 1.0

Connection = psycopg.AsyncConnection[tuple[Any, ...]]


class ChangeListener:
    def __init__(self, connect: Callable[[], Awaitable[Connection]]) -> None:
        self._connect = connect
        self._changes = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def mark(self) -> int:
        """How many notifications arrived so far (listening from the first call on): take it
        before reading the store, then `wait` for a change after it."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="store-changes")
        return self._changes

    async def wait(self, since: int) -> None:
        """Returns once a notification arrived after `mark` gave `since`; callers bound the
        wait (asyncio.timeout)."""
        self.mark()
        async with self._changed:
            await self._changed.wait_for(lambda: self._changes != since)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _listen(self) -> None:
        listening = True  # as far as anyone knows: a first failure is worth a line
        while True:
            try:
                conn = await self._connect()
                try:
                    await conn.execute(f"LISTEN {CHANNEL}".encode())
                    if not listening:
                        log.info("store change listener listens again")
                    listening = True
                    # What was written while no connection listened was notified to no one:
                    # the waiters read the store again.
                    await self._changed_now()
                    async for _ in conn.notifies():
                        await self._changed_now()
                finally:
                    await conn.close()
            except psycopg.Error as exc:  # the connection or the server went away: listen again
                if listening:  # once per loss, not once per attempt to listen again
                    log.warning("store change listener lost its connection", error=str(exc))
                listening = False
            await asyncio.sleep(_RETRY_SECONDS)

    async def _changed_now(self) -> None:
        async with self._changed:
            self._changes += 1
            self._changed.notify_all()
