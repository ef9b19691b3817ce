"""The durable store on SQLite in WAL mode: an acknowledged write is a committed write.

Threads: the event loop never runs SQL. One worker thread owns the only write connection, so
writes are serialised in submission order (a session started by one ingest call exists for the
next one, and event ids are committed in the order they are assigned: a Watch that reads "after N"
can never miss an id that commits later). A second thread owns a read-only connection: WAL lets it
read the last committed state while the writer waits on fsync, so Get/List/Watch stay responsive
during ingest bursts (with synchronous=FULL each commit is an fsync: milliseconds on SSDs, tens of
milliseconds on the SD cards of edge boxes). Every read is a single statement, hence a consistent
snapshot.

Records are pydantic JSON (exact round trip, readable with the sqlite3 shell); columns exist only
for what is looked up or ordered. Ordering keys for time are integer UTC microseconds (naive
datetimes are taken as UTC); the record keeps the datetime exactly as given.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeAlias, TypeVar

from poirotd.model import (
    AgentMessage,
    HazardSpace,
    Investigation,
    InvestigationEvent,
    InvestigationState,
    LLMExchange,
    Session,
    SessionEnd,
    TelemetrySample,
)

IngestItem: TypeAlias = Session | SessionEnd | AgentMessage | TelemetrySample

SCHEMA_VERSION = 1
_BUSY_TIMEOUT_MS = 5_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    system     TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at   TEXT,
    labels     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id         INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (session_id),
    idx        INTEGER NOT NULL,
    record     TEXT NOT NULL,
    UNIQUE (session_id, idx)
);
CREATE TABLE IF NOT EXISTS telemetry (
    id          INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES sessions (session_id),
    measured_us INTEGER NOT NULL,
    record      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS telemetry_by_session_time ON telemetry (session_id, measured_us, id);
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
"""

_INSERT_SESSION = (
    "INSERT OR IGNORE INTO sessions (session_id, system, started_at, ended_at, labels) "
    "VALUES (?, ?, ?, ?, ?)"
)
_END_SESSION = "UPDATE sessions SET ended_at = ? WHERE session_id = ?"
_INSERT_MESSAGE = "INSERT OR IGNORE INTO messages (session_id, idx, record) VALUES (?, ?, ?)"
_INSERT_TELEMETRY = "INSERT INTO telemetry (session_id, measured_us, record) VALUES (?, ?, ?)"
_PUT_HAZARD_SPACE = """
INSERT INTO hazard_spaces (system, version, put_seq, record)
VALUES (?, ?, (SELECT coalesce(max(put_seq), 0) + 1 FROM hazard_spaces), ?)
ON CONFLICT (system, version) DO UPDATE SET put_seq = excluded.put_seq, record = excluded.record
"""
_SAVE_INVESTIGATION = """
INSERT INTO investigations (investigation_id, system, session_id, state, created_us, record)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (investigation_id) DO UPDATE SET
    system = excluded.system, session_id = excluded.session_id, state = excluded.state,
    created_us = excluded.created_us, record = excluded.record
"""

_P = ParamSpec("_P")
_T = TypeVar("_T")
Row: TypeAlias = tuple[Any, ...]


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


