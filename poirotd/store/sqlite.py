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
keeps the datetime exactly as given. How each record is stored and checked is
`poirotd.store.records`; the audit chain every write appends to, `poirotd.store.chain`; the
tables and the migrations from older schemas, `poirotd.store.schema`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from operator import attrgetter
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from poirotd.model import (
    AccessDenial,
    AgentMessage,
    AgentReputation,
    CampaignSeed,
    CommitItem,
    ConfirmedOutcome,
    DiagnosisMemoryEntry,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    ItemKey,
    LLMExchange,
    Reading,
    Session,
    SessionEnd,
)
from poirotd.store import idempotency
from poirotd.store.chain import Chain, Row, transaction
from poirotd.store.common import (
    CLAIMABLE,
    UNFINISHED,
    NewestReadings,
    SampleKey,
    admitted,
    check_limit,
    checked_memory_update,
    coalesced,
    confirmation,
    message_blocks,
    open_of_method,
    settled,
    telemetry_blocks,
    tombstone,
    unknown_sessions,
    with_stored_coalesced,
)
from poirotd.store.faults import StoreFaults, sqlite_fault
from poirotd.store.idempotency import UNKNOWN, KeyWindow, LeftOut, StoredConflict
from poirotd.store.leases import claimed, lease_micros
from poirotd.store.parked_logs import (
    NO_PARKING,
    PARK,
    RELEASE,
    TAKE_OVER,
    ParkedLogEvent,
    Parking,
    taken_over,
)
from poirotd.store.port import (
    DEFAULT_IDEMPOTENCY_WINDOW,
    Admission,
    Admit,
    Admitted,
    Lease,
    LeaseLostError,
    MemoryUpdate,
    QueueView,
    Reassess,
    Settled,
    UnknownInvestigationError,
    UnknownSessionError,
)
from poirotd.store.reads import StoreReads
from poirotd.store.records import (
    ACCESS_DENIALS,
    CAMPAIGN_SEEDS,
    DIAGNOSIS_MEMORY,
    EVENTS,
    EXCHANGES,
    HAZARD_SPACES,
    INGEST_CONFLICTS,
    INVESTIGATIONS,
    MESSAGE_BLOCKS,
    REPUTATIONS,
    SESSIONS,
    TELEMETRY_BLOCKS,
    AuditedTable,
    MessageBlock,
    access_denial_row,
    campaign_seed_row,
    event_row,
    exchange_row,
    hazard_space_row,
    ingest_conflict_row,
    investigation_row,
    memory_row,
    message_block_row,
    micros,
    reputation_row,
    session_row,
    telemetry_block_row,
)
from poirotd.store.schema import open_reader, open_writer

_INSERT_SESSION = "INSERT OR IGNORE INTO sessions (session_id, record) VALUES (?, ?)"
_UPSERT_SESSION = (
    "INSERT INTO sessions (session_id, record) VALUES (?, ?)"
    " ON CONFLICT (session_id) DO UPDATE SET record = excluded.record"
)
_INSERT_MESSAGE_INDEX = (
    "INSERT OR IGNORE INTO message_indices (session_id, idx, digest) VALUES (?, ?, ?)"
)
_MESSAGE_DIGEST = "SELECT digest FROM message_indices WHERE session_id = ? AND idx = ?"
_INSERT_MESSAGE_BLOCK = "INSERT INTO message_blocks (id, session_id, record) VALUES (?, ?, ?)"
# The stored runs that overlap each wanted producer's (lowest, highest) seq, for all of a
# commit's producers in one statement (a JSON array of [producer, lowest, highest]): a statement
# a producer cost about 0.6 µs a key more when each OTLP span is its own producer.
# json_extract rather than ->>, which needs SQLite 3.38.
_SEEN_KEYS = (
    "SELECT k.producer, k.first_seq, k.last_seq, k.digests FROM json_each(?) AS w"
    " JOIN ingest_keys AS k ON k.producer = json_extract(w.value, '$[0]')"
    " AND k.last_seq >= json_extract(w.value, '$[1]')"
    " AND k.first_seq <= json_extract(w.value, '$[2]')"
)
_HIGHEST_PRODUCER_UP_TO = "SELECT max(producer) FROM ingest_keys WHERE producer <= ?"
_INSERT_KEYS = (
    "INSERT INTO ingest_keys (producer, last_seq, first_seq, stored_us, digests)"
    " VALUES (?, ?, ?, ?, ?)"
)
_PRUNE_KEYS = "DELETE FROM ingest_keys WHERE stored_us < ?"
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
_PUT_CAMPAIGN_SEED = """
INSERT INTO campaign_seeds (system, record) VALUES (?, ?)
ON CONFLICT (system) DO UPDATE SET record = excluded.record
"""
_PUT_MEMORY = """
INSERT INTO diagnosis_memory (system, entry_id, record) VALUES (?, ?, ?)
ON CONFLICT (system, entry_id) DO UPDATE SET record = excluded.record
"""
_INSERT_OPENING = (
    "INSERT INTO hazard_openings (session_id, at_us, investigation_id) VALUES (?, ?, ?)"
)
_INSERT_EVENT = "INSERT INTO events (event_id, investigation_id, record) VALUES (?, ?, ?)"
_INSERT_EXCHANGE = "INSERT INTO exchanges (id, investigation_id, record) VALUES (?, ?, ?)"
_INSERT_ACCESS_DENIAL = "INSERT INTO access_denials (id, record) VALUES (?, ?)"
_INSERT_CONFLICT = "INSERT INTO ingest_conflicts (id, session_id, record) VALUES (?, ?, ?)"

