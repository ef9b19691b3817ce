"""What an operator reads of the sessions ingest stored (the Sessions RPCs): a page of them with
their counts, one with a page of its messages and a summary of its newest telemetry. Read only:
nothing here writes, so any replica answers from the shared store alike."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from poirotd.errors import InvalidArgument, NotFound, quote
from poirotd.model import AgentMessage, Reading
from poirotd.store import SessionSummary, Store

# The newest samples a session's telemetry summary covers: bounded, so that a long recording
# costs one bounded read (the store's own default window for the newest samples).
TELEMETRY_WINDOW = 10_000


@dataclass(frozen=True)
class SignalSummary:
    """One component's signal over the window: how many samples, their range, the newest."""

    component: str
    signal: str
    samples: int
    min: float
    max: float
    last: float
    first_at: datetime
    last_at: datetime


class SessionReads:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def page(
        self, *, page_size: int, page_token: str | None
    ) -> tuple[list[SessionSummary], str | None]:
        try:
            return await self._store.list_sessions(limit=page_size, page_token=page_token)
        except ValueError as exc:
            raise InvalidArgument(str(exc), reason="invalid") from exc

    async def get(self, session_id: str) -> SessionSummary:
        summary = await self._store.session_summary(session_id)
        if summary is None:
            raise NotFound(f"session {quote(session_id)} is not known", reason="unknown_session")
        return summary

    async def messages(
        self, session_id: str, *, from_index: int, limit: int
    ) -> tuple[list[AgentMessage], int | None]:
        """The session's messages with index >= from_index, at most `limit` of them, and the
        index the next page starts at (None: none follow)."""
        following = [
            m for m in await self._store.session_messages(session_id) if m.index >= from_index
        ]
        page = following[:limit]
        return page, following[limit].index if len(following) > limit else None

    async def series(
        self, session_id: str, component: str, signal: str, since: datetime, until: datetime
    ) -> list[Reading]:
        """One signal's readings measured within [since, until], oldest first, among the
        session's newest TELEMETRY_WINDOW samples (the page's chart of a hazard's window)."""
        readings = await self._store.newest_readings(session_id, limit=TELEMETRY_WINDOW)
        return [
            r
            for r in readings
            if r.component == component and r.signal == signal and since <= r.measured_at <= until
        ]

    async def telemetry(self, session_id: str) -> list[SignalSummary]:
        """Per component and signal (sorted by both), over the newest TELEMETRY_WINDOW samples."""
        readings = await self._store.newest_readings(session_id, limit=TELEMETRY_WINDOW)
        by_signal: dict[tuple[str, str], list[Reading]] = {}
        for reading in readings:  # oldest first
            by_signal.setdefault((reading.component, reading.signal), []).append(reading)
        return [
            SignalSummary(
                component=component,
                signal=signal,
                samples=len(series),
                min=min(r.value for r in series),
                max=max(r.value for r in series),
                last=series[-1].value,
                first_at=series[0].measured_at,
                last_at=series[-1].measured_at,
            )
            for (component, signal), series in sorted(by_signal.items())
        ]
