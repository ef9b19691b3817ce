"""The durable store on SQLite in WAL mode: an acknowledged write is a committed write.

Threads: the event loop never runs SQL. One worker thread owns the only write connection, so
writes are serialised in submission order (a session started by one ingest call exists for the
next one, and event ids are committed in the order they are assigned: a Watch that reads "after N"
can never miss an id that commits later). A second thread owns a read-only connection: WAL lets it
read the last committed state while the writer waits on fsync, so Get/List/Watch stay responsive
during ingest bursts (with synchronous=FULL each commit is an fsync: milliseconds on SSDs, tens of
milliseconds on the SD cards of edge boxes). Every read is a single statement, hence a consistent
snapshot, but for the reads of a session's messages or newest samples: they also read the rows an
older schema left, which nothing writes any more.

Records are JSON in the canonical form the audit chain hashes (exact round trip, readable with the
sqlite3 shell); columns exist only for what is looked up or ordered, and derive from the record.
Ordering keys for time are integer UTC microseconds (naive datetimes are taken as UTC); the record
keeps the datetime exactly as given.

Messages and telemetry are stored in blocks: a commit's new messages, or its samples, of one
session are one record (a row of `message_blocks` or `telemetry_blocks`, one chain entry), because
a row and an entry each cost more than all the rest of ingest at ingest rates. A message is
stored once per (session, index): `message_indices` holds the keys stored, for the check a resent
one meets (derived data, like an SQL index: not chained). A telemetry block's `first_us` and
`last_us` bound its samples in time (the newest-first read orders by `last_us`). The
`agent_messages` and `telemetry_samples` views show them one per row (`block_id`, `position`),
with the per-row records older stores kept (tables `messages` from schema 4 and `telemetry` from
schema 3, no longer written; `block_id` NULL, `position` the row id).

Audit chain (EU AI Act Art. 12): every write of a record (a session started or ended, a block of
messages or of telemetry, a hazard space, each save of an investigation, an event, an LLM
exchange, an agent's reputation) also appends, in the same transaction, an entry (seq, kind,
ref, payload, prev_hash, hash) to the append-only `audit` table. `ref` is the record's key within
its kind; `payload` is the record in canonical JSON (`encode_record`), byte for byte the text its
table stores, so a check needs no re-encoding that a future model change could alter; hash =
`entry_hash(prev_hash, kind, ref, payload)`, starting from `GENESIS_HASH`. `AUDITED_TABLES` says,
per kind, how a row gives its ref and which columns its record determines; `poirotd.audit`
verifies and exports with it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sqlite3
from _json import make_encoder
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, partial
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Annotated, Any, Concatenate, Literal, ParamSpec, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from poirotd.model import (
    AgentMessage,
    AgentReputation,
    ConfirmedOutcome,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    LLMExchange,
    MessageKind,
    Reading,
    Session,
    SessionEnd,
    TelemetrySample,
)

IngestItem: TypeAlias = Session | SessionEnd | AgentMessage | TelemetrySample

# 2: the audit chain; sessions keep their record as JSON like every other table.
# 3: agents' reputations (a new table; a schema-2 store gains it empty when opened).
# 4: telemetry in blocks (a new table; a schema-3 store keeps its per-sample rows as they are).
# 5: messages in blocks, deduplicated through `message_indices` (a schema-4 store keeps its
#    per-message rows, and their indices are added there when it is opened).
SCHEMA_VERSION = 5
_BUSY_TIMEOUT_MS = 5_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    record     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id         INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    idx        INTEGER NOT NULL,
    record     TEXT NOT NULL,
    UNIQUE (session_id, idx)
);
CREATE TABLE IF NOT EXISTS message_blocks (
    id         INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    record     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS message_blocks_by_session ON message_blocks (session_id, id);
CREATE TABLE IF NOT EXISTS message_indices (
    session_id TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    PRIMARY KEY (session_id, idx)
) WITHOUT ROWID;
CREATE VIEW IF NOT EXISTS agent_messages
    (session_id, idx, kind, sender, recipient, content, sent_at, block_id, position) AS
SELECT session_id, idx, json_extract(record, '$.kind'), json_extract(record, '$.sender'),
       json_extract(record, '$.recipient'), json_extract(record, '$.content'),
       json_extract(record, '$.sent_at'), NULL, id
FROM messages
UNION ALL
SELECT b.session_id, json_extract(m.value, '$[0]'), json_extract(m.value, '$[1]'),
       json_extract(m.value, '$[2]'), json_extract(m.value, '$[3]'),
       json_extract(m.value, '$[4]'), json_extract(m.value, '$[7]'), b.id, m.key
FROM message_blocks AS b, json_each(b.record, '$.messages') AS m;
CREATE TABLE IF NOT EXISTS telemetry (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions (session_id),
    measured_us INTEGER NOT NULL,
    record      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS telemetry_by_session_time ON telemetry (session_id, measured_us, id);
CREATE TABLE IF NOT EXISTS telemetry_blocks (
    id         INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    first_us   INTEGER NOT NULL,
    last_us    INTEGER NOT NULL,
    record     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS telemetry_blocks_by_session_time
    ON telemetry_blocks (session_id, last_us, id);
CREATE VIEW IF NOT EXISTS telemetry_samples
    (session_id, component, signal, value, measured_at, block_id, position) AS
SELECT session_id, json_extract(record, '$.component'), json_extract(record, '$.signal'),
       json_extract(record, '$.value'), json_extract(record, '$.measured_at'), NULL, id
FROM telemetry
UNION ALL
SELECT b.session_id, json_extract(s.value, '$[0]'), json_extract(s.value, '$[1]'),
       json_extract(s.value, '$[2]'), json_extract(s.value, '$[3]'), b.id, s.key
FROM telemetry_blocks AS b, json_each(b.record, '$.samples') AS s;
CREATE TABLE IF NOT EXISTS hazard_spaces (
    system  TEXT NOT NULL,
    version TEXT NOT NULL,
    put_seq INTEGER NOT NULL,
    record  TEXT NOT NULL,
    PRIMARY KEY (system, version)
);
CREATE TABLE IF NOT EXISTS investigations (
    investigation_id TEXT PRIMARY KEY,
    system           TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    state            TEXT NOT NULL,
    created_us       INTEGER NOT NULL,
    record           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS investigations_by_time
    ON investigations (created_us, investigation_id);
CREATE INDEX IF NOT EXISTS investigations_by_session
    ON investigations (session_id, created_us, investigation_id);
CREATE INDEX IF NOT EXISTS investigations_by_state
    ON investigations (state, created_us, investigation_id);
CREATE TABLE IF NOT EXISTS events (
    event_id         INTEGER PRIMARY KEY AUTOINCREMENT,
    investigation_id TEXT NOT NULL REFERENCES investigations (investigation_id),
    record           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_investigation ON events (investigation_id, event_id);
CREATE TABLE IF NOT EXISTS exchanges (
    id               INTEGER PRIMARY KEY,
    investigation_id TEXT NOT NULL REFERENCES investigations (investigation_id),
    record           TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS exchanges_by_investigation ON exchanges (investigation_id, id);
CREATE TABLE IF NOT EXISTS reputations (
    system   TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    record   TEXT NOT NULL,
    PRIMARY KEY (system, agent_id)
);
CREATE TABLE IF NOT EXISTS audit (
    seq       INTEGER PRIMARY KEY,
    kind      TEXT NOT NULL,
    ref       TEXT NOT NULL,
    payload   TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_ref ON audit (kind, ref, seq);
"""
# A guard against slips in the sqlite3 shell, not against an attacker (who can drop it; verify
# still catches the edit). Kept apart from _SCHEMA: a trigger body has its own semicolons.
_AUDIT_GUARDS = tuple(
    f"CREATE TRIGGER IF NOT EXISTS audit_no_{op.lower()} BEFORE {op} ON audit"
    " BEGIN SELECT RAISE(ABORT, 'the audit table is append-only'); END"
    for op in ("UPDATE", "DELETE")
)