_P = ParamSpec("_P")
_T = TypeVar("_T")


class SqliteStore(StoreReads):
    """The store port (`poirotd.store.port.Store`) on one SQLite file.

    Create with `await SqliteStore.open(path)`; every method but `has_session` is a coroutine.
    One process uses the file (`shared` is False): leases, cooldown checks and index reservations
    keep the port's semantics with the writer thread as their only lock and this process's clock.
    `synchronous="NORMAL"` keeps commits safe from a crash of the daemon but not from power loss.
    Opening a schema-1 database migrates it: its rows as they are become the first entries of the
    chain (the chain starts at migration; earlier versions of a record are not recoverable).
    """

    def __init__(
        self,
        writer: _Worker,
        reader: _Worker,
        sessions: set[str],
        idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW,
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._keys = KeyWindow(idempotency_window)
        # Mutated only by the writer thread, after COMMIT; read on the loop (atomic under the GIL).
        self._sessions = sessions
        self._closing: asyncio.Task[None] | None = None
        self.shared = False
        self.faults = StoreFaults()
        # The next daemon-assigned index per session (`reserve_message_indexes`).
        self._reserved: dict[str, int] = {}

    @classmethod
    async def open(
        cls,
        path: Path | str,
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW,
    ) -> SqliteStore:
        """`idempotency_window`: seconds an ingest item's key is kept after its commit."""
        KeyWindow(idempotency_window)  # refuses a window that is not positive
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        writer = _Worker("poirotd-store-writer")
        reader = _Worker("poirotd-store-reader")
        try:
            sessions = await writer.start(partial(open_writer, Path(path), synchronous))
            await reader.start(partial(open_reader, Path(path)))
        except BaseException:
            await reader.stop()
            await writer.stop()
            raise
        return cls(writer, reader, sessions, idempotency_window)

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
        return await self._run(self._writer, True, lambda conn: fn(conn, *a, **k))

    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._read(_all, sql, params)

    async def _read(
        self, fn: Callable[Concatenate[sqlite3.Connection, _P], _T], *a: _P.args, **k: _P.kwargs
    ) -> _T:
        self._check_open()
        return await self._run(self._reader, False, lambda conn: fn(conn, *a, **k))

    async def _run(
        self, worker: _Worker, writing: bool, call: Callable[[sqlite3.Connection], _T]
    ) -> _T:
        """`call` on the worker's connection; a full disk or an I/O error is StoreUnreachable."""
        try:
            result = await worker.run(call)
        except sqlite3.Error as exc:
            kind = sqlite_fault(exc)
            if kind is None:
                raise
            raise self.faults.unreachable(kind, exc, writing=writing) from exc
        self.faults.succeeded(writing=writing)
        return result

    # ------------------------------------------------------------ ingest

    async def commit_ingest(
        self,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> LeftOut:
        """Stores the batch and the parking changes in one transaction and returns after COMMIT
        (the ack point), with what it left out: copies of items already stored, and conflicts
        it set aside."""
        return await self._write(_commit_ingest, items, keys, parking, self._sessions, self._keys)

    async def take_over_parked_log_events(
        self, owner: str, owned_before_us: int, now_us: int
    ) -> list[ParkedLogEvent]:
        return await self._write(_take_over_parked, owner, owned_before_us, now_us)

    def has_session(self, session_id: str) -> bool:
        self._check_open()
        return session_id in self._sessions

    async def find_session(self, session_id: str) -> bool:
        """`has_session`: one daemon writes the file, so its memory has every session."""
        return self.has_session(session_id)

    async def session_messages(self, session_id: str) -> list[AgentMessage]:
        """The session's messages in index order."""
        return await self._read(_session_messages, session_id)

    async def reserve_message_indexes(self, session_id: str, count: int, *, floor: int = 0) -> int:
        """Counted in memory (one process), past the session's highest stored index, read from
        the committed state on each call."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        stored = await self._read(_next_stored_index, session_id)
        first = max(self._reserved.get(session_id, 0), stored, floor)
        self._reserved[session_id] = first + count
        return first

    async def newest_readings(self, session_id: str, *, limit: int = 10_000) -> list[Reading]:
        """The session's newest `limit` samples, oldest first (ties in time keep arrival order)."""
        check_limit(limit)
        return await self._read(_newest_readings, session_id, limit)

    # ------------------------------------------------------------ hazard spaces

    async def put_hazard_space(self, space: HazardSpace) -> None:
        """Upsert; the space put last (even an older version put again) becomes the latest."""
        await self._write(_put_hazard_space, space)

    # ------------------------------------------------------------ investigations

    async def save_investigation(self, inv: Investigation, *, lease: Lease | None = None) -> None:
        await self._write(_save_investigation, inv, lease)

    async def finish_investigation(
        self, inv: Investigation, event: InvestigationEvent, *, lease: Lease | None = None
    ) -> InvestigationEvent:
        event_id = await self._write(_finish_investigation, inv, event, lease)
        return event.model_copy(update={"event_id": event_id})

    async def admit_investigation(
        self, inv: Investigation, admit: Admit, *, cooldown: timedelta | None = None
    ) -> Admitted:
        return await self._write(_admit_investigation, inv, admit, cooldown)

    async def queue_deferred(self, capacity: int) -> list[Investigation]:
        return await self._write(_queue_deferred, capacity)

    async def claim_investigation(
        self, owner: str, lease_seconds: float
    ) -> tuple[Investigation, Lease] | None:
        return await self._write(_claim_investigation, owner, _lease_end(lease_seconds))

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> bool:
        return await self._write(_renew_lease, lease, _lease_end(lease_seconds))

    async def hand_back_lease(self, lease: Lease) -> None:
        await self._write(_renew_lease, lease, 0)  # before any reading of the monotonic clock

    def change_mark(self) -> int:
        return 0  # one process: no other writes to be told of

    async def wait_for_change(self, since: int) -> None:
        await asyncio.Event().wait()  # never: no other process writes this store

    async def settle_unfinished(self, reason: str, at: datetime) -> Settled:
        """As the port says, in one transaction, oldest first; emitting the matching events is
        the caller's job."""
        return await self._write(_settle_unfinished, reason, at)

    # ------------------------------------------------------------ confirmed outcomes

    async def confirm_outcome(
        self,
        investigation_id: str,
        outcome: ConfirmedOutcome,
        reassess: Reassess,
        *,
        supersede: bool = False,
    ) -> tuple[Investigation, bool]:
        """Records the investigation's true cause and the reputations `reassess` derives from the
        system's whole confirmed history, in one transaction on the writer thread, so two
        confirmations never read the same history. Idempotent: confirming the same regions again
        changes nothing and returns (record, False); other regions raise AlreadyConfirmedError
        unless `supersede`, which keeps the replaced outcome in the record's `superseded` (and
        its earlier version in the chain). Returns (record, True) when this call changed it."""
        return await self._write(_confirm_outcome, investigation_id, outcome, reassess, supersede)

    async def put_campaign_seed(self, seed: CampaignSeed) -> None:
        await self._write(_put_campaign_seed, seed)

    # ------------------------------------------------------------ ErrorProbe's memory

    async def update_memory_entry(
        self, system: str, entry_id: str, update: MemoryUpdate
    ) -> DiagnosisMemoryEntry | None:
        """Reads the entry, stores what `update` makes of it, in one transaction on the writer
        thread; returns the entry stored (None: `update` left it)."""
        return await self._write(_update_memory_entry, system, entry_id, update)

    async def delete_memory_entry(
        self, system: str, entry_id: str, at: datetime
    ) -> DiagnosisMemoryEntry | None:
        """A tombstone: the entry marked deleted at `at` (once; a second delete changes
        nothing), never retrieved again; None when there is no such entry."""
        stored = await self.update_memory_entry(system, entry_id, tombstone(at))
        return stored or await self._memory_entry(system, entry_id)

    # ------------------------------------------------------------ investigation events

    async def append_event(
        self, event: InvestigationEvent, *, lease: Lease | None = None
    ) -> InvestigationEvent:
        """Stores the event under the next global id (the incoming one is ignored)."""
        event_id = await self._write(_append_event, event, lease)
        return event.model_copy(update={"event_id": event_id})

    # ------------------------------------------------------------ LLM exchange audit

    async def record_exchange(
        self, investigation_id: str, exchange: LLMExchange, *, lease: Lease | None = None
    ) -> None:
        await self._write(_record_exchange, investigation_id, exchange, lease)

    # ------------------------------------------------------------ the audit chain

    async def record_access_denial(self, denial: AccessDenial) -> None:
        await self._write(_record_access_denial, denial)


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
    conn: sqlite3.Connection, chain: Chain, table: AuditedTable, sql: str, row: Row
) -> Row | None:
    """`_store_row`, then chains what was stored."""
    stored = _store_row(conn, sql, row)
    if stored is not None:
        chain.append(table.kind, table.ref(stored), stored[-1])
    return stored


def _commit_ingest(
    conn: sqlite3.Connection,
    items: Sequence[CommitItem],
    keys: Sequence[ItemKey | None],
    parking: Parking,
    sessions: set[str],
    window: KeyWindow,
) -> LeftOut:
    if unknown := unknown_sessions(items, sessions.__contains__):
        raise UnknownSessionError(unknown[0])
    started = {item.session_id for item in items if isinstance(item, Session)}
    with transaction(conn) as chain:
        # Copies of keyed items already stored are left out, and conflicts set aside; which
        # ones is known only here.
        kept = _drop_seen_keys(conn, items, keys, window)
        items = kept.items
        # Encoded, stored, then chained, in passes: item by item, the three evict each other
        # from the CPU caches (measured 1.5 times slower). Session starts and ends go first, in
        # their order: messages and samples need their session.
        records = [item for item in items if isinstance(item, Session | SessionEnd)]
        planned = [_session_change(item) for item in records]
        messages = [
            (position, item)
            for position, item in zip(kept.positions, items, strict=True)
            if isinstance(item, AgentMessage)
        ]
        telemetry = [telemetry_block_row(block) for block in telemetry_blocks(items)]
        stored: list[tuple[AuditedTable, Row]] = []
        for item, (sql, row) in zip(records, planned, strict=True):
            if isinstance(item, SessionEnd):
                row = _ended_session_row(conn, item)
            if (written := _store_row(conn, sql, row)) is not None:
                stored.append((SESSIONS, written))
        # A resent message is left out, one whose index other content holds set aside; which
        # ones is known only here.
        for block in message_blocks(_new_messages(conn, kept, messages, keys)):
            written = _store_row(conn, _INSERT_MESSAGE_BLOCK, message_block_row(block))
            assert written is not None, "a message block is never ignored"
            stored.append((MESSAGE_BLOCKS, written))
        for row in telemetry:
            written = _store_row(conn, _INSERT_TELEMETRY_BLOCK, row)
            assert written is not None, "a telemetry block is never ignored"
            stored.append((TELEMETRY_BLOCKS, written))
        conflicts = _store_conflicts(conn, kept.conflicts, stored)
        for table, row in stored:
            chain.append(table.kind, table.ref(row), row[-1])
        conn.executemany(PARK, parking.park_rows())
        conn.executemany(RELEASE, parking.release)
    sessions.update(started)
    return LeftOut(kept.duplicates, conflicts)


def _take_over_parked(
    conn: sqlite3.Connection, owner: str, owned_before_us: int, now_us: int
) -> list[ParkedLogEvent]:
    with transaction(conn):
        gone = conn.execute(TAKE_OVER, (owner, owned_before_us)).fetchall()
        found, parking = taken_over(owner, now_us, gone)
        conn.executemany(PARK, parking.park_rows())
    return found


def _drop_seen_keys(
    conn: sqlite3.Connection,
    items: Sequence[CommitItem],
    keys: Sequence[ItemKey | None],
    window: KeyWindow,
) -> idempotency.Kept:
    """The batch without copies of keyed items already stored, and conflicts set aside;
    records the new keys."""
    by_producer = idempotency.wanted(items, keys)
    if not by_producer:
        return idempotency.kept_all(items)
    kept = idempotency.drop_seen(items, keys, _stored_keys(conn, by_producer), by_producer)
    now_us = micros(datetime.now(UTC))
    conn.executemany(_INSERT_KEYS, idempotency.key_rows(kept, now_us))
    if (before := window.prune_before(now_us)) is not None:
        conn.execute(_PRUNE_KEYS, (before,))
    return kept


def _stored_keys(
    conn: sqlite3.Connection, by_producer: dict[str, set[int]]
) -> dict[ItemKey, bytes]:
    """The wanted keys the table holds, with their digests. Only producers up to the highest
    stored one that is not above the batch's highest can be stored: OTLP's time-led producers
    of new spans sort above every stored one, and are not looked up (one seek a commit instead
    of one a span)."""
    (highest,) = conn.execute(_HIGHEST_PRODUCER_UP_TO, (max(by_producer),)).fetchone()
    if highest is None:
        return {}
    bounds = [(p, min(seqs), max(seqs)) for p, seqs in by_producer.items() if p <= highest]
    if not bounds:
        return {}
    return idempotency.seen_in(conn.execute(_SEEN_KEYS, (json.dumps(bounds),)), by_producer)


def _store_conflicts(
    conn: sqlite3.Connection,
    conflicts: Sequence[idempotency.Conflict],
    stored: list[tuple[AuditedTable, Row]],
) -> tuple[StoredConflict, ...]:
    """Stores each conflict's record (added to `stored`, to be chained)."""
    at = datetime.now(UTC)
    kept: list[StoredConflict] = []
    for conflict in conflicts:
        record = idempotency.conflict_record(conflict, at)
        row = _store_row(conn, _INSERT_CONFLICT, ingest_conflict_row(record, None))
        assert row is not None, "a plain insert is never ignored"
        stored.append((INGEST_CONFLICTS, row))
        kept.append(StoredConflict(conflict.position, int(row[0]), record))
    return tuple(kept)


def _session_change(item: Session | SessionEnd) -> tuple[str, Row]:
    """How a session start or end is stored (an end's row is built when stored, from the
    stored session)."""
    if isinstance(item, Session):
        return _INSERT_SESSION, session_row(item)
    return _UPSERT_SESSION, ()


def _new_messages(
    conn: sqlite3.Connection,
    kept: idempotency.Kept,
    messages: Sequence[tuple[int, AgentMessage]],
    keys: Sequence[ItemKey | None],
) -> list[AgentMessage]:
    """The (position, message)s whose (session, index) was not stored before (nor earlier in
    the batch), as `message_indices` tells once they are added with their digests: one
    executemany when all are new, the usual case; otherwise that is undone and they are added
    one by one, and each that is not new is a copy or a conflict (`index_outcome`)."""
    if not messages:
        return []
    digests = idempotency.message_digests((m for _, m in messages), kept.digests)
    rows = [(m.session_id, m.index, d) for (_, m), d in zip(messages, digests, strict=True)]
    conn.execute("SAVEPOINT messages")
    before = conn.total_changes
    conn.executemany(_INSERT_MESSAGE_INDEX, rows)
    if conn.total_changes - before == len(rows):
        conn.execute("RELEASE messages")
        return [message for _, message in messages]
    conn.execute("ROLLBACK TO messages")
    fresh: list[AgentMessage] = []
    for (position, message), row in zip(messages, rows, strict=True):
        if conn.execute(_INSERT_MESSAGE_INDEX, row).rowcount:
            fresh.append(message)
            continue
        (held,) = conn.execute(_MESSAGE_DIGEST, row[:2]).fetchone()
        idempotency.index_outcome(kept, position, message, row[2], held or UNKNOWN, keys)
    conn.execute("RELEASE messages")
    return fresh


def _ended_session_row(conn: sqlite3.Connection, end: SessionEnd) -> Row:
    session = _get_session(conn, end.session_id)
    assert session is not None, "_commit_ingest checked that the session exists"
    return session_row(session.model_copy(update={"ended_at": end.ended_at}))


def _newest_readings(conn: sqlite3.Connection, session_id: str, limit: int) -> list[Reading]:
    """The rows a schema-3 store kept, then the blocks newest first."""
    older: list[tuple[SampleKey, Reading]] = []
    for row_id, us, record in conn.execute(
        "SELECT id, measured_us, record FROM telemetry WHERE session_id = ?"
        " ORDER BY measured_us DESC, id DESC LIMIT ?",
        (session_id, limit),
    ):
        sample = json.loads(record)
        at = datetime.fromisoformat(sample["measured_at"])
        reading = Reading(sample["component"], sample["signal"], sample["value"], at)
        older.append(((us, 0, row_id, 0), reading))
    newest = NewestReadings(limit, older)
    for block_id, last_us, record in conn.execute(
        "SELECT id, last_us, record FROM telemetry_blocks WHERE session_id = ?"
        " ORDER BY last_us DESC, id DESC",
        (session_id,),
    ):
        if not newest.wants(block_id, last_us):
            break
        newest.add(block_id, record)
    return newest.oldest_first()


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
    with transaction(conn) as chain:
        row = hazard_space_row(space, chain.next_seq)
        _write(conn, chain, HAZARD_SPACES, _PUT_HAZARD_SPACE, row)


def _save_investigation(
    conn: sqlite3.Connection, inv: Investigation, lease: Lease | None = None
) -> None:
    with transaction(conn) as chain:
        inv = _leased_record(conn, inv, lease)
        _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))


