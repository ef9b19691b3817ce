"""Checks the store's audit chain, exports one investigation as a self-contained report and lays
the ingest conflicts beside what they conflicted with, on either adapter's database: a SQLite
file, or a PostgreSQL database named by its URL.

Both read through a read-only connection inside one read transaction (on PostgreSQL, REPEATABLE
READ): they see one committed state even while daemons write, and cannot change what they check.
Verify streams every table (on PostgreSQL through server-side cursors) and finds each row's entry
through the `audit (kind, ref, seq)` index, a thousand rows' at a time on PostgreSQL: memory stays
flat and time grows with the rows; export holds one investigation's records. The
queries are the same on both (`?` placeholders, translated for psycopg); `_Snapshot` holds the
few differences.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

import psycopg

from poirotd.model import AgentMessage, IngestConflict, TelemetrySample, sample_of
from poirotd.store import pg_schema
from poirotd.store.chain import GENESIS_HASH, Row, entry_hash
from poirotd.store.idempotency import message_digest, reading_digest
from poirotd.store.pg_url import SCHEMES, redacted, scrubbed
from poirotd.store.records import (
    AUDITED_TABLES,
    MESSAGE_BLOCK_FIELDS,
    AuditedTable,
    MessageBlock,
    TelemetryBlock,
)
from poirotd.store.schema import SCHEMA_VERSION, connect_read_only

EXPORT_FORMAT = "poirotd-investigation-export/2"
_TABLES = {table.kind: table for table in AUDITED_TABLES}
_LATEST = "SELECT seq, payload FROM audit WHERE kind = ? AND ref = ? ORDER BY seq DESC LIMIT 1"
_ENTRY = "SELECT seq, kind, ref, payload, prev_hash, hash FROM audit"
_CHUNK = 1_000


class AuditError(Exception):
    """The database cannot be audited (missing, not a poirotd store, another schema version), or
    the investigation asked for is not in it."""


@dataclass(frozen=True)
class ChainHead:
    """An entry's seq and hash: the head at export or verify time, kept elsewhere as an anchor."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> ChainHead:
        seq, _, digest = text.partition(":")
        if seq.isdigit() and len(digest) == 64:
            try:
                return cls(int(seq), bytes.fromhex(digest).hex())
            except ValueError:
                pass
        raise ValueError(f"an anchor is SEQ:HASH (64 hex digits), not {text!r}")


@dataclass(frozen=True)
class BrokenLink:
    """The first thing that does not check out; seq is None for a row that has no entry."""

    seq: int | None
    kind: str
    ref: str
    problem: str

    def __str__(self) -> str:
        where = "a row without entry" if self.seq is None else f"seq {self.seq}"
        what = f" ({self.kind} {self.ref})" if self.kind else ""
        return f"{where}{what}: {self.problem}"


@dataclass(frozen=True)
class VerifyReport:
    """What verify checked; `head` is the last entry that checks out."""

    entries: int  # audit entries whose links check out (up to the break, if any)
    rows: int  # rows of the record tables compared with their latest entry
    head: ChainHead | None
    broken: BrokenLink | None

    @property
    def ok(self) -> bool:
        return self.broken is None

    def summary(self) -> str:
        if self.broken is not None:
            return f"BROKEN at {self.broken}"
        head = f"head {self.head}" if self.head else "the chain is empty"
        return f"ok: {self.entries} entries chained, {self.rows} rows match them; {head}"