_INSERT_SESSION = "INSERT OR IGNORE INTO sessions (session_id, record) VALUES (?, ?)"
_UPSERT_SESSION = (
    "INSERT INTO sessions (session_id, record) VALUES (?, ?)"
    " ON CONFLICT (session_id) DO UPDATE SET record = excluded.record"
)
_INSERT_MESSAGE_INDEX = "INSERT OR IGNORE INTO message_indices (session_id, idx) VALUES (?, ?)"
_INSERT_MESSAGE_BLOCK = "INSERT INTO message_blocks (id, session_id, record) VALUES (?, ?, ?)"
_INSERT_TELEMETRY_BLOCK = (
    "INSERT INTO telemetry_blocks (id, session_id, first_us, last_us, record)"
    " VALUES (?, ?, ?, ?, ?)"
)
_PUT_HAZARD_SPACE = """
INSERT INTO hazard_spaces (system, version, put_seq, record) VALUES (?, ?, ?, ?)
ON CONFLICT (system, version) DO UPDATE SET put_seq = excluded.put_seq, record = excluded.record
"""
_SAVE_INVESTIGATION = """
INSERT INTO investigations (investigation_id, system, session_id, state, created_us, record)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (investigation_id) DO UPDATE SET
    system = excluded.system, session_id = excluded.session_id, state = excluded.state,
    created_us = excluded.created_us, record = excluded.record
"""
_PUT_REPUTATION = """
INSERT INTO reputations (system, agent_id, record) VALUES (?, ?, ?)
ON CONFLICT (system, agent_id) DO UPDATE SET record = excluded.record
"""
_INSERT_EVENT = "INSERT INTO events (event_id, investigation_id, record) VALUES (?, ?, ?)"
_INSERT_EXCHANGE = "INSERT INTO exchanges (id, investigation_id, record) VALUES (?, ?, ?)"
_APPEND_AUDIT = (
    "INSERT INTO audit (seq, kind, ref, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?)"
)

_P = ParamSpec("_P")
_T = TypeVar("_T")
Row: TypeAlias = tuple[Any, ...]

GENESIS_HASH = "00" * 32
# What json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False) runs: CPython's C encoder. json.dumps builds a new one on every call, a third
# of the cost of encoding a telemetry sample, so it is built once here.
_CANONICAL = make_encoder(
    None,  # markers: no circular check (records are acyclic; it costs 6% of encoding)
    json.JSONEncoder().default,  # raises TypeError for what JSON cannot hold
    json.encoder.encode_basestring,  # non-ASCII as is
    None,  # indent
    ":",
    ",",
    True,  # sort_keys
    False,  # skipkeys
    False,  # allow_nan
)


def canonical_json(value: Any) -> str:
    """The one encoding the chain hashes (UTF-8 when hashed): keys sorted, no whitespace,
    non-ASCII as is, floats in their shortest round-trip form (1.0 stays 1.0), no NaN or
    infinity. Re-encoding what `json.loads` gives back yields the same text, so a reader of an
    export can re-hash its records."""
    return "".join(_CANONICAL(value, 0))


def encode_record(record: BaseModel, *, exclude: set[str] | None = None) -> str:
    """A record as its table stores it and the chain hashes it: pydantic's JSON form (datetimes
    ISO 8601, "Z" for UTC, any other offset kept, naive ones bare) in canonical JSON."""
    return canonical_json(record.model_dump(mode="json", exclude=exclude))


