"""The store port on PostgreSQL, for several daemons over one database (`POIROTD_DB_URL`).

Driver: psycopg 3, measured against asyncpg on this store's commit (bench/pg_drivers.py: a
durable batch of 512 message keys, its block and its chain entry per transaction, alternating
rounds on one server): asyncpg committed 1.06 times as many messages a second once psycopg sends
a transaction's statements in pipeline mode, within this machine's noise. psycopg was chosen for
what the measurement does not show: one driver gives the daemon its async connections and
`poirotd audit` its sync ones over the same queries, and it is libpq, so every libpq connection
setting works as documented (PGPASSFILE and ~/.pgpass, PGSERVICE, sslmode and client
certificates, target_session_attrs for a failover pair).

Connections: one for writes, one for reads, as the SQLite adapter has threads; reads autocommit,
each a snapshot of what was committed. Writes are serialised in submission order within the
process (an asyncio lock, FIFO) and across processes by a transaction-level advisory lock every
write transaction takes first (`pg_schema.CHAIN_LOCK`), before it reads the chain's head: the
chain is one total order however many daemons write, and ids assigned under the lock (event ids)
commit in the order they are assigned, so a Watch that reads "after N" never misses an id that
commits later. A transaction's statements go in pipeline mode: those whose results are not needed
yet share a round trip.

Replicas: every write transaction holds the chain's lock, so claiming an investigation, checking a
lease before a fenced write, admitting an investigation (the queue's counts, the session's open
investigation and the hazard cooldown it is decided on) and queueing a deferred one are
serialised across daemons by the same lock (no row lock or SKIP LOCKED is needed on top); a claim
or a queueing of deferred ones first asks the read connection whether there is anything to take,
so idle replicas polling for work take no lock. Leases are timed by the server's clock
(`clock_timestamp()`), one clock for every replica. Message indexes are reserved by one upsert
of `message_counters` (its row lock serialises two replicas' reservations).

A connection the server dropped (a restart, a failover, an idle timeout) is replaced by a new one
at the next call: an idle write connection the server ended is found so before a write is sent
on it; a write that met the loss fails (its items are not acknowledged, so their producers send
them again); a read is tried once more on the new connection.

Sessions: `has_session` answers from memory (the sessions this process committed or found);
`find_session` asks the database on a miss, and `commit_ingest` looks up in its transaction
every session its memory lacks, so a session another daemon started is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, TypeAlias

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

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
from poirotd.store.chain import APPEND_AUDIT, GENESIS_HASH, Links, Row
from poirotd.store.common import (
    CLAIMABLE,
    UNFINISHED,
    NewestReadings,
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
from poirotd.store.faults import StoreFaults, postgres_fault
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
from poirotd.store.pg_changes import NOTIFY, ChangeListener
from poirotd.store.pg_schema import CHAIN_LOCK, migrate
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

# libpq settings of the daemon's connections, unless the URL sets them: a server or a network
# path that died silently is noticed within about a minute (idle, or with data unacknowledged)
# rather than when the kernel gives up, hours later, with the chain lock's waiters behind it.
CONNECTION_DEFAULTS: dict[str, object] = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
# A daemon that stalls inside a transaction (stopped, or its loop blocked) holds the chain lock
# every other replica's writes wait for: the server ends such a session after this long. The
# daemon's own transactions are a few statements sent back to back.
_IDLE_IN_TRANSACTION = b"SET idle_in_transaction_session_timeout = '60s'"

Connection: TypeAlias = psycopg.AsyncConnection[tuple[Any, ...]]
Cursor: TypeAlias = psycopg.AsyncCursor[tuple[Any, ...]]

_HEAD = b"SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
_APPEND_AUDIT = APPEND_AUDIT.replace("?", "%s").encode()
_LOCK_CHAIN = b"SELECT pg_advisory_xact_lock(%s)"
_FIND_SESSIONS = b"SELECT session_id FROM sessions WHERE session_id = ANY(%s)"
_INSERT_SESSION = (
    b"INSERT INTO sessions (session_id, record) VALUES (%s, %s)"
    b" ON CONFLICT DO NOTHING RETURNING session_id"
)
# The keys of a batch's messages that were not stored before: the others are resends.
_NEW_MESSAGE_KEYS = (
    b"INSERT INTO message_indices (session_id, idx, digest)"
    b" SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[])"
    b" ON CONFLICT DO NOTHING RETURNING session_id, idx"
)
# The digests stored with the (session, index)es a batch met stored.
_MESSAGE_DIGESTS = (
    b"SELECT i.session_id, i.idx, i.digest"
    b" FROM unnest(%s::text[], %s::bigint[]) AS w (session_id, idx)"
    b" JOIN message_indices AS i ON i.session_id = w.session_id AND i.idx = w.idx"
)
# The server's clock in microseconds: leases are timed by it, the same for every replica.
_NOW_US = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
_CLAIMABLE = (
    " FROM investigations WHERE state = ANY(%s)"
    f" AND (lease_until_us IS NULL OR lease_until_us < {_NOW_US})"
)
_RESERVE_INDEXES = (
    b"INSERT INTO message_counters AS c (session_id, next_idx)"
    b" SELECT %(s)s, greatest(%(floor)s, coalesce(max(idx) + 1, 0)) + %(n)s"
    b" FROM message_indices WHERE session_id = %(s)s"
    b" ON CONFLICT (session_id) DO UPDATE SET next_idx = greatest(c.next_idx + %(n)s,"
    b" excluded.next_idx) RETURNING next_idx - %(n)s"
)
# The stored runs of idempotency keys that overlap each producer's (lowest, highest) seq: per
# producer a range scan of the primary key from its lowest seq on (LATERAL: a plain join may be
# planned as a scan of the whole table, which grows with the window).
_SEEN_KEYS = (
    b"SELECT w.producer, k.first_seq, k.last_seq, k.digests"
    b" FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS w (producer, low, high)"
    b" CROSS JOIN LATERAL (SELECT first_seq, last_seq, digests FROM ingest_keys"
    b" WHERE producer = w.producer AND last_seq >= w.low AND first_seq <= w.high) AS k"
)
# A commit's new runs in one statement (a share group's scattered keys are a run each).
_INSERT_KEYS = (
    b"INSERT INTO ingest_keys (producer, last_seq, first_seq, stored_us, digests)"
    b" SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::bytea[])"
)
_PRUNE_KEYS = b"DELETE FROM ingest_keys WHERE stored_us < %s"
# Blocks are read newest first, this many at a time, until the newest samples are known.
_BLOCKS_PER_READ = 32


def sql(text: str) -> bytes:
    """A statement built from this module's constants (table and column names, never input),
    as psycopg takes a query that is not a literal."""
    return text.encode()


@cache
def _placeholders(query: str) -> bytes:
    """A read of `StoreReads` (`?` placeholders) as psycopg takes it."""
    return sql(query.replace("?", "%s"))


@cache
def _upsert(table: AuditedTable, keys: int) -> bytes:
    """Inserts a row of `table`, or replaces the one with the same first `keys` columns."""
    columns = table.columns
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[keys:])
    return sql(
        f"INSERT INTO {table.table} ({', '.join(columns)})"
        f" VALUES ({', '.join(['%s'] * len(columns))})"
        f" ON CONFLICT ({', '.join(columns[:keys])}) DO UPDATE SET {updates}"
    )


@cache
def _insert_with_id(table: AuditedTable) -> bytes:
    """Inserts a row of `table` whose first column, its id, the database assigns."""
    columns = table.columns[1:]
    return sql(
        f"INSERT INTO {table.table} ({', '.join(columns)})"
        f" VALUES ({', '.join(['%s'] * len(columns))}) RETURNING {table.columns[0]}"
    )


class PostgresStore(StoreReads):
    """The store port (`poirotd.store.port.Store`) on one PostgreSQL database.

    Create with `await PostgresStore.open(url)`; every method but `has_session` is a coroutine.
    Commits are as durable as the server's settings make them (synchronous_commit on, the
    default: a commit returned is flushed to its WAL)."""

    _CONFIRMED = "(record::jsonb ->> 'confirmed') IS NOT NULL"
    _TRIGGERED = "(record::jsonb ->> 'trigger') IS NOT NULL"
    _CANARY = "(record::jsonb ->> 'canary') IS NOT NULL"
    _METHOD = "coalesce(record::jsonb ->> 'method', 'poirot')"
    _STARTED_MS = (
        "floor(extract(epoch FROM (record::jsonb ->> 'started_at')::timestamptz) * 1000)::bigint"
    )

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        writer: Connection,
        reader: Connection,
        sessions: set[str],
        idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW,
    ) -> None:
        self._connect = connect
        self._key_window = KeyWindow(idempotency_window)
        self._writer = writer
        self._reader = reader
        self._sessions = sessions
        self._writing = asyncio.Lock()
        self._reading = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None
        self.shared = True
        self.faults = StoreFaults()
        self._changes = ChangeListener(connect)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        where: str,
        password: str | None = None,
        idempotency_window: float = DEFAULT_IDEMPOTENCY_WINDOW,
    ) -> PostgresStore:
        """Connects, migrates the database to this poirotd's schema and reads its sessions.
        `where` names the database in errors (the URL without its password); `password`, when
        given, is used instead of one in the URL; `idempotency_window`, seconds an ingest key is
        kept after its commit. Raises psycopg.OperationalError when the server cannot be
        reached, pg_schema.NewerSchemaError for a newer database."""
        KeyWindow(idempotency_window)  # refuses a window that is not positive
        given = conninfo_to_dict(url)
        extra: dict[str, Any] = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in given}
        if password is not None:
            extra["password"] = password

        async def connect() -> Connection:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True, **extra)
            try:
                await conn.execute(_IDLE_IN_TRANSACTION)
                # Records are long texts: lz4 compresses them at a fraction of pglz's CPU. A
                # server built without lz4, or older than PostgreSQL 14, keeps pglz.
                with contextlib.suppress(
                    pg_errors.InvalidParameterValue, pg_errors.UndefinedObject
                ):
                    await conn.execute(b"SET default_toast_compression = 'lz4'")
            except BaseException:  # cancelled too: the change listener of a store closing
                await conn.close()
                raise
            return conn

        writer = await connect()
        try:
            reader = await connect()
            try:
                await migrate(writer, where)
                rows = await (await reader.execute(b"SELECT session_id FROM sessions")).fetchall()
            except BaseException:
                await reader.close()
                raise
        except BaseException:
            await writer.close()
            raise
        sessions = {session_id for (session_id,) in rows}
        return cls(connect, writer, reader, sessions, idempotency_window)

    async def close(self) -> None:
        """Lets already submitted work finish, then closes both connections; idempotent."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        await self._changes.close()
        async with self._writing, self._reading:
            try:
                await self._reader.close()
            finally:
                await self._writer.close()

    def _check_open(self) -> None:
        if self._closing is not None:
            raise RuntimeError("store is closed")

    @asynccontextmanager
    async def _head_transaction(self) -> AsyncIterator[tuple[Connection, _Head]]:
        """A write transaction holding the chain's lock, and the chain's head as it found it,
        read in the round trip of the first answer the transaction waits for; the entries
        appended to its links are stored just before it commits."""
        self._check_open()
        async with self._reaching(writing=True), self._writing:
            conn = await self._write_connection()
            async with conn.pipeline(), conn.transaction():
                await conn.execute(_LOCK_CHAIN, (CHAIN_LOCK,))
                head = _Head(await conn.execute(_HEAD))
                yield conn, head
                if entries := (await head.links()).take():
                    async with conn.cursor() as cursor:
                        await cursor.executemany(_APPEND_AUDIT, entries)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[tuple[Connection, Links]]:
        """`_head_transaction` with its links at hand."""
        async with self._head_transaction() as (conn, head):
            yield conn, await head.links()

    @asynccontextmanager
    async def _reaching(self, *, writing: bool) -> AsyncIterator[None]:
        """Around one use of the server: an operational error (the server stopped, restarts,
        or its disk is full) is StoreUnreachable, and the store's availability is kept."""
        try:
            yield
        except psycopg.OperationalError as exc:
            kind = postgres_fault(exc)
            raise self.faults.unreachable(kind, exc, writing=writing) from exc
        self.faults.succeeded(writing=writing)

    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self._all(_placeholders(sql), params)

    async def _write_connection(self) -> Connection:
        """The write connection, replaced if the server dropped it; hold `_writing`."""
        _notice_loss(self._writer)
        if self._writer.broken:
            self._writer = await self._connect()
        return self._writer

    async def _all(self, query: bytes, params: Sequence[Any] = ()) -> list[Row]:
        """One read statement; on a connection found lost, once more on a new one."""
        self._check_open()
        async with self._reaching(writing=False), self._reading:
            for attempt in (1, 2):
                if self._reader.broken:
                    self._reader = await self._connect()
                try:
                    return await (await self._reader.execute(query, params)).fetchall()
                except psycopg.OperationalError:
                    if attempt == 2 or not self._reader.broken:
                        raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ ingest

    async def commit_ingest(
        self,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> LeftOut:
        """Stores the batch and the parking changes in one transaction and returns after COMMIT
        (the ack point), with what it left out: copies of stored items, and conflicts it set
        aside. The sessions this process does not know are looked up in the transaction.

        Three round trips and the commit's flush: the lock, the head, the sessions looked up,
        the session starts and the batch's message keys (which are new); then the session ends
        and the blocks (their ids); then the chain's entries and COMMIT. Entries are appended as
        on SQLite: session starts and ends in order, then message blocks, then telemetry.

        Keys cost no round trip of their own: the batch is written as if none were stored, with
        the stored runs that overlap its keys asked for in the same round trip as the first
        answers; if they hold one of its keys (a copy or a conflict: rare), the transaction is
        rolled back and the batch written again without them, looked up first. The chain's lock
        serialises every replica's writes, so no other adds a key meanwhile. A message whose
        session and index are stored costs a round trip more (their digests)."""
        wanted = idempotency.wanted(items, keys)
        try:
            return await self._commit(items, keys, parking, wanted, optimistic=bool(wanted))
        except (_CopiesFoundError, pg_errors.UniqueViolation):
            if not wanted:
                raise
            return await self._commit(items, keys, parking, wanted, optimistic=False)

    async def take_over_parked_log_events(
        self, owner: str, owned_before_us: int, now_us: int
    ) -> list[ParkedLogEvent]:
        """Row locks decide between replicas taking over at once: the second one's DELETE
        waits for the first one's commit and finds the rows gone."""
        async with self._transaction() as (conn, _):
            answer = await conn.execute(_placeholders(TAKE_OVER), (owner, owned_before_us))
            found, parking = taken_over(owner, now_us, await answer.fetchall())
            if parking:
                async with conn.cursor() as cursor:
                    await cursor.executemany(_placeholders(PARK), parking.park_rows())
        return found

    async def _commit(
        self,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None],
        parking: Parking,
        wanted: dict[str, set[int]],
        *,
        optimistic: bool,
    ) -> LeftOut:
        """`commit_ingest`'s transaction; `optimistic`: raises _CopiesFoundError (rolled back) when
        the batch holds a stored key, instead of looking the keys up before writing."""
        unknown = unknown_sessions(items, self._sessions.__contains__)
        async with self._head_transaction() as (conn, head):
            found = await conn.execute(_FIND_SESSIONS, (unknown,)) if unknown else None
            kept, held = await self._drop_seen_keys(conn, items, keys, wanted, optimistic)
            changes = [item for item in kept.items if isinstance(item, Session | SessionEnd)]
            firsts, repeats = _first_of_each(kept)
            telemetry = [telemetry_block_row(block) for block in telemetry_blocks(kept.items)]
            sent = [(change, await _send_session_change(conn, change)) for change in changes]
            indexes = await _send_message_keys(conn, firsts)
            if found is not None:
                stored_ids = {session_id for (session_id,) in await found.fetchall()}
                if missing := [s for s in unknown if s not in stored_ids]:
                    raise UnknownSessionError(missing[0])
            if held is not None and idempotency.seen_in(await held.fetchall(), wanted):
                raise _CopiesFoundError
            stored = [
                (SESSIONS, row)
                for change, answer in sent
                if (row := await _session_row_stored(conn, change, answer)) is not None
            ]
            new = await _new_messages(conn, indexes, firsts, repeats, kept, keys)
            blocks = [(MESSAGE_BLOCKS, message_block_row(block)) for block in message_blocks(new)]
            blocks += [(TELEMETRY_BLOCKS, row) for row in telemetry]
            ids = [await conn.execute(_insert_with_id(table), row[1:]) for table, row in blocks]
            for (table, row), answer in zip(blocks, ids, strict=True):
                stored.append((table, (await _assigned_id(answer), *row[1:])))
            conflicts = await _store_conflicts(conn, kept.conflicts, stored)
            links = await head.links()
            for table, row in stored:
                links.append(table.kind, table.ref(row), row[-1])
            if parking:
                async with conn.cursor() as cursor:
                    if parking.park:
                        await cursor.executemany(_placeholders(PARK), parking.park_rows())
                    if parking.release:
                        await cursor.executemany(_placeholders(RELEASE), parking.release)
        self._sessions.update(unknown, (c.session_id for c in changes))
        return LeftOut(kept.duplicates, conflicts)

    async def _drop_seen_keys(
        self,
        conn: Connection,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None],
        wanted: dict[str, set[int]],
        optimistic: bool,
    ) -> tuple[idempotency.Kept, Cursor | None]:
        """The batch without copies of keyed items already stored and with conflicts set aside,
        and the new keys recorded. `optimistic`: none is taken for stored, and the answer
        returned (not read yet) holds the stored runs that overlap the batch's keys."""
        if not wanted:
            return idempotency.kept_all(items), None
        producers = list(wanted)
        bounds = ([min(wanted[p]) for p in producers], [max(wanted[p]) for p in producers])
        answer = await conn.execute(_SEEN_KEYS, (producers, *bounds))
        held = answer if optimistic else None
        seen = {} if optimistic else idempotency.seen_in(await answer.fetchall(), wanted)
        kept = idempotency.drop_seen(items, keys, seen, wanted)
        now_us = micros(datetime.now(UTC))
        if new_runs := idempotency.key_rows(kept, now_us):
            columns = [list(column) for column in zip(*new_runs, strict=True)]
            await conn.execute(_INSERT_KEYS, columns)
        if (before := self._key_window.prune_before(now_us)) is not None:
            await conn.execute(_PRUNE_KEYS, (before,))
        return kept, held

    def has_session(self, session_id: str) -> bool:
        self._check_open()
        return session_id in self._sessions

    async def find_session(self, session_id: str) -> bool:
        if self.has_session(session_id):
            return True
        if await self._all(_FIND_SESSIONS, ([session_id],)):
            self._sessions.add(session_id)
            return True
        return False

    async def session_messages(self, session_id: str) -> list[AgentMessage]:
        """The session's messages in index order."""
        rows = await self._all(
            b"SELECT record FROM message_blocks WHERE session_id = %s ORDER BY id", (session_id,)
        )
        messages = [m for (r,) in rows for m in MessageBlock.model_validate_json(r).to_messages()]
        return sorted(messages, key=lambda message: message.index)

    async def reserve_message_indexes(self, session_id: str, count: int, *, floor: int = 0) -> int:
        """One upsert of the session's counter: first = max(counter, stored + 1, floor)."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        self._check_open()
        async with self._reaching(writing=True), self._writing:
            conn = await self._write_connection()
            cursor = await conn.execute(
                _RESERVE_INDEXES, {"s": session_id, "n": count, "floor": floor}
            )
            row = await cursor.fetchone()
        assert row is not None, "an upsert returns its row"
        return int(row[0])

    async def newest_readings(self, session_id: str, *, limit: int = 10_000) -> list[Reading]:
        """The session's newest `limit` samples, oldest first (ties in time keep arrival order):
        blocks are read newest first, a page at a time, until the rest can hold none of them."""
        check_limit(limit)
        newest = NewestReadings(limit)
        after: tuple[int, int] | None = None
        while True:
            keyset = "" if after is None else " AND (last_us, id) < (%s, %s)"
            rows = await self._all(
                sql(
                    "SELECT id, last_us, record FROM telemetry_blocks WHERE session_id = %s"
                    f"{keyset} ORDER BY last_us DESC, id DESC LIMIT {_BLOCKS_PER_READ}"
                ),
                (session_id, *(after or ())),
            )
            for block_id, last_us, record in rows:
                if not newest.wants(block_id, last_us):
                    return newest.oldest_first()
                newest.add(block_id, record)
            if len(rows) < _BLOCKS_PER_READ:
                return newest.oldest_first()
            after = (rows[-1][1], rows[-1][0])

    # ------------------------------------------------------------ hazard spaces

    async def put_hazard_space(self, space: HazardSpace) -> None:
        """Upsert; the space put last (even an older version put again) becomes the latest."""
        async with self._transaction() as (conn, links):
            await _chained(conn, links, HAZARD_SPACES, hazard_space_row(space, links.next_seq))

    # ------------------------------------------------------------ investigations

    async def save_investigation(self, inv: Investigation, *, lease: Lease | None = None) -> None:
        async with self._transaction() as (conn, links):
            inv = await _leased_record(conn, inv, lease)
            await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))

    async def finish_investigation(
        self, inv: Investigation, event: InvestigationEvent, *, lease: Lease | None = None
    ) -> InvestigationEvent:
        async with self._transaction() as (conn, links):
            inv = await _leased_record(conn, inv, lease)
            await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
            stored = await _insert_row(conn, EVENTS, event_row(event, None))
            links.append(EVENTS.kind, EVENTS.ref(stored), stored[-1])
            await conn.execute(NOTIFY)
        return event.model_copy(update={"event_id": stored[0]})

    async def admit_investigation(
        self, inv: Investigation, admit: Admit, *, cooldown: timedelta | None = None
    ) -> Admitted:
        """As the port says, under the chain's lock: replicas admitting at once decide one
        after the other, each on what the one before stored."""
        async with self._transaction() as (conn, links):
            view = await _queue_view(conn, inv, cooldown)
            admission = admit(view)
            if admission is Admission.COALESCED:
                assert view.open is not None, "only an open investigation is joined"
                inv = coalesced(view.open, inv)
            else:
                inv = admitted(inv, admission)
                if inv.trigger is not None and cooldown is not None:
                    await conn.execute(
                        b"INSERT INTO hazard_openings VALUES (%s, %s, %s)",
                        (inv.session_id, micros(inv.trigger.at), inv.investigation_id),
                    )
            await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
            if admission is Admission.QUEUED:
                await conn.execute(NOTIFY)
        return Admitted(admission, inv)

    async def queue_deferred(self, capacity: int) -> list[Investigation]:
        """As the port says, under the chain's lock; the read connection is asked first whether
        anything is deferred, so that replicas finding nothing take no lock."""
        deferred = InvestigationState.DEFERRED.value
        if not await self._all(
            b"SELECT 1 FROM investigations WHERE state = %s LIMIT 1", (deferred,)
        ):
            return []
        async with self._transaction() as (conn, links):
            row = await (
                await conn.execute(
                    b"SELECT count(*) FROM investigations WHERE state = %s",
                    (InvestigationState.QUEUED.value,),
                )
            ).fetchone()
            room = max(capacity - (int(row[0]) if row else 0), 0)
            rows = await (
                await conn.execute(
                    b"SELECT record FROM investigations WHERE state = %s"
                    b" ORDER BY created_us, investigation_id LIMIT %s",
                    (deferred, room),
                )
            ).fetchall()
            done = [
                admitted(Investigation.model_validate_json(record), Admission.QUEUED)
                for (record,) in rows
            ]
            for inv in done:
                await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
            if done:
                await conn.execute(NOTIFY)
        return done

    async def claim_investigation(
        self, owner: str, lease_seconds: float
    ) -> tuple[Investigation, Lease] | None:
        span = lease_micros(lease_seconds)
        if not await self._all(sql(f"SELECT 1{_CLAIMABLE} LIMIT 1"), (list(CLAIMABLE),)):
            return None
        async with self._transaction() as (conn, links):
            row = await (
                await conn.execute(
                    sql(
                        f"SELECT record, lease_owner, lease_token{_CLAIMABLE}"
                        " ORDER BY state = %s, created_us, investigation_id LIMIT 1"
                    ),
                    (list(CLAIMABLE), InvestigationState.RUNNING.value),
                )
            ).fetchone()
            if row is None:
                return None
            inv, lease = claimed(Investigation.model_validate_json(row[0]), owner, row[1], row[2])
            await conn.execute(
                sql(
                    "UPDATE investigations SET lease_owner = %s,"
                    f" lease_until_us = {_NOW_US} + %s, lease_token = %s"
                    " WHERE investigation_id = %s"
                ),
                (owner, span, lease.token, inv.investigation_id),
            )
            if lease.taken_over_from:
                await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
        return inv, lease

    def change_mark(self) -> int:
        return self._changes.mark()

    async def wait_for_change(self, since: int) -> None:
        await self._changes.wait(since)

    async def renew_lease(self, lease: Lease, lease_seconds: float) -> bool:
        # No notification: a renewal changes nothing another replica could act on.
        return await self._set_lease_end(lease, lease_micros(lease_seconds), notify=False)

    async def hand_back_lease(self, lease: Lease) -> None:
        await self._set_lease_end(lease, 0, notify=True)  # claimable at once: say so

    async def _set_lease_end(self, lease: Lease, span_us: int, *, notify: bool) -> bool:
        """The lease to end `span_us` after the server's clock; False when it was lost."""
        async with self._transaction() as (conn, _):
            if notify:
                await conn.execute(NOTIFY)
            cursor = await conn.execute(
                sql(
                    f"UPDATE investigations SET lease_until_us = {_NOW_US} + %s"
                    " WHERE investigation_id = %s AND lease_owner = %s AND lease_token = %s"
                    " RETURNING 1"  # pipeline mode: a row fetched, not a rowcount
                ),
                (span_us, lease.investigation_id, lease.owner, lease.token),
            )
            return await cursor.fetchone() is not None

    async def settle_unfinished(self, reason: str, at: datetime) -> Settled:
        """As the port says, in one transaction, oldest first; emitting the matching events is
        the caller's job."""
        result = Settled([], [])
        async with self._transaction() as (conn, links):
            rows = await (
                await conn.execute(
                    b"SELECT record FROM investigations WHERE state = ANY(%s)"
                    b" ORDER BY created_us, investigation_id",
                    (list(CLAIMABLE),),
                )
            ).fetchall()
            for (record,) in rows:
                before = Investigation.model_validate_json(record)
                inv = settled(before, reason, at)
                if inv != before:
                    await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
                if inv.state is InvestigationState.QUEUED:
                    await conn.execute(
                        b"UPDATE investigations SET lease_owner = NULL, lease_until_us = NULL"
                        b" WHERE investigation_id = %s",
                        (inv.investigation_id,),
                    )
                    result.requeued.append(inv.investigation_id)
                else:
                    result.interrupted.append(inv.investigation_id)
        return result

    # ------------------------------------------------------------ confirmed outcomes

    async def confirm_outcome(
        self,
        investigation_id: str,
        outcome: ConfirmedOutcome,
        reassess: Reassess,
        *,
        supersede: bool = False,
    ) -> tuple[Investigation, bool]:
        """As the port says, in one write transaction: two confirmations, from any daemon,
        never read the same history."""
        async with self._transaction() as (conn, links):
            row = await (
                await conn.execute(
                    b"SELECT record FROM investigations WHERE investigation_id = %s",
                    (investigation_id,),
                )
            ).fetchone()
            if row is None:
                raise UnknownInvestigationError(investigation_id)
            stored = Investigation.model_validate_json(row[0])
            if (inv := confirmation(stored, outcome, supersede)) is None:
                return stored, False
            await _chained(conn, links, INVESTIGATIONS, investigation_row(inv))
            history = await (
                await conn.execute(
                    b"SELECT record FROM investigations WHERE system = %s"
                    b" AND investigation_id <> %s AND (record::jsonb ->> 'confirmed') IS NOT NULL",
                    (inv.system, inv.investigation_id),
                )
            ).fetchall()
            confirmed = [Investigation.model_validate_json(record) for (record,) in history]
            rows = await (
                await conn.execute(
                    b"SELECT record FROM reputations WHERE system = %s", (inv.system,)
                )
            ).fetchall()
            reputations = (AgentReputation.model_validate_json(record) for (record,) in rows)
            for reputation in reassess([*confirmed, inv], {r.agent_id: r for r in reputations}):
                await _chained(conn, links, REPUTATIONS, reputation_row(reputation))
        return inv, True

    async def put_campaign_seed(self, seed: CampaignSeed) -> None:
        async with self._transaction() as (conn, links):
            await _chained(conn, links, CAMPAIGN_SEEDS, campaign_seed_row(seed))

    # ------------------------------------------------------------ ErrorProbe's memory

    async def update_memory_entry(
        self, system: str, entry_id: str, update: MemoryUpdate
    ) -> DiagnosisMemoryEntry | None:
        """Reads the entry, stores what `update` makes of it, in one write transaction (the
        row is read under the chain's lock: no other daemon's update comes in between)."""
        async with self._transaction() as (conn, links):
            row = await (
                await conn.execute(
                    b"SELECT record FROM diagnosis_memory WHERE system = %s AND entry_id = %s",
                    (system, entry_id),
                )
            ).fetchone()
            before = None if row is None else DiagnosisMemoryEntry.model_validate_json(row[0])
            entry = checked_memory_update(system, entry_id, update(before))
            if entry is not None:
                await _chained(conn, links, DIAGNOSIS_MEMORY, memory_row(entry))
        return entry

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
        row = await self._insert_for_investigation(EVENTS, event_row(event, None), lease)
        return event.model_copy(update={"event_id": row[0]})

    # ------------------------------------------------------------ LLM exchange audit

    async def record_exchange(
        self, investigation_id: str, exchange: LLMExchange, *, lease: Lease | None = None
    ) -> None:
        await self._insert_for_investigation(
            EXCHANGES, exchange_row(exchange, investigation_id, None), lease
        )

    async def _insert_for_investigation(
        self, table: AuditedTable, row: Row, lease: Lease | None
    ) -> Row:
        try:
            async with self._transaction() as (conn, links):
                await _check_lease(conn, lease)
                stored = await _insert_row(conn, table, row)
                links.append(table.kind, table.ref(stored), stored[-1])
                if table is EVENTS:
                    await conn.execute(NOTIFY)
        except pg_errors.ForeignKeyViolation as exc:  # the only constraint: the investigation
            raise UnknownInvestigationError(row[1]) from exc
        return stored

    # ------------------------------------------------------------ the audit chain

    async def record_access_denial(self, denial: AccessDenial) -> None:
        async with self._transaction() as (conn, links):
            stored = await _insert_row(conn, ACCESS_DENIALS, access_denial_row(denial, None))
            links.append(ACCESS_DENIALS.kind, ACCESS_DENIALS.ref(stored), stored[-1])


