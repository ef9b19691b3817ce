"""How each kind of record is stored: its row, its key in the audit chain and the columns it
determines. Writers build rows with these functions; `verify` and the migration rebuild the
expected row of a stored record with the same ones, so the two can never disagree.

Messages and telemetry are stored in blocks: a commit's new messages, or its samples, of one session
are one record (a row of `message_blocks` or `telemetry_blocks`, one chain entry), because a row and
an entry each cost more than all the rest of ingest at ingest rates. A message is stored once per
(session, index): `message_indices` holds the keys stored, each with its message's content digest,
for the check a resent one meets (the same content: a copy; other content: a conflict, kept in
`ingest_conflicts`) (derived data, like an SQL index: not chained). A telemetry block's `first_us`
and `last_us` bound its samples in time (the newest-first read orders by `last_us`). The
`agent_messages` and `telemetry_samples` views show them one per row (`block_id`, `position`), with
the per-row records older stores kept (tables `messages` from schema 4 and `telemetry` from schema
3, no longer written; `block_id` NULL, `position` the row id).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import attrgetter, itemgetter
from typing import Annotated, TypeAlias

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from poirotd.model import (
    AccessDenial,
    AgentMessage,
    AgentReputation,
    CampaignSeed,
    DiagnosisMemoryEntry,
    HazardSpace,
    IngestConflict,
    Investigation,
    InvestigationEvent,
    LLMExchange,
    MessageKind,
    SampleRow,
    Session,
    TelemetrySample,
)
from poirotd.store.chain import Row, canonical_json, encode_record

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TRACE_LINK = {"trace_id", "span_id"}
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class AuditedTable:
    """How the rows of one table are chained and checked.

    `columns` are stored in this order, the record (the audited payload) last. `ref(row)` is the
    entry's key. `expect(row, seq)` is the row the writer stores for the record in `row`, given the
    seq of its latest entry: the other columns are derived from the record, so a row that differs
    from its expectation was edited outside the store.
    """

    kind: str
    table: str
    columns: tuple[str, ...]
    ref: Callable[[Row], str]
    expect: Callable[[Row, int], Row]
    # The order a schema-1 table is chained in at migration.
    order: str = "rowid"

    @property
    def select(self) -> str:
        return f"SELECT {', '.join(self.columns)} FROM {self.table}"


# A message in a block: its fields in AgentMessage's order, all but its session (the block's).
# Typed, so that pydantic encodes them without inferring each value's type (twice as fast).
MESSAGE_BLOCK_FIELDS = (
    "index",
    "kind",
    "sender",
    "recipient",
    "content",
    "tool_calls",
    "tool_name",
    "sent_at",
    "trace_id",
    "span_id",
)
MessageRow: TypeAlias = tuple[
    int, MessageKind, str, str, str, tuple[str, ...], str, datetime, str, str
]
# A row as blocks written before messages kept their trace link hold it (read, never written).
_UnlinkedMessageRow: TypeAlias = tuple[
    int, MessageKind, str, str, str, tuple[str, ...], str, datetime
]
message_row_of = attrgetter(*MESSAGE_BLOCK_FIELDS)


class MessageBlock(BaseModel):
    """The record of one `message_blocks` row: one commit's new messages of one session.

    A change to AgentMessage's fields is a change of this record's layout, hence of the schema
    (a test holds `MESSAGE_BLOCK_FIELDS` and `MessageRow` to AgentMessage)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    # In arrival order.
    messages: Annotated[list[MessageRow | _UnlinkedMessageRow], Field(min_length=1)]

    def to_messages(self) -> list[AgentMessage]:
        """An unlinked row's missing trailing fields take their defaults."""
        return [
            AgentMessage(
                session_id=self.session_id, **dict(zip(MESSAGE_BLOCK_FIELDS, row, strict=False))
            )
            for row in self.messages
        ]


