"""GenAI log events that wait for their span, as the store parks them (`poirotd.store.
parked_logs`): a logs export is answered only once its waiting events are parked, in the commit
of what it placed, and an event's row is released in the commit of the messages it became (or of
its rejection). A daemon that starts again reloads its own rows into the log join, each waiting
what is left of its wait, measured from its arrival on the wall clock.

Whose rows: each daemon parks under its owner name and reloads those. Alone on a SQLite file
that is always "" (so a restart with another replica id finds them); over a shared PostgreSQL it
is the replica id (`POIROTD_REPLICA_ID`). A replica that starts again under its id reloads its
rows at once; the rows of one that does not (a pod replaced under a new name) are taken over by
whichever live replica first finds them held for twice the wait (`take_over_after`): a live
replica places or rejects each of its events once it waited its time (the receiver's sweep), so
only a gone one's rows get that old. The taker places them if it knows their span (an exporter
that lost its replica sends the spans to another), else rejects them `no_span`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson

from poirotd.store.parked_logs import ParkedLogEvent, Parking
from poirotd.transports.otlp.log_records import SpanKey
from poirotd.transports.otlp.mapping import LoggedEvent


@dataclass(frozen=True)
class WaitingEvent:
    """A log event waiting for its span, with what parks it."""

    # Its span, its place among the span's events of its export and what it says, digested: an
    # exporter's retry of the export brings the same event (parked and waiting once).
    event_id: str
    event: LoggedEvent
    # When it arrived, wall clock seconds.
    arrived: float
    # Its place among its span's events in its export.
    position: int


def waiting_events(
    key: SpanKey, events: Sequence[LoggedEvent], arrived: float
) -> list[WaitingEvent]:
    """The events of one span of one logs export, in the export's order, arrived now."""
    return [
        WaitingEvent(_event_id(key, position, event), event, arrived, position)
        for position, event in enumerate(events)
    ]


class LogParking:
    """The parking changes of this daemon (its `owner` name) for what the log join did.
    `take_over_after`: over a shared store, the seconds after which another owner's parked
    event is taken as its replica's gone (None: alone on the store, every row is this one's)."""

    def __init__(self, owner: str, take_over_after: float | None = None) -> None:
        self.owner = owner
        self.take_over_after = take_over_after

    def park(self, waiting: Mapping[SpanKey, Sequence[WaitingEvent]]) -> Parking:
        rows = tuple(
            ParkedLogEvent(
                self.owner,
                w.event_id,
                trace_id,
                span_id,
                arrived_us := round(w.arrived * 1e6),
                w.position,
                _record(w.event),
                arrived_us,
            )
            for (trace_id, span_id), events in waiting.items()
            for w in events
        )
        return Parking(park=rows)

    def release(self, taken: Mapping[SpanKey, Sequence[WaitingEvent]]) -> Parking:
        released = tuple((self.owner, w.event_id) for events in taken.values() for w in events)
        return Parking(release=released)

    def reloaded(self, rows: Sequence[ParkedLogEvent]) -> dict[SpanKey, list[WaitingEvent]]:
        """The parked rows (this owner's, oldest first) as the events they were."""
        events: dict[SpanKey, list[WaitingEvent]] = {}
        for row in rows:
            event = _event(row.record)
            waiting = WaitingEvent(row.event_id, event, row.arrived_us / 1e6, row.position)
            events.setdefault((row.trace_id, row.span_id), []).append(waiting)
        return events


def _record(event: LoggedEvent) -> str:
    """The event as JSON. A bytes value (OTLP allows one in a body, the GenAI events put none
    there) is written as OTLP/JSON writes it, base64 text, and reloaded as that text."""
    return orjson.dumps(event._asdict(), default=_base64).decode()


def _event(record: str) -> LoggedEvent:
    fields = orjson.loads(record)
    return LoggedEvent(fields["name"], fields["body"], fields["at_ns"])


def _event_id(key: SpanKey, position: int, event: LoggedEvent) -> str:
    said = orjson.dumps((*key, position, event.name, event.at_ns, event.body), default=_base64)
    return hashlib.blake2b(said, digest_size=16).hexdigest()


def _base64(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")
