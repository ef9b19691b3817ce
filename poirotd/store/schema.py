"""The store's tables and how a file becomes a store of the current schema: creation, migrations
from older schemas, and the connections the store's threads use."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import datetime
from pathlib import Path

from poirotd.model import Session
from poirotd.store.chain import Chain, Row, transaction
from poirotd.store.records import (
    EVENTS,
    EXCHANGES,
    HAZARD_SPACES,
    INVESTIGATIONS,
    MESSAGES,
    SESSIONS,
    TELEMETRY,
    session_row,
)

# 2: the audit chain; sessions keep their record as JSON like every other table.
# 3: agents' reputations (a new table; a schema-2 store gains it empty when opened).
# 4: telemetry in blocks (a new table; a schema-3 store keeps its per-sample rows as they are).
# 5: messages in blocks, deduplicated through `message_indices` (a schema-4 store keeps its
#    per-message rows, and their indices are added there when it is opened).
# 6: a message block's rows end with the message's trace and span id (rows of older blocks,
#    without them, are read as messages with no trace link).
# 7: calls refused by the transports' authentication (a new table; a schema-6 store gains it
#    empty when opened).
# 8: ErrorProbe's verified diagnosis memory (a new table; a schema-7 store gains it empty when
#    opened).
# 9: idempotency keys of ingest items (`ingest_keys`, runs of a producer's seqs; a new table, a
#    schema-8 store gains it empty when opened).
# 10: replicas over one store: an investigation's lease (owner, end, fencing token; operational
#    state beside the record, not chained) and the hazard openings a cooldown is checked against
#    (derived, like message_indices). A schema-8 or -9 store gains them when opened.
# 11: a hazard is never lost: investigation records may be DEFERRED (a rule's, while the queue is
#    full) and carry the triggers coalesced into them and who requested them. No table changes;
#    the version keeps an older poirotd, which would refuse such records, off the store.
#    Also conflicts, an ingest item whose key or (session, index) other content held (a new
#    audited table, `ingest_conflicts`), told from copies by the content digests `ingest_keys`
#    (per run) and `message_indices` (per message) now keep; an older store's rows have none and
#    only ever drop copies. A schema-8 to -10 store gains
#    them when opened.
# 12: a fault campaign's seed of the agents' β and methods' reliabilities (`campaign_seeds`, an
#    audited table kept apart from the confirmed reputations; a schema-11 store gains it empty).
# 13: GenAI log events parked while they wait for their span (`parked_log_events`, operational
#    state like a lease, not chained; a schema-12 store gains it empty when opened).
SCHEMA_VERSION = 13
_BUSY_TIMEOUT_MS = 5_000

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
    digest     BLOB,
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
    record           TEXT NOT NULL,
    lease_owner      TEXT,
    lease_until_us   INTEGER,
    lease_token      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS investigations_by_time
    ON investigations (created_us, investigation_id);
CREATE INDEX IF NOT EXISTS investigations_by_session
    ON investigations (session_id, created_us, investigation_id);
CREATE INDEX IF NOT EXISTS investigations_by_state
    ON investigations (state, created_us, investigation_id);
CREATE TABLE IF NOT EXISTS hazard_openings (
    session_id       TEXT NOT NULL,
    at_us            INTEGER NOT NULL,
    investigation_id TEXT NOT NULL,
    PRIMARY KEY (session_id, at_us, investigation_id)
) WITHOUT ROWID;
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
CREATE TABLE IF NOT EXISTS campaign_seeds (
    system TEXT PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS access_denials (
    id     INTEGER PRIMARY KEY,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ingest_conflicts (
    id         INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    record     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ingest_conflicts_by_session ON ingest_conflicts (session_id, id);
CREATE TABLE IF NOT EXISTS diagnosis_memory (
    system   TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    record   TEXT NOT NULL,
    PRIMARY KEY (system, entry_id)
);
CREATE TABLE IF NOT EXISTS ingest_keys (
    producer  TEXT NOT NULL,
    last_seq  INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    stored_us INTEGER NOT NULL,
    digests   BLOB,
    PRIMARY KEY (producer, last_seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ingest_keys_by_age ON ingest_keys (stored_us);
CREATE TABLE IF NOT EXISTS parked_log_events (
    owner      TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    trace_id   TEXT NOT NULL,
    span_id    TEXT NOT NULL,
    arrived_us INTEGER NOT NULL,
    position   INTEGER NOT NULL,
    record     TEXT NOT NULL,
    owned_us   INTEGER NOT NULL,
    PRIMARY KEY (owner, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS parked_log_events_by_age ON parked_log_events (owned_us);
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


def open_writer(path: Path, synchronous: str) -> tuple[sqlite3.Connection, set[str]]:
    conn = _connect(path)
    try:
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        with transaction(conn) as chain:
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
            if 0 < version < 10:
                _add_lease_columns(conn)
            if 0 < version < 11:
                _add_columns(conn, "message_indices", ("digest BLOB",))
                _add_columns(conn, "ingest_keys", ("digests BLOB",))
            if version < 5:  # the messages stored one per row are deduplicated against too
                conn.execute(
                    "INSERT OR IGNORE INTO message_indices (session_id, idx)"
                    " SELECT session_id, idx FROM messages"
                )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        sessions = {sid for (sid,) in conn.execute("SELECT session_id FROM sessions")}
    except BaseException:
        conn.close()
        raise
    return conn, sessions


def _add_lease_columns(conn: sqlite3.Connection) -> None:
    """Schema 10's lease columns on an older store's investigations (none is leased)."""
    columns = (
        "lease_owner TEXT",
        "lease_until_us INTEGER",
        "lease_token INTEGER NOT NULL DEFAULT 0",
    )
    _add_columns(conn, "investigations", columns)


def _add_columns(conn: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> None:
    """The `columns` (definitions) an older store's `table` lacks."""
    present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    for column in columns:
        if column.split()[0] not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")


def open_reader(path: Path) -> tuple[sqlite3.Connection, None]:
    conn = _connect(path)
    conn.execute("PRAGMA query_only = ON")
    return conn, None


# The audited tables schema 1 had besides sessions (reputations came with schema 3).
_V1_TABLES = (HAZARD_SPACES, INVESTIGATIONS, MESSAGES, TELEMETRY, EVENTS, EXCHANGES)


def _migrate_from_v1(conn: sqlite3.Connection, chain: Chain, path: Path) -> None:
    """Chains every schema-1 row as it is now, table by table (hazard spaces in the order they
    were put, so the latest stays latest), rewriting each record into its canonical form.

    The rows are read through a second connection: it sees the committed schema-1 state, so
    the rewrites on `conn` (this transaction) cannot disturb the scans.
    """
    conn.execute("ALTER TABLE sessions ADD COLUMN record TEXT NOT NULL DEFAULT ''")
    v1_sessions = "session_id, system, started_at, ended_at, labels"
    scans = [
        (SESSIONS, v1_sessions, _v1_session_row),
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
    return session_row(session)