class TelemetryBlock(BaseModel):
    """The record of one `telemetry_blocks` row: one commit's samples of one session."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Declared in sorted order, so pydantic's own JSON has canonical key order (_block_record).
    # (component, signal, value, measured_at), in arrival order.
    samples: Annotated[list[SampleRow], Field(min_length=1)]
    session_id: str


def session_row(session: Session) -> Row:
    return (session.session_id, encode_record(session))


def message_row(message: AgentMessage) -> Row:
    """A schema-4 per-message row (verified and read, no longer written), encoded as schema 4
    wrote it: messages had no trace link then."""
    return (message.session_id, message.index, encode_record(message, exclude=_TRACE_LINK))


def message_block_row(block: MessageBlock, block_id: int | None = None) -> Row:
    return (block_id, block.session_id, encode_record(block))


def telemetry_row(sample: TelemetrySample, sample_id: int | None = None) -> Row:
    """A schema-3 per-sample row (verified and read, no longer written)."""
    return (sample_id, sample.session_id, micros(sample.measured_at), encode_record(sample))


def telemetry_block_row(block: TelemetryBlock, block_id: int | None = None) -> Row:
    first_us, last_us = _time_bounds(block.samples)
    return (block_id, block.session_id, first_us, last_us, _block_record(block))


_VALUE = itemgetter(2)
_MEASURED_AT = itemgetter(3)
# Floats whose shortest form has a one-digit negative exponent (1e-05 .. 1e-09): Python writes
# the exponent with two digits, pydantic with one. Taken a little wide on both sides.
_EXPONENT_BAND = (1e-11, 1e-4)


def _block_record(block: TelemetryBlock) -> str:
    """`encode_record(block)`, from pydantic's own JSON when that is the same text: one pass in
    pydantic-core instead of a dump and an encoding. The keys are declared in sorted order,
    strings are escaped alike, and floats are written alike outside `_EXPONENT_BAND`. A block
    with a value in the band, or a value that is not finite (which the canonical encoder
    refuses), takes the general path. A test holds the two equal across magnitudes and
    characters."""
    rows = block.samples
    values = np.abs(np.fromiter(map(_VALUE, rows), np.float64, len(rows)))
    low, high = _EXPONENT_BAND
    if np.isfinite(values).all() and not ((values >= low) & (values < high)).any():
        return block.model_dump_json()
    return encode_record(block)


def _time_bounds(rows: Sequence[SampleRow]) -> tuple[int, int]:
    """The earliest and latest times in microseconds: compared as datetimes (the same order),
    converted twice instead of once per sample, unless naive and aware times are mixed."""
    stamps = list(map(_MEASURED_AT, rows))
    try:
        return micros(min(stamps)), micros(max(stamps))
    except TypeError:  # naive and aware datetimes do not compare
        times = [micros(at) for at in stamps]
        return min(times), max(times)


def hazard_space_row(space: HazardSpace, put_seq: int) -> Row:
    # put_seq is the seq of the space's latest entry: "latest" is then covered by the chain too.
    return (space.system, space.version, put_seq, encode_record(space))


def investigation_row(inv: Investigation) -> Row:
    return (
        inv.investigation_id,
        inv.system,
        inv.session_id,
        inv.state.value,
        micros(inv.created_at),
        encode_record(inv),
    )


def reputation_row(reputation: AgentReputation) -> Row:
    return (reputation.system, reputation.agent_id, encode_record(reputation))


def campaign_seed_row(seed: CampaignSeed) -> Row:
    return (seed.system, encode_record(seed))


def memory_row(entry: DiagnosisMemoryEntry) -> Row:
    return (entry.system, entry.entry_id, encode_record(entry))


def event_row(event: InvestigationEvent, event_id: int | None) -> Row:
    # The id is the row's key (and the entry's ref), not part of the record.
    return (event_id, event.investigation_id, encode_record(event, exclude={"event_id"}))


def exchange_row(exchange: LLMExchange, investigation_id: str, exchange_id: int | None) -> Row:
    return (exchange_id, investigation_id, encode_record(exchange))


def access_denial_row(denial: AccessDenial, denial_id: int | None) -> Row:
    return (denial_id, encode_record(denial))


def ingest_conflict_row(conflict: IngestConflict, conflict_id: int | None) -> Row:
    return (conflict_id, conflict.session_id, encode_record(conflict))


def event_from_row(row: Row) -> InvestigationEvent:
    return InvestigationEvent.model_validate({**json.loads(row[-1]), "event_id": row[0]})


SESSIONS = AuditedTable(
    "session",
    "sessions",
    ("session_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: session_row(Session.model_validate_json(row[-1])),
)
MESSAGES = AuditedTable(
    "message",
    "messages",
    ("session_id", "idx", "record"),
    ref=lambda row: f"{row[0]}/{row[1]}",
    expect=lambda row, _: message_row(AgentMessage.model_validate_json(row[-1])),
)
MESSAGE_BLOCKS = AuditedTable(
    "message_block",
    "message_blocks",
    ("id", "session_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: message_block_row(MessageBlock.model_validate_json(row[-1]), row[0]),
)
TELEMETRY = AuditedTable(
    "telemetry",
    "telemetry",
    ("id", "session_id", "measured_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: telemetry_row(TelemetrySample.model_validate_json(row[-1]), row[0]),
)
TELEMETRY_BLOCKS = AuditedTable(
    "telemetry_block",
    "telemetry_blocks",
    ("id", "session_id", "first_us", "last_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: telemetry_block_row(TelemetryBlock.model_validate_json(row[-1]), row[0]),
)
HAZARD_SPACES = AuditedTable(
    "hazard_space",
    "hazard_spaces",
    ("system", "version", "put_seq", "record"),
    # Two free-form strings: a JSON pair keeps the ref unambiguous whatever they contain.
    ref=lambda row: canonical_json([row[0], row[1]]),
    expect=lambda row, seq: hazard_space_row(HazardSpace.model_validate_json(row[-1]), seq),
    order="put_seq",
)
INVESTIGATIONS = AuditedTable(
    "investigation",
    "investigations",
    ("investigation_id", "system", "session_id", "state", "created_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: investigation_row(Investigation.model_validate_json(row[-1])),
)
EVENTS = AuditedTable(
    "event",
    "events",
    ("event_id", "investigation_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: event_row(event_from_row(row), row[0]),
)
EXCHANGES = AuditedTable(
    "exchange",
    "exchanges",
    ("id", "investigation_id", "record"),
    # The investigation is in the ref because the exchange record does not name it.
    ref=lambda row: f"{row[1]}/{row[0]}",
    expect=lambda row, _: exchange_row(LLMExchange.model_validate_json(row[-1]), row[1], row[0]),
)
REPUTATIONS = AuditedTable(
    "reputation",
    "reputations",
    ("system", "agent_id", "record"),
    ref=lambda row: canonical_json([row[0], row[1]]),
    expect=lambda row, _: reputation_row(AgentReputation.model_validate_json(row[-1])),
)
CAMPAIGN_SEEDS = AuditedTable(
    "campaign_seed",
    "campaign_seeds",
    ("system", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: campaign_seed_row(CampaignSeed.model_validate_json(row[-1])),
)
DIAGNOSIS_MEMORY = AuditedTable(
    "diagnosis_memory",
    "diagnosis_memory",
    ("system", "entry_id", "record"),
    ref=lambda row: canonical_json([row[0], row[1]]),
    expect=lambda row, _: memory_row(DiagnosisMemoryEntry.model_validate_json(row[-1])),
)
ACCESS_DENIALS = AuditedTable(
    "access_denial",
    "access_denials",
    ("id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: access_denial_row(AccessDenial.model_validate_json(row[-1]), row[0]),
)
INGEST_CONFLICTS = AuditedTable(
    "ingest_conflict",
    "ingest_conflicts",
    ("id", "session_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: ingest_conflict_row(IngestConflict.model_validate_json(row[-1]), row[0]),
)
AUDITED_TABLES = (
    SESSIONS,
    HAZARD_SPACES,
    INVESTIGATIONS,
    REPUTATIONS,
    CAMPAIGN_SEEDS,
    DIAGNOSIS_MEMORY,
    MESSAGES,
    MESSAGE_BLOCKS,
    TELEMETRY,
    TELEMETRY_BLOCKS,
    EVENTS,
    EXCHANGES,
    ACCESS_DENIALS,
    INGEST_CONFLICTS,
)


def micros(at: datetime) -> int:
    """Integer UTC microseconds since the epoch: exact, and orders across time zones."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - _EPOCH) // _MICROSECOND


def from_micros(us: int) -> datetime:
    """The UTC time `micros` gave `us` for."""
    return _EPOCH + us * _MICROSECOND