# ------------------------------------------------------------ statements (write transaction)


def _notice_loss(conn: Connection) -> None:
    """Reads what the server sent the idle connection since its last use: one the server ended
    (a restart, a failover, an idle timeout: its error, then the end of the stream) is then
    broken, to be replaced before a write is sent on it rather than fail the write."""
    if not conn.broken:
        with contextlib.suppress(psycopg.OperationalError):
            conn.pgconn.consume_input()  # the server's error, if it sent one
            conn.pgconn.consume_input()  # the end of the stream after it


# A kept message with its batch position and its digest.
_Positioned: TypeAlias = tuple[int, AgentMessage, bytes]


def _first_of_each(kept: idempotency.Kept) -> tuple[list[_Positioned], list[_Positioned]]:
    """The batch's messages, the first of each (session, index), and the others (a resend in
    the same batch, or a conflict with the first)."""
    positioned = [
        (position, item)
        for position, item in zip(kept.positions, kept.items, strict=True)
        if isinstance(item, AgentMessage)
    ]
    digests = idempotency.message_digests((m for _, m in positioned), kept.digests)
    seen: set[tuple[str, int]] = set()
    first: list[_Positioned] = []
    later: list[_Positioned] = []
    for (position, message), digest in zip(positioned, digests, strict=True):
        key = (message.session_id, message.index)
        (later if key in seen else first).append((position, message, digest))
        seen.add(key)
    return first, later