def _finish_investigation(
    conn: sqlite3.Connection, inv: Investigation, event: InvestigationEvent, lease: Lease | None
) -> int:
    with transaction(conn) as chain:
        inv = _leased_record(conn, inv, lease)
        _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
        stored = _write(conn, chain, EVENTS, _INSERT_EVENT, event_row(event, None))
    assert stored is not None, "a plain insert is never ignored"
    return int(stored[0])


def _check_lease(conn: sqlite3.Connection, lease: Lease | None) -> None:
    """Within a write transaction: the lease is still the investigation's current one."""
    if lease is None:
        return
    row = conn.execute(
        "SELECT lease_owner, lease_token FROM investigations WHERE investigation_id = ?",
        (lease.investigation_id,),
    ).fetchone()
    if row is None or tuple(row) != (lease.owner, lease.token):
        raise LeaseLostError(lease)


def _leased_record(
    conn: sqlite3.Connection, inv: Investigation, lease: Lease | None
) -> Investigation:
    """Within a write transaction: a run's copy of the record, checked against its lease, with
    the triggers coalesced into the stored record since the claim. Without a lease, `inv`."""
    if lease is None:
        return inv
    row = conn.execute(
        "SELECT lease_owner, lease_token, json_extract(record, '$.coalesced'),"
        " json_extract(record, '$.coalesced_omitted') FROM investigations"
        " WHERE investigation_id = ?",
        (lease.investigation_id,),
    ).fetchone()
    if row is None or tuple(row[:2]) != (lease.owner, lease.token):
        raise LeaseLostError(lease)
    return with_stored_coalesced(inv, row[2], row[3])