class Store:
    """Sessions, hazard spaces, investigations, their events and LLM exchanges.

    Create with `await Store.open(path)`; every method but `has_session` is a coroutine.
    `synchronous="NORMAL"` keeps commits safe from a crash of the daemon but not from power loss.
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
        rows = await self._read(
            _all, "SELECT record FROM messages WHERE session_id = ? ORDER BY idx", (session_id,)
        )
        return [AgentMessage.model_validate_json(record) for (record,) in rows]

    async def session_telemetry(
        self, session_id: str, *, limit: int = 10_000
    ) -> list[TelemetrySample]:
        """The newest `limit` samples, oldest first (ties in time keep arrival order)."""
        _check_limit(limit)
        rows = await self._read(
            _all,
            "SELECT record FROM (SELECT id, measured_us, record FROM telemetry"
            " WHERE session_id = ? ORDER BY measured_us DESC, id DESC LIMIT ?)"
            " ORDER BY measured_us, id",
            (session_id, limit),
        )
        return [TelemetrySample.model_validate_json(record) for (record,) in rows]

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
        await self._write(
            _execute, _PUT_HAZARD_SPACE, (space.system, space.version, space.model_dump_json())
        )

    async def latest_hazard_space(self, system: str) -> HazardSpace | None:
        rows = await self._read(
            _all,
            "SELECT record FROM hazard_spaces WHERE system = ? ORDER BY put_seq DESC LIMIT 1",
            (system,),
        )
        return HazardSpace.model_validate_json(rows[0][0]) if rows else None

    # ------------------------------------------------------------ investigations

    async def save_investigation(self, inv: Investigation) -> None:
        await self._write(_execute, _SAVE_INVESTIGATION, _investigation_row(inv))

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

    # ------------------------------------------------------------ investigation events

    async def append_event(self, event: InvestigationEvent) -> InvestigationEvent:
        """Stores the event under the next global id (the incoming one is ignored)."""
        event_id = await self._write(
            _insert_for_investigation,
            "INSERT INTO events (investigation_id, record) VALUES (?, ?)",
            event.investigation_id,
            event.model_dump_json(exclude={"event_id"}),
        )
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
        await self._write(
            _insert_for_investigation,
            "INSERT INTO exchanges (investigation_id, record) VALUES (?, ?)",
            investigation_id,
            exchange.model_dump_json(),
        )

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
        with _transaction(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{path} has schema version {version}; this poirotd supports up to "
                    f"{SCHEMA_VERSION}"
                )
            for statement in filter(str.strip, _SCHEMA.split(";")):
                conn.execute(statement)
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


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so COMMIT cannot fail on a lock upgrade.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


# ------------------------------------------------------------ statements (worker threads)


def _all(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Row]:
    return conn.execute(sql, params).fetchall()


def _execute(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> None:
    with _transaction(conn):
        conn.execute(sql, params)


def _commit_ingest(
    conn: sqlite3.Connection, items: Sequence[IngestItem], sessions: set[str]
) -> None:
    started: set[str] = set()
    for item in items:
        if isinstance(item, Session):
            started.add(item.session_id)
        elif item.session_id not in sessions and item.session_id not in started:
            raise UnknownSessionError(item.session_id)
    # Runs of consecutive items of one kind go in one executemany; runs stay in batch order.
    with _transaction(conn):
        for sql, run in groupby(map(_ingest_statement, items), key=itemgetter(0)):
            conn.executemany(sql, [params for _, params in run])
    sessions.update(started)


def _ingest_statement(item: IngestItem) -> tuple[str, Row]:
    match item:
        case Session():
            ended = item.ended_at.isoformat() if item.ended_at else None
            labels = json.dumps(item.labels)
            return _INSERT_SESSION, (
                item.session_id,
                item.system,
                item.started_at.isoformat(),
                ended,
                labels,
            )
        case SessionEnd():
            return _END_SESSION, (item.ended_at.isoformat(), item.session_id)
        case AgentMessage():
            return _INSERT_MESSAGE, (item.session_id, item.index, item.model_dump_json())
        case TelemetrySample():
            row = (item.session_id, _micros(item.measured_at), item.model_dump_json())
            return _INSERT_TELEMETRY, row
        case _:
            raise TypeError(f"cannot ingest a {type(item).__name__}")


def _get_session(conn: sqlite3.Connection, session_id: str) -> Session | None:
    row = conn.execute(
        "SELECT system, started_at, ended_at, labels FROM sessions WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        return None
    system, started_at, ended_at, labels = row
    return Session(
        session_id=session_id,
        system=system,
        started_at=datetime.fromisoformat(started_at),
        ended_at=datetime.fromisoformat(ended_at) if ended_at else None,
        labels=json.loads(labels),
    )


def _investigation_row(inv: Investigation) -> Row:
    return (
        inv.investigation_id,
        inv.system,
        inv.session_id,
        inv.state.value,
        _micros(inv.created_at),
        inv.model_dump_json(),
    )


def _interrupt_unfinished(conn: sqlite3.Connection, reason: str, at: datetime) -> list[str]:
    with _transaction(conn):
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
        conn.executemany(_SAVE_INVESTIGATION, map(_investigation_row, interrupted))
    return [inv.investigation_id for inv in interrupted]


def _insert_for_investigation(
    conn: sqlite3.Connection, sql: str, investigation_id: str, record: str
) -> int:
    """Inserts a row tied to an investigation; returns its id."""
    try:
        with _transaction(conn):
            cursor = conn.execute(sql, (investigation_id, record))
    except sqlite3.IntegrityError as exc:  # the only constraint: the investigation must exist
        raise UnknownInvestigationError(investigation_id) from exc
    assert cursor.lastrowid is not None
    return cursor.lastrowid


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
