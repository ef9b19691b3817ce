"""GenAI log events parked in the store while they wait for their span (the OTLP log join,
`poirotd.transports.otlp.log_join`): a logs export is answered as accepted only once its waiting
events are parked, so a daemon that stops or crashes while they wait finds them again when it
starts. Operational state, like a lease: not chained (the messages they become are). An event's
row is deleted in the transaction that stores the messages it became, or once it is rejected
after its wait; both are `Parking` changes an ingest commit makes (`Store.commit_ingest`).

Each row names its owner, the replica whose memory holds the event and which reloads it when it
starts again (on SQLite, one daemon per file, every row is the one owner "").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from poirotd.store.chain import Row

# The same statements on both adapters (`?` placeholders; PostgreSQL's adapter rewrites them).
PARK = (
    "INSERT INTO parked_log_events"
    " (owner, event_id, trace_id, span_id, arrived_us, position, record, owned_us)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (owner, event_id) DO NOTHING"
)
RELEASE = "DELETE FROM parked_log_events WHERE owner = ? AND event_id = ?"
_COLUMNS = "owner, event_id, trace_id, span_id, arrived_us, position, record, owned_us"
OWNED = (
    f"SELECT {_COLUMNS} FROM parked_log_events WHERE owner = ?"
    " ORDER BY arrived_us, trace_id, span_id, position"
)
# Other owners' rows they have owned since before a time, deleted (to be parked again by who
# takes them).
TAKE_OVER = f"DELETE FROM parked_log_events WHERE owner <> ? AND owned_us < ? RETURNING {_COLUMNS}"


@dataclass(frozen=True)
class ParkedLogEvent:
    owner: str
    # Where the event came from and what it says, digested: the event of an exporter's retry of
    # the export is the same row (parked once).
    event_id: str
    trace_id: str
    span_id: str
    # When it arrived (wall clock, UTC microseconds): its wait is measured from it, restarts
    # included.
    arrived_us: int
    # Its place among its span's events in its export: events that arrived together are read
    # back in their order (a model call's input events may share one timestamp).
    position: int
    # The event itself, as JSON (`poirotd.transports.otlp.log_parking`).
    record: str
    # Since when `owner` holds it (wall clock, UTC microseconds): when it arrived, or when
    # the owner took it over from a replica gone.
    owned_us: int

    def row(self) -> tuple[str, str, str, str, int, int, str, int]:
        return (
            self.owner,
            self.event_id,
            self.trace_id,
            self.span_id,
            self.arrived_us,
            self.position,
            self.record,
            self.owned_us,
        )


@dataclass(frozen=True)
class Parking:
    """What an ingest commit changes among the parked events, in its transaction: `park` rows
    are added (a row already there is kept), then `release` rows ((owner, event_id)) deleted."""

    park: tuple[ParkedLogEvent, ...] = ()
    release: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.park or self.release)

    def __add__(self, other: Parking) -> Parking:
        return Parking((*self.park, *other.park), (*self.release, *other.release))

    def park_rows(self) -> list[tuple[str, str, str, str, int, int, str, int]]:
        return [event.row() for event in self.park]


NO_PARKING = Parking()


def parked_from_rows(rows: Iterable[Row]) -> list[ParkedLogEvent]:
    """`OWNED`'s or `TAKE_OVER`'s answer, oldest first."""
    return sorted(
        (ParkedLogEvent(*row) for row in rows),
        key=lambda p: (p.arrived_us, p.trace_id, p.span_id, p.position),
    )


def taken_over(
    owner: str, now_us: int, rows: Iterable[Row]
) -> tuple[list[ParkedLogEvent], Parking]:
    """`TAKE_OVER`'s answer (as its owners parked it) and the parking that gives it to
    `owner` from `now_us` on."""
    found = parked_from_rows(rows)
    return found, Parking(park=tuple(replace(p, owner=owner, owned_us=now_us) for p in found))