class _CopiesFoundError(Exception):
    """An optimistic commit met keys the store holds: it is rolled back and written again."""


class _Head:
    """The chain's head as a write transaction found it, read when first needed."""

    def __init__(self, answer: Cursor) -> None:
        self._answer = answer
        self._links: Links | None = None

    async def links(self) -> Links:
        if self._links is None:
            head = await self._answer.fetchone()
            self._links = Links(head or (0, GENESIS_HASH))
        return self._links


async def _send_message_keys(conn: Connection, messages: list[_Positioned]) -> Cursor | None:
    """Adds the messages' indexes and digests to `message_indices`; the answer holds those that
    were new."""
    if not messages:
        return None
    columns = ([m.session_id for _, m, _ in messages], [m.index for _, m, _ in messages])
    return await conn.execute(_NEW_MESSAGE_KEYS, (*columns, [d for _, _, d in messages]))


async def _new_messages(
    conn: Connection,
    answer: Cursor | None,
    firsts: list[_Positioned],
    repeats: list[_Positioned],
    kept: idempotency.Kept,
    keys: Sequence[ItemKey | None],
) -> list[AgentMessage]:
    """The first messages whose (session, index) was not stored before, as
    `_send_message_keys`' answer tells; each other message is a copy or a conflict of what
    holds its index (`index_outcome`): a message stored before (its digest read, one round trip
    more) or the first of the batch."""
    if answer is None:
        return []
    new = set(map(tuple, await answer.fetchall()))
    holders = {(m.session_id, m.index): digest for _, m, digest in firsts}
    old = [(p, m, d) for p, m, d in firsts if (m.session_id, m.index) not in new]
    if old:
        stored = [m.session_id for _, m, _ in old], [m.index for _, m, _ in old]
        rows = await (await conn.execute(_MESSAGE_DIGESTS, stored)).fetchall()
        holders.update({(s, i): digest or UNKNOWN for s, i, digest in rows})
    for position, message, digest in (*old, *repeats):
        held = holders[(message.session_id, message.index)]
        idempotency.index_outcome(kept, position, message, digest, held, keys)
    return [m for _, m, _ in firsts if (m.session_id, m.index) in new]