def entry_hash(prev_hash: str, kind: str, ref: str, payload: str) -> str:
    """SHA-256 (hex) of prev_hash as its 32 bytes, kind and ref each after its UTF-8 length as
    4 big-endian bytes (so no two kind/ref splits of the same bytes collide), then the payload."""
    return _digest(bytes.fromhex(prev_hash), kind, ref, payload).hex()


def _digest(prev: bytes, kind: str, ref: str, payload: str) -> bytes:
    """`entry_hash` on bytes: the writer chains thousands of entries a second."""
    r = ref.encode()
    data = b"".join((prev, _sized(kind), len(r).to_bytes(4, "big"), r, payload.encode()))
    return hashlib.sha256(data).digest()


@cache
def _sized(kind: str) -> bytes:
    k = kind.encode()
    return len(k).to_bytes(4, "big") + k


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


class UnknownSessionError(ValueError):
    """An ingest item refers to a session that was neither committed nor started earlier in its
    batch; the whole batch is refused, nothing of it is stored."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} is not known; start it first")
        self.session_id = session_id


class UnknownInvestigationError(ValueError):
    """An event or exchange refers to an investigation that was never saved."""

    def __init__(self, investigation_id: str) -> None:
        super().__init__(f"investigation {investigation_id!r} is not known; save it first")
        self.investigation_id = investigation_id


class AlreadyConfirmedError(ValueError):
    """The investigation's outcome was confirmed before, with other regions; the first stands
    (the reputations it moved cannot be moved back)."""

    def __init__(self, investigation_id: str, confirmed: ConfirmedOutcome) -> None:
        super().__init__(
            f"investigation {investigation_id!r} was already confirmed with "
            f"{list(confirmed.region_ids)} at {confirmed.at.isoformat()}"
        )
        self.confirmed = confirmed


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
)
MessageRow: TypeAlias = tuple[int, MessageKind, str, str, str, tuple[str, ...], str, datetime]
_message_row_of = attrgetter(*MESSAGE_BLOCK_FIELDS)


class MessageBlock(BaseModel):
    """The record of one `message_blocks` row: one commit's new messages of one session.

    A change to AgentMessage's fields is a change of this record's layout, hence of the schema
    (a test holds `MESSAGE_BLOCK_FIELDS` and `MessageRow` to AgentMessage)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    # In arrival order.
    messages: Annotated[list[MessageRow], Field(min_length=1)]

    def to_messages(self) -> list[AgentMessage]:
        return [
            AgentMessage(
                session_id=self.session_id, **dict(zip(MESSAGE_BLOCK_FIELDS, row, strict=True))
            )
            for row in self.messages
        ]