def _admit_investigation(
    conn: sqlite3.Connection, inv: Investigation, admit: Admit, cooldown: timedelta | None
) -> Admitted:
    with transaction(conn) as chain:
        view = _queue_view(conn, inv, cooldown)
        admission = admit(view)
        if admission is Admission.COALESCED:
            assert view.open is not None, "only an open investigation is joined"
            inv = coalesced(view.open, inv)
        else:
            inv = admitted(inv, admission)
            if inv.trigger is not None and cooldown is not None:
                at = micros(inv.trigger.at)
                conn.execute(_INSERT_OPENING, (inv.session_id, at, inv.investigation_id))
        _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
    return Admitted(admission, inv)


def _queue_view(
    conn: sqlite3.Connection, inv: Investigation, cooldown: timedelta | None
) -> QueueView:
    queued, deferred, by_requester = conn.execute(
        "SELECT coalesce(sum(state = ?), 0), coalesce(sum(state = ?), 0),"
        " coalesce(sum(state = ? AND json_extract(record, '$.requested_by') = ?), 0)"
        " FROM investigations WHERE state IN (?, ?)",
        (_QUEUED, _DEFERRED, _QUEUED, inv.requested_by or None, _QUEUED, _DEFERRED),
    ).fetchone()
    return QueueView(
        queued=queued,
        deferred=deferred,
        queued_by_requester=by_requester,
        open=_open_investigation(conn, inv, cooldown),
    )