async def _store_conflicts(
    conn: Connection,
    conflicts: Sequence[idempotency.Conflict],
    stored: list[tuple[AuditedTable, Row]],
) -> tuple[StoredConflict, ...]:
    """Stores each conflict's record (added to `stored`, to be chained)."""
    at = datetime.now(UTC)
    records = [idempotency.conflict_record(conflict, at) for conflict in conflicts]
    rows = [ingest_conflict_row(record, None) for record in records]
    answers = [await conn.execute(_insert_with_id(INGEST_CONFLICTS), row[1:]) for row in rows]
    kept: list[StoredConflict] = []
    for conflict, record, row, answer in zip(conflicts, records, rows, answers, strict=True):
        conflict_id = await _assigned_id(answer)
        stored.append((INGEST_CONFLICTS, (conflict_id, *row[1:])))
        kept.append(StoredConflict(conflict.position, conflict_id, record))
    return tuple(kept)


async def _send_session_change(conn: Connection, change: Session | SessionEnd) -> Cursor:
    """Inserts a session's start (unless stored), or reads the record a session's end
    changes."""
    if isinstance(change, Session):
        return await conn.execute(_INSERT_SESSION, session_row(change))
    return await conn.execute(
        b"SELECT record FROM sessions WHERE session_id = %s", (change.session_id,)
    )