class TelemetryBlock(BaseModel):
    """The record of one `telemetry_blocks` row: one commit's samples of one session."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    # (component, signal, value, measured_at), in arrival order.
    samples: Annotated[list[tuple[str, str, float, datetime]], Field(min_length=1)]


# Given an investigation and the stored reputations of its system, the reputations to store.
Reassess: TypeAlias = Callable[[Investigation, dict[str, AgentReputation]], list[AgentReputation]]


class Store:
    """Sessions, hazard spaces, investigations, their events and LLM exchanges, each write chained.

    Create with `await Store.open(path)`; every method but `has_session` is a coroutine.
    `synchronous="NORMAL"` keeps commits safe from a crash of the daemon but not from power loss.
    Opening a schema-1 database migrates it: its rows as they are become the first entries of the
    chain (the chain starts at migration; earlier versions of a record are not recoverable).
    """

    def __init__(self, writer: _Worker, reader: _Worker, sessions: set[str]) -> None:
        self._writer = writer
        self._reader = reader
        # Mutated only by the writer thread, after COMMIT; read on the loop (atomic under the GIL).
        self._sessions = sessions
        self._closing: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, path: Path | str, *, synchronous: Literal["FULL", "NORMAL"] = "FULL"
    ) -> Store:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        writer = _Worker("poirotd-store-writer")
        reader = _Worker("poirotd-store-reader")
        try:
            sessions = await writer.start(partial(_open_writer, Path(path), synchronous))
            await reader.start(partial(_open_reader, Path(path)))
        except BaseException:
            await reader.stop()
            await writer.stop()
            raise
        return cls(writer, reader, sessions)

    async def close(self) -> None:
        """Lets already submitted work finish, then closes both connections; idempotent."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        try:
            await self._reader.stop()
        finally:
            await self._writer.stop()

    def _check_open(self) -> None:
        if self._closing is not None:
            raise RuntimeError("store is closed")

    async def _write(
        self, fn: Callable[Concatenate[sqlite3.Connection, _P], _T], *a: _P.args, **k: _P.kwargs
    ) -> _T:
        self._check_open()
        return await self._writer.run(lambda conn: fn(conn, *a, **k))

    async def _read(
        self, fn: Callable[Concatenate[sqlite3.Connection, _P], _T], *a: _P.args, **k: _P.kwargs
    ) -> _T:
        self._check_open()
        return await self._reader.run(lambda conn: fn(conn, *a, **k))

    # ------------------------------------------------------------ ingest

    async def commit_ingest(self, items: Sequence[IngestItem]) -> None:
        """Stores the batch in one transaction and returns after COMMIT (the ack point)."""
        await self._write(_commit_ingest, items, self._sessions)

    def has_session(self, session_id: str) -> bool:
        self._check_open()
        return session_id in self._sessions

    async def get_session(self, session_id: str) -> Session | None:
        return await self._read(_get_session, session_id)

    async def session_messages(self, session_id: str) -> list[AgentMessage]:
        """The session's messages in index order."""
        return await self._read(_session_messages, session_id)

    async def newest_readings(self, session_id: str, *, limit: int = 10_000) -> list[Reading]:
        """The session's newest `limit` samples, oldest first (ties in time keep arrival order)."""
        _check_limit(limit)
        return await self._read(_newest_readings, session_id, limit)

    # ------------------------------------------------------------ hazard spaces

    async def get_hazard_space(self, system: str, version: str) -> HazardSpace | None:
        rows = await self._read(
            _all,
            "SELECT record FROM hazard_spaces WHERE system = ? AND version = ?",
            (system, version),
        )
        return HazardSpace.model_validate_json(rows[0][0]) if rows else None

    async def put_hazard_space(self, space: HazardSpace) -> None:
        """Upsert; the space put last (even an older version put again) becomes the latest."""
        await self._write(_put_hazard_space, space)

    async def latest_hazard_space(self, system: str) -> HazardSpace | None:
        rows = await self._read(
            _all,
            "SELECT record FROM hazard_spaces WHERE system = ? ORDER BY put_seq DESC LIMIT 1",
            (system,),
        )
        return HazardSpace.model_validate_json(rows[0][0]) if rows else None

    # ------------------------------------------------------------ investigations

    async def save_investigation(self, inv: Investigation) -> None:
        await self._write(_save_investigation, inv)

    async def get_investigation(self, investigation_id: str) -> Investigation | None:
        rows = await self._read(
            _all,
            "SELECT record FROM investigations WHERE investigation_id = ?",
            (investigation_id,),
        )
        return Investigation.model_validate_json(rows[0][0]) if rows else None

    async def list_investigations(
        self,
        *,
        session_id: str | None = None,
        state: InvestigationState | None = None,
        limit: int = 50,
        page_token: str | None = None,
    ) -> tuple[list[Investigation], str | None]:
        """Newest first (created_at, then id, descending). Keyset pagination: the opaque token is
        the last row's key, so pages neither skip nor repeat rows when new ones arrive."""
        _check_limit(limit)
        where: list[str] = ["1"]
        params: list[Any] = []
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if state is not None:
            where.append("state = ?")
            params.append(state.value)
        if page_token:
            where.append("(created_us, investigation_id) < (?, ?)")
            params.extend(_decode_page_token(page_token))
        rows = await self._read(
            _all,
            f"SELECT created_us, investigation_id, record FROM investigations"
            f" WHERE {' AND '.join(where)}"
            f" ORDER BY created_us DESC, investigation_id DESC LIMIT ?",
            (*params, limit + 1),
        )
        page = [Investigation.model_validate_json(record) for _, _, record in rows[:limit]]
        token = _encode_page_token(*rows[limit - 1][:2]) if len(rows) > limit else None
        return page, token

    async def interrupt_unfinished(self, reason: str, at: datetime) -> list[str]:
        """Marks every QUEUED or RUNNING investigation INTERRUPTED (one transaction), oldest first;
        emitting the matching events is the caller's job."""
        return await self._write(_interrupt_unfinished, reason, at)

    # ------------------------------------------------------------ confirmed outcomes

    async def confirm_outcome(
        self, investigation_id: str, outcome: ConfirmedOutcome, reassess: Reassess
    ) -> tuple[Investigation, bool]:
        """Records the investigation's true cause and the reputations `reassess` derives from it,
        in one transaction on the writer thread, so two confirmations never read the same
        reputations. Idempotent: confirming the same regions again changes nothing and returns
        (record, False); other regions raise AlreadyConfirmedError. Returns (record, True) when
        this call confirmed it."""
        return await self._write(_confirm_outcome, investigation_id, outcome, reassess)

    async def reputations(self, system: str) -> dict[str, AgentReputation]:
        """The stored reputation of each agent of `system` that has one, by agent id."""
        rows = await self._read(
            _all, "SELECT record FROM reputations WHERE system = ? ORDER BY agent_id", (system,)
        )
        reputations = [AgentReputation.model_validate_json(record) for (record,) in rows]
        return {r.agent_id: r for r in reputations}

    # ------------------------------------------------------------ investigation events

    async def append_event(self, event: InvestigationEvent) -> InvestigationEvent:
        """Stores the event under the next global id (the incoming one is ignored)."""
        event_id = await self._write(_append_event, event)
        return event.model_copy(update={"event_id": event_id})

    async def events_after(
        self, after_event_id: int, *, investigation_id: str | None = None, limit: int = 500
    ) -> list[InvestigationEvent]:
        _check_limit(limit)
        sql = "SELECT event_id, record FROM events WHERE event_id > ?"
        params: list[Any] = [after_event_id]
        if investigation_id is not None:
            sql += " AND investigation_id = ?"
            params.append(investigation_id)
        rows = await self._read(_all, sql + " ORDER BY event_id LIMIT ?", (*params, limit))
        return [
            InvestigationEvent.model_validate({**json.loads(record), "event_id": event_id})
            for event_id, record in rows
        ]

    # ------------------------------------------------------------ LLM exchange audit

    async def record_exchange(self, investigation_id: str, exchange: LLMExchange) -> None:
        await self._write(_record_exchange, investigation_id, exchange)

    async def exchanges(self, investigation_id: str) -> list[LLMExchange]:
        rows = await self._read(
            _all,
            "SELECT record FROM exchanges WHERE investigation_id = ? ORDER BY id",
            (investigation_id,),
        )
        return [LLMExchange.model_validate_json(record) for (record,) in rows]