def _open_investigation(
    conn: sqlite3.Connection, inv: Investigation, cooldown: timedelta | None
) -> Investigation | None:
    """`QueueView.open`."""
    unfinished = conn.execute(
        "SELECT record FROM investigations WHERE session_id = ? AND state IN (?, ?, ?)"
        " ORDER BY created_us, investigation_id",
        (inv.session_id, *UNFINISHED),
    )
    records = (Investigation.model_validate_json(record) for (record,) in unfinished)
    if (found := open_of_method(records, inv.method)) is not None:
        return found
    if inv.trigger is None or cooldown is None:
        return None
    at, span = micros(inv.trigger.at), cooldown // timedelta(microseconds=1)
    row = conn.execute(
        "SELECT i.record FROM hazard_openings AS h JOIN investigations AS i"
        " ON i.investigation_id = h.investigation_id"
        " WHERE h.session_id = ? AND h.at_us > ? AND h.at_us < ? ORDER BY h.at_us LIMIT 1",
        (inv.session_id, at - span, at + span),
    ).fetchone()
    return Investigation.model_validate_json(row[0]) if row else None


def _queue_deferred(conn: sqlite3.Connection, capacity: int) -> list[Investigation]:
    with transaction(conn) as chain:
        ((queued,),) = conn.execute(
            "SELECT count(*) FROM investigations WHERE state = ?", (_QUEUED,)
        ).fetchall()
        rows = conn.execute(
            "SELECT record FROM investigations WHERE state = ?"
            " ORDER BY created_us, investigation_id LIMIT ?",
            (_DEFERRED, max(capacity - queued, 0)),
        ).fetchall()
        waiting = [Investigation.model_validate_json(record) for (record,) in rows]
        done = [admitted(inv, Admission.QUEUED) for inv in waiting]
        for inv in done:
            _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
    return done