async def _session_row_stored(
    conn: Connection, change: Session | SessionEnd, answer: Cursor
) -> Row | None:
    """The row a session's start stored (None: it was stored before), or the row of its end,
    which this stores: the record read, with its end time."""
    found = await answer.fetchone()
    if isinstance(change, Session):
        return session_row(change) if found is not None else None
    assert found is not None, "commit_ingest checked that the session exists"
    session = Session.model_validate_json(found[0])
    row = session_row(session.model_copy(update={"ended_at": change.ended_at}))
    await conn.execute(_upsert(SESSIONS, 1), row)
    return row


async def _assigned_id(answer: Cursor) -> int:
    assigned = await answer.fetchone()
    assert assigned is not None, "an insert returns its id"
    return int(assigned[0])


async def _insert_row(conn: Connection, table: AuditedTable, row: Row) -> Row:
    """Inserts `row` (its first column None: the database assigns it); returns it with its id."""
    answer = await conn.execute(_insert_with_id(table), row[1:])
    return (await _assigned_id(answer), *row[1:])


async def _leased_record(
    conn: Connection, inv: Investigation, lease: Lease | None
) -> Investigation:
    """Under the chain's lock: a run's copy of the record, checked against its lease, with the
    triggers coalesced into the stored record since the claim. Without a lease, `inv`."""
    if lease is None:
        return inv
    row = await (
        await conn.execute(
            b"SELECT lease_owner, lease_token, record::jsonb ->> 'coalesced',"
            b" record::jsonb ->> 'coalesced_omitted' FROM investigations"
            b" WHERE investigation_id = %s",
            (lease.investigation_id,),
        )
    ).fetchone()
    if row is None or tuple(row[:2]) != (lease.owner, lease.token):
        raise LeaseLostError(lease)
    return with_stored_coalesced(inv, row[2], row[3])