def latest_checkpoint(path: Path) -> ChainHead:
    """The last head the daemon published (`poirotd.store.checkpoints`), as an anchor."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AuditError(f"cannot read checkpoints {path}: {exc.strerror or exc}") from exc
    last = next((line for line in reversed(lines) if line.strip()), None)
    if last is None:
        raise AuditError(f"{path} holds no checkpoint")
    try:
        entry = json.loads(last)
        return ChainHead.parse(f"{int(entry['seq'])}:{entry['hash']}")
    except (ValueError, KeyError, TypeError) as exc:
        raise AuditError(f"{path}: the last checkpoint is not one: {last[:80]!r}") from exc


def verify(
    db: Path | str, *, anchor: ChainHead | None = None, password: str | None = None
) -> VerifyReport:
    """Checks the chain link by link, then every row of the record tables against the latest
    entry for its ref (and that every ref still has its row).

    The chain is checked first: past a broken link no entry can be trusted. Among row problems
    the one with the lowest seq is reported. `anchor`, a head noted earlier, must still be in the
    chain: this catches a history rewritten (and re-hashed) or cut back to before it.
    """
    with _snapshot(db, password) as conn:
        entries, head, broken = _check_chain(conn, anchor)
        rows = 0
        if broken is None:
            rows, broken = _check_rows(conn)
    return VerifyReport(entries, rows, head, broken)


def _check_chain(
    conn: _Snapshot, anchor: ChainHead | None
) -> tuple[int, ChainHead | None, BrokenLink | None]:
    head = ChainHead(0, GENESIS_HASH)
    for seq, kind, ref, payload, prev_hash, digest in conn.scan(f"{_ENTRY} ORDER BY seq"):
        problem = _link_problem(head, seq, kind, ref, payload, prev_hash, digest)
        if problem is None and anchor is not None and seq == anchor.seq and digest != anchor.hash:
            problem = f"its hash is not the anchor's {anchor.hash}"
        if problem is not None:
            return head.seq, _head_or_none(head), BrokenLink(seq, str(kind), str(ref), problem)
        head = ChainHead(seq, digest)
    if anchor is not None and anchor.seq > head.seq:
        problem = f"the chain ends at seq {head.seq}, before the anchor {anchor}"
        return head.seq, _head_or_none(head), BrokenLink(anchor.seq, "", "", problem)
    return head.seq, _head_or_none(head), None


def _link_problem(
    prev: ChainHead, seq: int, kind: Any, ref: Any, payload: Any, prev_hash: Any, digest: Any
) -> str | None:
    if seq != prev.seq + 1:
        missing = f"{prev.seq + 1}" if seq == prev.seq + 2 else f"{prev.seq + 1}..{seq - 1}"
        return f"the entries before it are missing: {missing}"
    if prev_hash != prev.hash:
        return f"its prev_hash is not the hash of seq {prev.seq}"
    try:
        recomputed = entry_hash(prev_hash, kind, ref, payload)
    except (AttributeError, TypeError, ValueError):  # a value of the wrong type
        return "the entry is malformed"
    if recomputed != digest:
        return "its hash does not match its kind, ref and payload"
    if kind not in _TABLES:
        return f"unknown kind {kind!r}"
    return None


def _head_or_none(head: ChainHead) -> ChainHead | None:
    return head if head.seq else None


def _check_rows(conn: _Snapshot) -> tuple[int, BrokenLink | None]:
    rows, first = 0, None
    for table in AUDITED_TABLES:
        with_entry = 0
        for chunk in _chunks(conn.scan(table.select)):
            refs = [table.ref(row) for row in chunk]
            entries = conn.latest_entries(table.kind, refs)
            for row, ref in zip(chunk, refs, strict=True):
                rows += 1
                latest = entries.get(ref)
                seq = None if latest is None else int(latest[0])
                with_entry += seq is not None
                problem = _row_problem(table, row, latest)
                if problem is not None:
                    first = _earlier(first, BrokenLink(seq, table.kind, ref, problem))
        # Refs are one per row, so more refs than rows with an entry means rows were removed.
        refs = conn.execute(
            "SELECT count(*) FROM (SELECT DISTINCT ref FROM audit WHERE kind = ?) AS refs",
            (table.kind,),
        ).fetchone()[0]
        if refs > with_entry and (removed := conn.first_removed_row(table)) is not None:
            first = _earlier(first, removed)
    return rows, first


def _chunks(rows: Iterable[Row]) -> Iterator[list[Row]]:
    """Rows a thousand at a time: memory stays bounded, and a server is asked for a chunk's
    entries at once."""
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _row_problem(table: AuditedTable, row: Row, latest: tuple[int, str] | None) -> str | None:
    if latest is None:
        return "the row has no audit entry"
    seq, payload = latest
    if row[-1] != payload:
        return f"its record differs from its latest entry's payload{_difference(row[-1], payload)}"
    try:
        expected = table.expect(row, seq)
    except (TypeError, ValueError) as exc:
        return f"its record does not decode: {' '.join(str(exc).split())[:200]}"
    for column, stored, derived in zip(table.columns, row, expected, strict=True):
        if stored != derived:
            return f"{column} is {_clip(stored)}, its record gives {_clip(derived)}"
    return None


def _earlier(a: BrokenLink | None, b: BrokenLink) -> BrokenLink:
    """Lower seq first; rows that have no entry at all come last."""
    if a is None:
        return b
    return min(a, b, key=lambda link: (link.seq is None, link.seq or 0))


def _difference(stored: Any, audited: str) -> str:
    if not isinstance(stored, str):
        return f" (it is a {type(stored).__name__})"
    at = next(
        (i for i, (x, y) in enumerate(zip(stored, audited, strict=False)) if x != y),
        min(len(stored), len(audited)),
    )
    return f" from character {at}: {_clip(stored[at : at + 20])} vs {_clip(audited[at : at + 20])}"


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------ export


def export_investigation(
    db: Path | str, investigation_id: str, *, password: str | None = None
) -> dict[str, Any]:
    """One investigation as a JSON-ready report that stands on its own.

    Every record is given as it was chained: {seq, kind, ref, prev_hash, hash, record}, so a reader
    re-hashes it with `entry_hash(prev_hash, kind, ref, canonical_json(record))`; the chain head
    at export lets `poirotd audit verify --anchor` show later that the database still holds it.

    The report is built from the chain, not from the tables: `verify` tells whether both agree.
    `reputation_updates` are the agents' β as its confirmed outcome moved them (none before a
    confirmation, or with reputation off), then as each correction of it did; the corrected
    outcomes are in `earlier_versions`.

    `messages` are those the investigation could have read: the runner reads the session after
    the investigation's `started` event and before its next write, so the window between those
    two entries' seqs bounds the read; messages with a seq inside it may or may not have been seen.
    Their entries are `message_block`s (a commit's new messages of the session, each the list of
    its `block_fields`) and, from a store older than schema 5, single `message`s.
    """
    with _snapshot(db, password) as conn:
        versions = _entries(conn, "investigation", investigation_id)
        if not versions:
            raise AuditError(f"investigation {investigation_id!r} is not in {conn.where}")
        record = versions[-1]["record"]
        head = conn.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        events = _rows_of(conn, "event", "investigation_id = ? ORDER BY event_id", investigation_id)
        exchanges = _rows_of(conn, "exchange", "investigation_id = ? ORDER BY id", investigation_id)
        session = _entries(conn, "session", record["session_id"])
        hazard_space = None
        if (space := record.get("hazard_space")) is not None:
            ref = _TABLES["hazard_space"].ref((space["system"], space["version"]))
            # The space as stored before the investigation's last save (a pinned one never is).
            stored = _entries(conn, "hazard_space", ref)
            hazard_space = next(
                (e for e in reversed(stored) if e["seq"] < versions[-1]["seq"]), None
            )
        read_after = next((e["seq"] for e in events if e["record"]["kind"] == "started"), None)
        read_before = None
        if read_after is not None:
            read_before = min(
                (e["seq"] for e in (*versions, *events, *exchanges) if e["seq"] > read_after),
                default=head[0] + 1,
            )
        stored = [
            *_rows_of(conn, "message", "session_id = ? ORDER BY idx", record["session_id"]),
            *_rows_of(conn, "message_block", "session_id = ? ORDER BY id", record["session_id"]),
        ]
        messages = sorted(
            (m for m in stored if read_before is not None and m["seq"] < read_before),
            key=itemgetter("seq"),
        )
        # The β moves its confirmed outcome made (ConfirmOutcome), one entry per agent.
        reputation_updates = [
            _envelope(row)
            for row in conn.execute(
                f"{_ENTRY} WHERE kind = 'reputation'"
                f" AND {conn.payload_investigation} = ? ORDER BY seq",
                (investigation_id,),
            )
        ]
    return {
        "format": EXPORT_FORMAT,
        "exported_at": datetime.now(UTC).isoformat(),
        "chain": {
            "head": {"seq": head[0], "hash": head[1]},
            "genesis_prev_hash": GENESIS_HASH,
            "hash": "hex SHA-256 of: prev_hash as 32 bytes, then kind and then ref, each after"
            " its UTF-8 length as 4 big-endian bytes, then the record as canonical JSON",
            "canonical_json": "json.dumps(record, sort_keys=True, separators=(',', ':'),"
            " ensure_ascii=False) in UTF-8",
        },
        "investigation": versions[-1],
        "earlier_versions": versions[:-1],
        "session": session[-1] if session else None,
        "hazard_space": hazard_space,
        "messages": {
            "block_fields": list(MESSAGE_BLOCK_FIELDS),
            "read_after_seq": read_after,
            "read_before_seq": read_before,
            "entries": messages,
        },
        "exchanges": exchanges,
        "events": events,
        "reputation_updates": reputation_updates,
    }


def review_conflicts(
    db: Path | str,
    *,
    session_id: str | None = None,
    limit: int = 100,
    password: str | None = None,
) -> list[dict[str, Any]]:
    """The newest `limit` ingest conflicts (of `session_id`, if given), newest first, each with
    both versions: `set_aside`, the item as it came (its record), and `stored`, the item that
    held its key or index when it came, found in the session by its digest (an index's: the
    message at that index), or None when the session does not hold it (a key used in another
    session, or a row older than the digests)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    where, params = ("", ()) if session_id is None else (" WHERE session_id = ?", (session_id,))
    with _snapshot(db, password) as conn:
        rows = list(
            conn.execute(
                f"SELECT id, record FROM ingest_conflicts{where} ORDER BY id DESC LIMIT ?",
                (*params, limit),
            )
        )
        sessions = _SessionItems(conn)
        return [
            _review(conflict_id, IngestConflict.model_validate_json(record), sessions)
            for conflict_id, record in rows
        ]