def _claim_investigation(
    conn: sqlite3.Connection, owner: str, until_us: int
) -> tuple[Investigation, Lease] | None:
    now_us = _clock_us()
    with transaction(conn) as chain:
        row = conn.execute(
            "SELECT record, lease_owner, lease_token FROM investigations"
            " WHERE state IN (?, ?) AND (lease_until_us IS NULL OR lease_until_us < ?)"
            " ORDER BY state = ?, created_us, investigation_id LIMIT 1",
            (*CLAIMABLE, now_us, _RUNNING),
        ).fetchone()
        if row is None:
            return None
        inv, lease = claimed(Investigation.model_validate_json(row[0]), owner, row[1], row[2])
        conn.execute(
            "UPDATE investigations SET lease_owner = ?, lease_until_us = ?, lease_token = ?"
            " WHERE investigation_id = ?",
            (owner, until_us, lease.token, inv.investigation_id),
        )
        if lease.taken_over_from:
            _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
    return inv, lease


def _renew_lease(conn: sqlite3.Connection, lease: Lease, until_us: int) -> bool:
    with transaction(conn):
        cursor = conn.execute(
            "UPDATE investigations SET lease_until_us = ?"
            " WHERE investigation_id = ? AND lease_owner = ? AND lease_token = ?",
            (until_us, lease.investigation_id, lease.owner, lease.token),
        )
    return cursor.rowcount == 1