async def _queue_view(
    conn: Connection, inv: Investigation, cooldown: timedelta | None
) -> QueueView:
    queued, deferred = InvestigationState.QUEUED.value, InvestigationState.DEFERRED.value
    counts = await conn.execute(
        b"SELECT count(*) FILTER (WHERE state = %s), count(*) FILTER (WHERE state = %s),"
        b" count(*) FILTER (WHERE state = %s AND record::jsonb ->> 'requested_by' = %s)"
        b" FROM investigations WHERE state = ANY(%s)",
        (queued, deferred, queued, inv.requested_by or None, [queued, deferred]),
    )
    unfinished = await conn.execute(
        b"SELECT record FROM investigations WHERE session_id = %s AND state = ANY(%s)"
        b" ORDER BY created_us, investigation_id",
        (inv.session_id, list(UNFINISHED)),
    )
    records = [Investigation.model_validate_json(r) for (r,) in await unfinished.fetchall()]
    found = open_of_method(records, inv.method)
    if found is None and inv.trigger is not None and cooldown is not None:
        at, span = micros(inv.trigger.at), cooldown // timedelta(microseconds=1)
        opened = await (
            await conn.execute(
                b"SELECT i.record FROM hazard_openings AS h JOIN investigations AS i"
                b" ON i.investigation_id = h.investigation_id"
                b" WHERE h.session_id = %s AND h.at_us > %s AND h.at_us < %s"
                b" ORDER BY h.at_us LIMIT 1",
                (inv.session_id, at - span, at + span),
            )
        ).fetchone()
        found = Investigation.model_validate_json(opened[0]) if opened else None
    row = await counts.fetchone()
    assert row is not None, "an aggregate returns a row"
    return QueueView(
        queued=int(row[0]), deferred=int(row[1]), queued_by_requester=int(row[2]), open=found
    )


async def _check_lease(conn: Connection, lease: Lease | None) -> None:
    """Under the chain's lock: the lease is still the investigation's current one."""
    if lease is None:
        return
    row = await (
        await conn.execute(
            b"SELECT lease_owner, lease_token FROM investigations WHERE investigation_id = %s",
            (lease.investigation_id,),
        )
    ).fetchone()
    if row is None or tuple(row) != (lease.owner, lease.token):
        raise LeaseLostError(lease)


# The number of leading columns that key each upserted table.
_KEYS = {
    SESSIONS: 1,
    HAZARD_SPACES: 2,
    INVESTIGATIONS: 1,
    REPUTATIONS: 2,
    CAMPAIGN_SEEDS: 1,
    DIAGNOSIS_MEMORY: 2,
}


async def _chained(conn: Connection, links: Links, table: AuditedTable, row: Row) -> None:
    """Upserts the row and appends its entry."""
    await conn.execute(_upsert(table, _KEYS[table]), row)
    links.append(table.kind, table.ref(row), row[-1])