class _Worker:
    """One thread owning one connection (sqlite3 connections must stay on their thread)."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None

    async def start(self, connect: Callable[[], tuple[sqlite3.Connection, _T]]) -> _T:
        def run() -> _T:
            self._conn, result = connect()
            return result

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    async def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def call() -> _T:
            assert self._conn is not None, "worker used before start"
            return fn(self._conn)

        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def stop(self) -> None:
        """Queued behind all submitted work, so nothing accepted is cut short."""

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, close)
        finally:
            self._executor.shutdown(wait=False)


# ------------------------------------------------------------ connection setup (worker threads)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write, whatever it runs (the audit tools and the migration's view
    of the schema-1 rows use it); autocommit, so BEGIN takes a snapshot for several reads."""
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: no implicit BEGIN; writes use explicit transactions, reads autocommit.
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise RuntimeError(f"cannot use WAL journal mode for {path} (got {mode!r})")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_writer(path: Path, synchronous: str) -> tuple[sqlite3.Connection, set[str]]:
    conn = _connect(path)
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        with _transaction(conn) as chain:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{path} has schema version {version}; this poirotd supports up to "
                    f"{SCHEMA_VERSION}"
                )
            for statement in (*filter(str.strip, _SCHEMA.split(";")), *_AUDIT_GUARDS):
                conn.execute(statement)
            if version == 1:
                _migrate_from_v1(conn, chain, path)
            if version < 5:  # the messages stored one per row are deduplicated against too
                conn.execute(
                    "INSERT OR IGNORE INTO message_indices SELECT session_id, idx FROM messages"
                )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        sessions = {sid for (sid,) in conn.execute("SELECT session_id FROM sessions")}
    except BaseException:
        conn.close()
        raise
    return conn, sessions


def _open_reader(path: Path) -> tuple[sqlite3.Connection, None]:
    conn = _connect(path)
    conn.execute("PRAGMA query_only = ON")
    return conn, None