def _confirm_outcome(
    conn: sqlite3.Connection,
    investigation_id: str,
    outcome: ConfirmedOutcome,
    reassess: Reassess,
    supersede: bool,
) -> tuple[Investigation, bool]:
    with transaction(conn) as chain:
        row = conn.execute(
            "SELECT record FROM investigations WHERE investigation_id = ?", (investigation_id,)
        ).fetchone()
        if row is None:
            raise UnknownInvestigationError(investigation_id)
        stored = Investigation.model_validate_json(row[0])
        if (inv := confirmation(stored, outcome, supersede)) is None:
            return stored, False
        _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
        for reputation in reassess(
            [*_confirmed_history(conn, inv), inv], _reputations(conn, inv.system)
        ):
            _write(conn, chain, REPUTATIONS, _PUT_REPUTATION, reputation_row(reputation))
    return inv, True


def _put_campaign_seed(conn: sqlite3.Connection, seed: CampaignSeed) -> None:
    with transaction(conn) as chain:
        _write(conn, chain, CAMPAIGN_SEEDS, _PUT_CAMPAIGN_SEED, campaign_seed_row(seed))


def _memory_entry(
    conn: sqlite3.Connection, system: str, entry_id: str
) -> DiagnosisMemoryEntry | None:
    row = conn.execute(
        "SELECT record FROM diagnosis_memory WHERE system = ? AND entry_id = ?",
        (system, entry_id),
    ).fetchone()
    return DiagnosisMemoryEntry.model_validate_json(row[0]) if row else None