def _review(conflict_id: int, conflict: IngestConflict, sessions: _SessionItems) -> dict[str, Any]:
    item = conflict.message if conflict.message is not None else conflict.sample
    assert item is not None, "a conflict holds a message or a sample"
    return {
        "id": conflict_id,
        **conflict.model_dump(mode="json", exclude={"message", "sample"}),
        "set_aside": item.model_dump(mode="json"),
        "stored": _stored_version(sessions, conflict),
    }


class _SessionItems:
    """A session's stored messages and readings, read once each (rows of older schemas too)."""

    def __init__(self, conn: _Snapshot) -> None:
        self._conn = conn
        self._messages: dict[str, list[AgentMessage]] = {}
        self._samples: dict[str, list[TelemetrySample]] = {}

    def messages(self, session_id: str) -> list[AgentMessage]:
        if session_id not in self._messages:
            conn = self._conn
            rows = conn.execute("SELECT record FROM messages WHERE session_id = ?", (session_id,))
            older = [AgentMessage.model_validate_json(record) for (record,) in rows]
            blocks = conn.execute(
                "SELECT record FROM message_blocks WHERE session_id = ? ORDER BY id", (session_id,)
            )
            newer = [
                m
                for (record,) in blocks
                for m in MessageBlock.model_validate_json(record).to_messages()
            ]
            self._messages[session_id] = older + newer
        return self._messages[session_id]

    def samples(self, session_id: str) -> list[TelemetrySample]:
        if session_id not in self._samples:
            conn = self._conn
            rows = conn.execute("SELECT record FROM telemetry WHERE session_id = ?", (session_id,))
            older = [TelemetrySample.model_validate_json(record) for (record,) in rows]
            blocks = conn.execute(
                "SELECT record FROM telemetry_blocks WHERE session_id = ? ORDER BY id",
                (session_id,),
            )
            newer = [
                sample_of(block.session_id, row)
                for (record,) in blocks
                for block in [TelemetryBlock.model_validate_json(record)]
                for row in block.samples
            ]
            self._samples[session_id] = older + newer
        return self._samples[session_id]


