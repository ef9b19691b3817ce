"""Whether a part the daemon depends on answers (the store, one LLM server): an outage is a
state with a start, a kind and an end, logged once when it begins and once when it ends (with
its duration), never once per failed call or poll.

The part's adapter reports what it meets (`failed`, `answered`); whoever must react to the part
coming and going (gauges, gRPC health, workers waiting for the model) reads `up` or subscribes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Availability:
    """One part's state. `part` names it in logs ("store", "llm"); `context` is logged with
    each line (the server's URL). Not thread-safe: call it on the event loop."""

    def __init__(self, part: str, **context: str) -> None:
        self.part = part
        self._context = context
        self.down_since: datetime | None = None
        self._down_at = 0.0
        # The kind of the latest failure ("" before any): a short bounded label.
        self.last_error_kind = ""
        self._listeners: list[Callable[[], None]] = []
        self._back = asyncio.Event()
        self._back.set()

    @property
    def up(self) -> bool:
        return self.down_since is None

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener()` is called each time the part goes down or comes back."""
        self._listeners.append(listener)

    def failed(self, kind: str, detail: str) -> None:
        """The part cannot be reached: an outage begins now, unless one goes on already."""
        self.last_error_kind = kind
        if self.down_since is not None:
            return
        self.down_since = datetime.now(UTC)
        self._down_at = time.monotonic()
        self._back.clear()
        log.error("outage began", part=self.part, kind=kind, detail=detail, **self._context)
        self._notify()

    def answered(self) -> None:
        """The part answered: the outage, if one went on, ends now."""
        if self.down_since is None:
            return
        seconds = time.monotonic() - self._down_at
        self.down_since = None
        self._back.set()
        log.warning(
            "outage ended",
            part=self.part,
            kind=self.last_error_kind,
            down_seconds=round(seconds, 3),
            **self._context,
        )
        self._notify()

    async def wait_up(self) -> None:
        """Returns once the part answers (at once if it does)."""
        await self._back.wait()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()


class PartState(Protocol):
    """What a part's users read of it: whether it answers, since when it does not, and a way to
    wait for it (`Availability`, or an LLM backend's servers together)."""

    @property
    def up(self) -> bool: ...

    @property
    def down_since(self) -> datetime | None: ...

    def subscribe(self, listener: Callable[[], None]) -> None: ...

    async def wait_up(self) -> None: ...