def _update_memory_entry(
    conn: sqlite3.Connection, system: str, entry_id: str, update: MemoryUpdate
) -> DiagnosisMemoryEntry | None:
    with transaction(conn) as chain:
        entry = update(_memory_entry(conn, system, entry_id))
        entry = checked_memory_update(system, entry_id, entry)
        if entry is None:
            return None
        _write(conn, chain, DIAGNOSIS_MEMORY, _PUT_MEMORY, memory_row(entry))
    return entry


def _confirmed_history(conn: sqlite3.Connection, inv: Investigation) -> list[Investigation]:
    """The other confirmed investigations of `inv`'s system."""
    rows = conn.execute(
        "SELECT record FROM investigations WHERE system = ? AND investigation_id != ?"
        " AND json_type(record, '$.confirmed') = 'object'",
        (inv.system, inv.investigation_id),
    )
    return [Investigation.model_validate_json(record) for (record,) in rows]


def _reputations(conn: sqlite3.Connection, system: str) -> dict[str, AgentReputation]:
    rows = conn.execute("SELECT record FROM reputations WHERE system = ?", (system,))
    reputations = (AgentReputation.model_validate_json(record) for (record,) in rows)
    return {r.agent_id: r for r in reputations}


def _settle_unfinished(conn: sqlite3.Connection, reason: str, at: datetime) -> Settled:
    with transaction(conn) as chain:
        rows = conn.execute(
            "SELECT record FROM investigations WHERE state IN (?, ?)"
            " ORDER BY created_us, investigation_id",
            CLAIMABLE,
        ).fetchall()
        result = Settled([], [])
        for (record,) in rows:
            before = Investigation.model_validate_json(record)
            inv = settled(before, reason, at)
            if inv != before:
                _write(conn, chain, INVESTIGATIONS, _SAVE_INVESTIGATION, investigation_row(inv))
            if inv.state is InvestigationState.QUEUED:
                # No lease from this boot's clock: claimable at once by the next worker.
                conn.execute(
                    "UPDATE investigations SET lease_owner = NULL, lease_until_us = NULL"
                    " WHERE investigation_id = ?",
                    (inv.investigation_id,),
                )
                result.requeued.append(inv.investigation_id)
            else:
                result.interrupted.append(inv.investigation_id)
    return result


def _append_event(conn: sqlite3.Connection, event: InvestigationEvent, lease: Lease | None) -> int:
    row = _insert_for_investigation(conn, EVENTS, _INSERT_EVENT, event_row(event, None), lease)
    return int(row[0])


def _record_exchange(
    conn: sqlite3.Connection, investigation_id: str, exchange: LLMExchange, lease: Lease | None
) -> None:
    row = exchange_row(exchange, investigation_id, None)
    _insert_for_investigation(conn, EXCHANGES, _INSERT_EXCHANGE, row, lease)


def _record_access_denial(conn: sqlite3.Connection, denial: AccessDenial) -> None:
    with transaction(conn) as chain:
        _write(conn, chain, ACCESS_DENIALS, _INSERT_ACCESS_DENIAL, access_denial_row(denial, None))


def _insert_for_investigation(
    conn: sqlite3.Connection, table: AuditedTable, sql: str, row: Row, lease: Lease | None
) -> Row:
    """Inserts a row tied to an investigation (fenced by `lease`); returns it with its id."""
    try:
        with transaction(conn) as chain:
            _check_lease(conn, lease)
            stored = _write(conn, chain, table, sql, row)
    except sqlite3.IntegrityError as exc:  # the only constraint: the investigation must exist
        raise UnknownInvestigationError(row[1]) from exc
    assert stored is not None, "a plain insert is never ignored"
    return stored


# ------------------------------------------------------------ helpers

_DEFERRED = InvestigationState.DEFERRED.value
_QUEUED = InvestigationState.QUEUED.value
_RUNNING = InvestigationState.RUNNING.value


def _clock_us() -> int:
    """Leases' clock: monotonic, as one process holds them all (a wall-clock step must not end
    a run's lease). Its values do not outlive the boot, nor need to: a daemon starting on its
    file settles every unfinished investigation, leases cleared, before any claim."""
    return time.monotonic_ns() // 1000


def _lease_end(lease_seconds: float) -> int:
    return _clock_us() + lease_micros(lease_seconds)


def _next_stored_index(conn: sqlite3.Connection, session_id: str) -> int:
    row = conn.execute(
        "SELECT max(idx) FROM message_indices WHERE session_id = ?", (session_id,)
    ).fetchone()
    return 0 if row[0] is None else int(row[0]) + 1