def _stored_version(sessions: _SessionItems, conflict: IngestConflict) -> dict[str, Any] | None:
    """The stored item `conflict` met (see `review_conflicts`), as its record."""
    held = bytes.fromhex(conflict.stored_digest)
    if conflict.message is not None:
        messages = sessions.messages(conflict.session_id)
        if conflict.reason == "index":
            index = conflict.message.index
            candidates = [m for m in messages if m.index == index]
        else:
            candidates = [m for m in messages if message_digest(m) == held]
        return candidates[0].model_dump(mode="json") if candidates else None
    session_crc = zlib.crc32(conflict.session_id.encode())
    for sample in sessions.samples(conflict.session_id):
        if reading_digest(session_crc, sample.component, sample.signal, sample.value) == held:
            return sample.model_dump(mode="json")
    return None


def _entries(conn: _Snapshot, kind: str, ref: str) -> list[dict[str, Any]]:
    """Every entry of one record, oldest first."""
    rows = conn.execute(f"{_ENTRY} WHERE kind = ? AND ref = ? ORDER BY seq", (kind, ref))
    return [_envelope(row) for row in rows]


def _rows_of(conn: _Snapshot, kind: str, where: str, key: str) -> list[dict[str, Any]]:
    """The latest entry of each row of `kind` selected by `where`, in its order."""
    table = _TABLES[kind]
    found = []
    for row in conn.execute(f"{table.select} WHERE {where}", (key,)):
        entry = conn.execute(
            f"{_ENTRY} WHERE kind = ? AND ref = ? ORDER BY seq DESC LIMIT 1",
            (kind, table.ref(row)),
        ).fetchone()
        if entry is None:
            raise AuditError(f"{kind} {table.ref(row)} has no audit entry; run verify")
        found.append(_envelope(entry))
    return found