class _Chain:
    """The audit chain within one write transaction: reads the head at the first append, hashes on
    the writer thread, inserts entries in batches. Nothing outlives the transaction, so a rollback
    needs no undo, and entries commit exactly when the records they cover do."""

    _FLUSH_AT = 1_000  # bounds memory in a long transaction (the migration of a large store)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # (seq, hash as bytes, the same in hex): each hash is hexed once, for its own row.
        self._head: tuple[int, bytes, str] | None = None
        self._pending: list[Row] = []

    def _current(self) -> tuple[int, bytes, str]:
        if self._head is None:
            row = self._conn.execute(
                "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            seq, head = (row[0], row[1]) if row else (0, GENESIS_HASH)
            self._head = (seq, bytes.fromhex(head), head)
        return self._head

    @property
    def next_seq(self) -> int:
        return self._current()[0] + 1

    def append(self, kind: str, ref: str, payload: str) -> None:
        seq, prev, prev_hex = self._current()
        digest = _digest(prev, kind, ref, payload)
        digest_hex = digest.hex()
        self._head = (seq + 1, digest, digest_hex)
        self._pending.append((seq + 1, kind, ref, payload, prev_hex, digest_hex))
        if len(self._pending) >= self._FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        self._conn.executemany(_APPEND_AUDIT, self._pending)
        self._pending.clear()


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[_Chain]:
    # IMMEDIATE takes the write lock up front, so COMMIT cannot fail on a lock upgrade.
    conn.execute("BEGIN IMMEDIATE")
    try:
        chain = _Chain(conn)
        yield chain
        chain.flush()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# ------------------------------------------------------------ statements (worker threads)


def _all(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Row]:
    return conn.execute(sql, params).fetchall()


def _store_row(conn: sqlite3.Connection, sql: str, row: Row) -> Row | None:
    """Runs one insert or upsert of `row`; returns the row stored, None for an ignored insert (a
    resent message or session start). A None first column is an id the insert assigns."""
    cursor = conn.execute(sql, row)
    if cursor.rowcount == 0:
        return None
    return (cursor.lastrowid, *row[1:]) if row[0] is None else row


def _write(
    conn: sqlite3.Connection, chain: _Chain, table: AuditedTable, sql: str, row: Row
) -> Row | None:
    """`_store_row`, then chains what was stored."""
    stored = _store_row(conn, sql, row)
    if stored is not None:
        chain.append(table.kind, table.ref(stored), stored[-1])
    return stored


def _commit_ingest(
    conn: sqlite3.Connection, items: Sequence[IngestItem], sessions: set[str]
) -> None:
    started: set[str] = set()
    for item in items:
        if isinstance(item, Session):
            started.add(item.session_id)
        elif item.session_id not in sessions and item.session_id not in started:
            raise UnknownSessionError(item.session_id)
    # Encoded before the transaction where possible, and stored, then chained, in passes: item
    # by item, the three evict each other from the CPU caches (measured 1.5 times slower).
    # Session starts and ends go first, in their order: messages and samples need their session.
    records = [item for item in items if isinstance(item, Session | SessionEnd)]
    planned = [_session_change(item) for item in records]
    messages = [item for item in items if isinstance(item, AgentMessage)]
    telemetry = [_telemetry_block_row(block) for block in _telemetry_blocks(items)]
    with _transaction(conn) as chain:
        stored: list[tuple[AuditedTable, Row]] = []
        for item, (sql, row) in zip(records, planned, strict=True):
            if isinstance(item, SessionEnd):
                row = _ended_session_row(conn, item)
            if (written := _store_row(conn, sql, row)) is not None:
                stored.append((_SESSIONS, written))
        # A resent message is left out; which ones are new is known only here.
        for block in _message_blocks(_new_messages(conn, messages)):
            written = _store_row(conn, _INSERT_MESSAGE_BLOCK, _message_block_row(block))
            assert written is not None, "a message block is never ignored"
            stored.append((_MESSAGE_BLOCKS, written))
        for row in telemetry:
            written = _store_row(conn, _INSERT_TELEMETRY_BLOCK, row)
            assert written is not None, "a telemetry block is never ignored"
            stored.append((_TELEMETRY_BLOCKS, written))
        for table, row in stored:
            chain.append(table.kind, table.ref(row), row[-1])
    sessions.update(started)


def _session_change(item: Session | SessionEnd) -> tuple[str, Row]:
    """How a session start or end is stored (an end's row is built when stored, from the
    stored session)."""
    if isinstance(item, Session):
        return _INSERT_SESSION, _session_row(item)
    return _UPSERT_SESSION, ()


def _new_messages(
    conn: sqlite3.Connection, messages: Sequence[AgentMessage]
) -> Sequence[AgentMessage]:
    """The messages not stored before (nor earlier in the batch), as `message_indices` tells
    once their keys are added: one executemany when all are new, the usual case; otherwise
    that is undone and the keys are added one by one to learn which."""
    if not messages:
        return messages
    keys = [(message.session_id, message.index) for message in messages]
    conn.execute("SAVEPOINT messages")
    before = conn.total_changes
    conn.executemany(_INSERT_MESSAGE_INDEX, keys)
    if conn.total_changes - before < len(keys):
        conn.execute("ROLLBACK TO messages")
        messages = [
            message
            for message, key in zip(messages, keys, strict=True)
            if conn.execute(_INSERT_MESSAGE_INDEX, key).rowcount
        ]
    conn.execute("RELEASE messages")
    return messages


def _message_blocks(messages: Sequence[AgentMessage]) -> list[MessageBlock]:
    """The messages as one block per session, each in arrival order."""
    by_session: dict[str, list[MessageRow]] = {}
    for message in messages:
        by_session.setdefault(message.session_id, []).append(_message_row_of(message))
    # Built from validated messages: constructed, not validated again.
    return [
        MessageBlock.model_construct(session_id=session_id, messages=rows)
        for session_id, rows in by_session.items()
    ]


def _telemetry_blocks(items: Sequence[IngestItem]) -> list[TelemetryBlock]:
    """The batch's samples as one block per session, each in arrival order."""
    by_session: dict[str, list[tuple[str, str, float, datetime]]] = {}
    for item in items:
        if isinstance(item, TelemetrySample):
            by_session.setdefault(item.session_id, []).append(
                (item.component, item.signal, item.value, item.measured_at)
            )
    # Built from validated samples: constructed, not validated again.
    return [
        TelemetryBlock.model_construct(session_id=session_id, samples=samples)
        for session_id, samples in by_session.items()
    ]


def _ended_session_row(conn: sqlite3.Connection, end: SessionEnd) -> Row:
    session = _get_session(conn, end.session_id)
    assert session is not None, "_commit_ingest checked that the session exists"
    return _session_row(session.model_copy(update={"ended_at": end.ended_at}))


# A sample's place in time, then in arrival order: (measured_us, 0, row id, 0) for a schema-3
# row, which came before every block, and (measured_us, 1, block id, position) in a block.
_SampleKey: TypeAlias = tuple[int, int, int, int]


def _newest_readings(conn: sqlite3.Connection, session_id: str, limit: int) -> list[Reading]:
    """Reads blocks newest first and stops at the first one that holds nothing newer than the
    `limit` newest samples read so far. Records are decoded by `json.loads`, not validated:
    the store wrote them from validated samples, and `verify` checks they were not altered."""
    newest: list[tuple[_SampleKey, Reading]] = []
    for row_id, us, record in conn.execute(
        "SELECT id, measured_us, record FROM telemetry WHERE session_id = ?"
        " ORDER BY measured_us DESC, id DESC LIMIT ?",
        (session_id, limit),
    ):
        sample = json.loads(record)
        at = datetime.fromisoformat(sample["measured_at"])
        reading = Reading(sample["component"], sample["signal"], sample["value"], at)
        newest.append(((us, 0, row_id, 0), reading))
    blocks = conn.execute(
        "SELECT id, last_us, record FROM telemetry_blocks WHERE session_id = ?"
        " ORDER BY last_us DESC, id DESC",
        (session_id,),
    )
    for block_id, last_us, record in blocks:
        if len(newest) >= limit:
            newest.sort(key=itemgetter(0))
            del newest[:-limit]
            if (last_us, 1, block_id) < newest[0][0][:3]:
                break
        for position, (component, signal, value, text) in enumerate(json.loads(record)["samples"]):
            at = datetime.fromisoformat(text)
            key = (_micros(at), 1, block_id, position)
            newest.append((key, Reading(component, signal, value, at)))
    newest.sort(key=itemgetter(0))
    return [reading for _, reading in newest[-limit:]]


def _session_messages(conn: sqlite3.Connection, session_id: str) -> list[AgentMessage]:
    """The rows a schema-4 store kept, and the blocks, in index order."""
    messages = [
        AgentMessage.model_validate_json(record)
        for (record,) in conn.execute(
            "SELECT record FROM messages WHERE session_id = ?", (session_id,)
        )
    ]
    for (record,) in conn.execute(
        "SELECT record FROM message_blocks WHERE session_id = ? ORDER BY id", (session_id,)
    ):
        messages.extend(MessageBlock.model_validate_json(record).to_messages())
    messages.sort(key=attrgetter("index"))
    return messages


def _get_session(conn: sqlite3.Connection, session_id: str) -> Session | None:
    row = conn.execute("SELECT record FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return Session.model_validate_json(row[0]) if row else None


def _put_hazard_space(conn: sqlite3.Connection, space: HazardSpace) -> None:
    with _transaction(conn) as chain:
        row = _hazard_space_row(space, chain.next_seq)
        _write(conn, chain, _HAZARD_SPACES, _PUT_HAZARD_SPACE, row)


def _save_investigation(conn: sqlite3.Connection, inv: Investigation) -> None:
    with _transaction(conn) as chain:
        _write(conn, chain, _INVESTIGATIONS, _SAVE_INVESTIGATION, _investigation_row(inv))


def _confirm_outcome(
    conn: sqlite3.Connection, investigation_id: str, outcome: ConfirmedOutcome, reassess: Reassess
) -> tuple[Investigation, bool]:
    with _transaction(conn) as chain:
        row = conn.execute(
            "SELECT record FROM investigations WHERE investigation_id = ?", (investigation_id,)
        ).fetchone()
        if row is None:
            raise UnknownInvestigationError(investigation_id)
        inv = Investigation.model_validate_json(row[0])
        if inv.confirmed is not None:
            if inv.confirmed.region_ids == outcome.region_ids:
                return inv, False
            raise AlreadyConfirmedError(investigation_id, inv.confirmed)
        stored = conn.execute("SELECT record FROM reputations WHERE system = ?", (inv.system,))
        reputations = (AgentReputation.model_validate_json(record) for (record,) in stored)
        current = {r.agent_id: r for r in reputations}
        inv = inv.model_copy(update={"confirmed": outcome})
        _write(conn, chain, _INVESTIGATIONS, _SAVE_INVESTIGATION, _investigation_row(inv))
        for reputation in reassess(inv, current):
            _write(conn, chain, _REPUTATIONS, _PUT_REPUTATION, _reputation_row(reputation))
    return inv, True


def _interrupt_unfinished(conn: sqlite3.Connection, reason: str, at: datetime) -> list[str]:
    with _transaction(conn) as chain:
        rows = conn.execute(
            "SELECT record FROM investigations WHERE state IN (?, ?)"
            " ORDER BY created_us, investigation_id",
            (InvestigationState.QUEUED.value, InvestigationState.RUNNING.value),
        ).fetchall()
        interrupted = [
            Investigation.model_validate_json(record).model_copy(
                update={"state": InvestigationState.INTERRUPTED, "error": reason, "finished_at": at}
            )
            for (record,) in rows
        ]
        for inv in interrupted:
            _write(conn, chain, _INVESTIGATIONS, _SAVE_INVESTIGATION, _investigation_row(inv))
    return [inv.investigation_id for inv in interrupted]


def _append_event(conn: sqlite3.Connection, event: InvestigationEvent) -> int:
    row = _insert_for_investigation(conn, _EVENTS, _INSERT_EVENT, _event_row(event, None))
    return int(row[0])


def _record_exchange(
    conn: sqlite3.Connection, investigation_id: str, exchange: LLMExchange
) -> None:
    row = _exchange_row(exchange, investigation_id, None)
    _insert_for_investigation(conn, _EXCHANGES, _INSERT_EXCHANGE, row)


def _insert_for_investigation(
    conn: sqlite3.Connection, table: AuditedTable, sql: str, row: Row
) -> Row:
    """Inserts a row tied to an investigation; returns it with its assigned id."""
    try:
        with _transaction(conn) as chain:
            stored = _write(conn, chain, table, sql, row)
    except sqlite3.IntegrityError as exc:  # the only constraint: the investigation must exist
        raise UnknownInvestigationError(row[1]) from exc
    assert stored is not None, "a plain insert is never ignored"
    return stored


# ------------------------------------------------------------ rows and their audit entries
# Writers build rows with these; verify and the migration rebuild the expected row of a stored
# record with the same functions, so the two can never disagree on what a record determines.


def _session_row(session: Session) -> Row:
    return (session.session_id, encode_record(session))


def _message_row(message: AgentMessage) -> Row:
    """A schema-4 per-message row (verified and read, no longer written)."""
    return (message.session_id, message.index, encode_record(message))


def _message_block_row(block: MessageBlock, block_id: int | None = None) -> Row:
    return (block_id, block.session_id, encode_record(block))


def _telemetry_row(sample: TelemetrySample, sample_id: int | None = None) -> Row:
    """A schema-3 per-sample row (verified and read, no longer written)."""
    return (sample_id, sample.session_id, _micros(sample.measured_at), encode_record(sample))


def _telemetry_block_row(block: TelemetryBlock, block_id: int | None = None) -> Row:
    micros = [_micros(at) for *_, at in block.samples]
    return (block_id, block.session_id, min(micros), max(micros), encode_record(block))


def _hazard_space_row(space: HazardSpace, put_seq: int) -> Row:
    # put_seq is the seq of the space's latest entry: "latest" is then covered by the chain too.
    return (space.system, space.version, put_seq, encode_record(space))


def _investigation_row(inv: Investigation) -> Row:
    return (
        inv.investigation_id,
        inv.system,
        inv.session_id,
        inv.state.value,
        _micros(inv.created_at),
        encode_record(inv),
    )


def _reputation_row(reputation: AgentReputation) -> Row:
    return (reputation.system, reputation.agent_id, encode_record(reputation))


def _event_row(event: InvestigationEvent, event_id: int | None) -> Row:
    # The id is the row's key (and the entry's ref), not part of the record.
    return (event_id, event.investigation_id, encode_record(event, exclude={"event_id"}))


def _exchange_row(exchange: LLMExchange, investigation_id: str, exchange_id: int | None) -> Row:
    return (exchange_id, investigation_id, encode_record(exchange))


def _event_from_row(row: Row) -> InvestigationEvent:
    return InvestigationEvent.model_validate({**json.loads(row[-1]), "event_id": row[0]})


_SESSIONS = AuditedTable(
    "session",
    "sessions",
    ("session_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _session_row(Session.model_validate_json(row[-1])),
)
_MESSAGES = AuditedTable(
    "message",
    "messages",
    ("session_id", "idx", "record"),
    ref=lambda row: f"{row[0]}/{row[1]}",
    expect=lambda row, _: _message_row(AgentMessage.model_validate_json(row[-1])),
)
_MESSAGE_BLOCKS = AuditedTable(
    "message_block",
    "message_blocks",
    ("id", "session_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _message_block_row(MessageBlock.model_validate_json(row[-1]), row[0]),
)
_TELEMETRY = AuditedTable(
    "telemetry",
    "telemetry",
    ("id", "session_id", "measured_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _telemetry_row(TelemetrySample.model_validate_json(row[-1]), row[0]),
)
_TELEMETRY_BLOCKS = AuditedTable(
    "telemetry_block",
    "telemetry_blocks",
    ("id", "session_id", "first_us", "last_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _telemetry_block_row(TelemetryBlock.model_validate_json(row[-1]), row[0]),
)
_HAZARD_SPACES = AuditedTable(
    "hazard_space",
    "hazard_spaces",
    ("system", "version", "put_seq", "record"),
    # Two free-form strings: a JSON pair keeps the ref unambiguous whatever they contain.
    ref=lambda row: canonical_json([row[0], row[1]]),
    expect=lambda row, seq: _hazard_space_row(HazardSpace.model_validate_json(row[-1]), seq),
    order="put_seq",
)
_INVESTIGATIONS = AuditedTable(
    "investigation",
    "investigations",
    ("investigation_id", "system", "session_id", "state", "created_us", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _investigation_row(Investigation.model_validate_json(row[-1])),
)
_EVENTS = AuditedTable(
    "event",
    "events",
    ("event_id", "investigation_id", "record"),
    ref=lambda row: str(row[0]),
    expect=lambda row, _: _event_row(_event_from_row(row), row[0]),
)
_EXCHANGES = AuditedTable(
    "exchange",
    "exchanges",
    ("id", "investigation_id", "record"),
    # The investigation is in the ref because the exchange record does not name it.
    ref=lambda row: f"{row[1]}/{row[0]}",
    expect=lambda row, _: _exchange_row(LLMExchange.model_validate_json(row[-1]), row[1], row[0]),
)
_REPUTATIONS = AuditedTable(
    "reputation",
    "reputations",
    ("system", "agent_id", "record"),
    ref=lambda row: canonical_json([row[0], row[1]]),
    expect=lambda row, _: _reputation_row(AgentReputation.model_validate_json(row[-1])),
)
AUDITED_TABLES = (
    _SESSIONS,
    _HAZARD_SPACES,
    _INVESTIGATIONS,
    _REPUTATIONS,
    _MESSAGES,
    _MESSAGE_BLOCKS,
    _TELEMETRY,
    _TELEMETRY_BLOCKS,
    _EVENTS,
    _EXCHANGES,
)


# The audited tables schema 1 had besides sessions (reputations came with schema 3).
_V1_TABLES = (_HAZARD_SPACES, _INVESTIGATIONS, _MESSAGES, _TELEMETRY, _EVENTS, _EXCHANGES)


def _migrate_from_v1(conn: sqlite3.Connection, chain: _Chain, path: Path) -> None:
    """Chains every schema-1 row as it is now, table by table (hazard spaces in the order they
    were put, so the latest stays latest), rewriting each record into its canonical form.

    The rows are read through a second connection: it sees the committed schema-1 state, so
    the rewrites on `conn` (this transaction) cannot disturb the scans.
    """
    conn.execute("ALTER TABLE sessions ADD COLUMN record TEXT NOT NULL DEFAULT ''")
    v1_sessions = "session_id, system, started_at, ended_at, labels"
    scans = [
        (_SESSIONS, v1_sessions, _v1_session_row),
        *((t, ", ".join(t.columns), t.expect) for t in _V1_TABLES),
    ]
    with closing(connect_read_only(path)) as v1:
        for table, columns, upgrade in scans:
            update = (
                f"UPDATE {table.table} SET ({', '.join(table.columns)})"
                f" = ({', '.join('?' * len(table.columns))}) WHERE rowid = ?"
            )
            for rowid, *old in v1.execute(
                f"SELECT rowid, {columns} FROM {table.table} ORDER BY {table.order}"
            ):
                try:
                    row = upgrade(tuple(old), chain.next_seq)
                except (TypeError, ValueError) as exc:
                    raise RuntimeError(
                        f"cannot migrate {path}: {table.table} row {rowid} does not decode: {exc}"
                    ) from exc
                conn.execute(update, (*row, rowid))
                chain.append(table.kind, table.ref(row), row[-1])
    for column in ("system", "started_at", "ended_at", "labels"):
        conn.execute(f"ALTER TABLE sessions DROP COLUMN {column}")


def _v1_session_row(old: Row, _seq: int) -> Row:
    """Schema 1 kept a session in columns: (session_id, system, started_at, ended_at, labels)."""
    session_id, system, started_at, ended_at, labels = old
    session = Session(
        session_id=session_id,
        system=system,
        started_at=datetime.fromisoformat(started_at),
        ended_at=datetime.fromisoformat(ended_at) if ended_at else None,
        labels=json.loads(labels),
    )
    return _session_row(session)


# ------------------------------------------------------------ helpers


def _micros(at: datetime) -> int:
    """Integer UTC microseconds since the epoch: exact, and orders across time zones."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - _EPOCH) // _MICROSECOND


def _check_limit(limit: int) -> None:
    # SQLite reads a negative LIMIT as "no limit": refuse it rather than return everything.
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")


def _encode_page_token(created_us: int, investigation_id: str) -> str:
    raw = json.dumps([created_us, investigation_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _decode_page_token(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        key = json.loads(raw)
    except ValueError:  # covers binascii, unicode and JSON errors
        raise ValueError("invalid page token") from None
    match key:
        case [int() as created_us, str() as investigation_id] if not isinstance(created_us, bool):
            return created_us, investigation_id
        case _:
            raise ValueError("invalid page token")