def _envelope(entry: Row) -> dict[str, Any]:
    seq, kind, ref, payload, prev_hash, digest = entry
    return {
        "seq": seq,
        "kind": kind,
        "ref": ref,
        "prev_hash": prev_hash,
        "hash": digest,
        "record": json.loads(payload),
    }


class _Cursor(Protocol):
    def fetchone(self) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class _Snapshot(Protocol):
    """One read transaction on a store's database, whichever adapter wrote it."""

    where: str  # the database, as errors name it
    # The investigation a reputation entry's payload names, as an SQL expression.
    payload_investigation: str

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor: ...

    def scan(self, sql: str) -> Iterable[Row]:
        """The rows of a query over a whole table, read as they are iterated (never all held at
        once)."""

    def latest_entries(self, kind: str, refs: Sequence[str]) -> dict[str, tuple[int, str]]:
        """The (seq, payload) of the latest entry of each of these refs that has one."""

    def first_removed_row(self, table: AuditedTable) -> BrokenLink | None:
        """The ref whose row is gone, by lowest latest seq (run only when refs outnumber
        rows)."""


class _SqliteSnapshot:
    payload_investigation = "json_extract(payload, '$.investigation_id')"

    def __init__(self, conn: sqlite3.Connection, where: str) -> None:
        self._conn = conn
        self.where = where

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        return self._conn.execute(sql, params)

    def scan(self, sql: str) -> Iterable[Row]:
        return self._conn.execute(sql)  # sqlite3 steps through the rows as they are read

    def latest_entries(self, kind: str, refs: Sequence[str]) -> dict[str, tuple[int, str]]:
        """One indexed lookup per ref: in-process, cheaper than building a query of them."""
        found = {}
        for ref in refs:
            if (latest := self._conn.execute(_LATEST, (kind, ref)).fetchone()) is not None:
                found[ref] = (int(latest[0]), latest[1])
        return found

    def first_removed_row(self, table: AuditedTable) -> BrokenLink | None:
        """The refs present go to a temporary table (a file, like any SQLite temp table), not to
        memory."""
        self._conn.execute("CREATE TEMP TABLE present (ref TEXT PRIMARY KEY)")
        try:
            self._conn.executemany(
                "INSERT OR IGNORE INTO temp.present VALUES (?)",
                ((table.ref(row),) for row in self._conn.execute(table.select)),
            )
            found = self._conn.execute(
                "SELECT max(seq), ref FROM audit WHERE kind = ?"
                " AND ref NOT IN (SELECT ref FROM temp.present) GROUP BY ref ORDER BY 1 LIMIT 1",
                (table.kind,),
            ).fetchone()
        finally:
            self._conn.execute("DROP TABLE temp.present")
        return _removed(table, found)


class _PgSnapshot:
    payload_investigation = "payload::jsonb ->> 'investigation_id'"

    def __init__(self, conn: psycopg.Connection[Any], where: str) -> None:
        self._pg = conn
        self.where = where
        self._scans = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        return self._pg.execute(sql.replace("?", "%s").encode(), params)

    def scan(self, sql: str) -> Iterable[Row]:
        """A server-side cursor, fetched a chunk at a time (a plain one would hold the whole
        table in memory); other statements may run between its fetches."""
        self._scans += 1
        with self._pg.cursor(name=f"scan_{self._scans}") as cursor:
            cursor.itersize = _CHUNK
            cursor.execute(sql.encode())
            yield from cursor

    def latest_entries(self, kind: str, refs: Sequence[str]) -> dict[str, tuple[int, str]]:
        """One query for them all: a round trip per ref would dominate over a network."""
        rows = self.execute(
            "SELECT DISTINCT ON (ref) ref, seq, payload FROM audit"
            " WHERE kind = ? AND ref = ANY(?) ORDER BY ref, seq DESC",
            (kind, list(refs)),
        )
        return {ref: (int(seq), payload) for ref, seq, payload in rows}

    def first_removed_row(self, table: AuditedTable) -> BrokenLink | None:
        """The refs present are held in memory: a read-only transaction makes no temporary
        table (and this runs only once rows were found missing)."""
        present = sorted({table.ref(row) for row in self.scan(table.select)})
        found = self.execute(
            "SELECT max(seq), ref FROM audit WHERE kind = ? AND NOT (ref = ANY(?))"
            " GROUP BY ref ORDER BY 1 LIMIT 1",
            (table.kind, present),
        ).fetchone()
        return _removed(table, found)


def _removed(table: AuditedTable, found: Row | None) -> BrokenLink | None:
    if found is None:
        return None
    return BrokenLink(found[0], table.kind, found[1], f"its row is missing from {table.table}")


def is_database_url(db: Path | str) -> bool:
    return isinstance(db, str) and db.partition("://")[0] in SCHEMES


def _snapshot(db: Path | str, password: str | None) -> AbstractContextManager[_Snapshot]:
    """A read transaction on the database `db` names: a postgresql:// URL, else a file."""
    if is_database_url(db):
        return _pg_snapshot(str(db), password)
    return _sqlite_snapshot(Path(db))


@contextmanager
def _sqlite_snapshot(path: Path) -> Iterator[_Snapshot]:
    """A read transaction on `path`; an unreadable file, table or row is an AuditError."""
    if not path.is_file():
        raise AuditError(f"{path}: no such database file")
    with closing(connect_read_only(path)) as conn:
        try:
            conn.execute("BEGIN")  # every read below sees this one committed state
            _check_version(str(path), conn.execute("PRAGMA user_version").fetchone()[0])
            yield _SqliteSnapshot(conn, str(path))
        except sqlite3.DatabaseError as exc:
            raise AuditError(f"{path} cannot be read: {exc}") from exc


@contextmanager
def _pg_snapshot(url: str, password: str | None) -> Iterator[_Snapshot]:
    """A REPEATABLE READ, READ ONLY transaction on the database; an unreachable server, a
    missing table or an unreadable row is an AuditError (naming the URL without password)."""
    where = redacted(url)
    extra: dict[str, Any] = {"password": password} if password is not None else {}
    try:
        conn = psycopg.connect(url, **extra)
    except psycopg.Error as exc:
        problem = scrubbed(str(exc), url, password)
        raise AuditError(f"cannot connect to {where}: {problem}".strip()) from None
    with conn:
        conn.read_only = True
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            version = conn.execute(pg_schema.CURRENT_VERSION.encode()).fetchone()
            _check_pg_version(where, int(version[0]) if version else 0)
            yield _PgSnapshot(conn, where)
        except psycopg.Error as exc:
            raise AuditError(f"{where} cannot be read: {exc}".strip()) from exc


def _check_pg_version(where: str, version: int) -> None:
    if version != pg_schema.SCHEMA_VERSION:
        raise AuditError(
            f"{where} has schema version {version}; this poirotd audits version"
            f" {pg_schema.SCHEMA_VERSION}"
        )


def _check_version(path: str, version: int) -> None:
    if version == 1:
        raise AuditError(
            f"{path} has schema 1, from before the audit chain; open it once with this"
            " poirotd (`poirotd run`) to migrate it: the chain then starts at migration"
        )
    if version != SCHEMA_VERSION:
        raise AuditError(
            f"{path} has schema version {version}; this poirotd audits version {SCHEMA_VERSION}"
        )
