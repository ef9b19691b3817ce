"""The audit chain (EU AI Act Art. 12): the canonical encoding every record is stored and hashed
in, entry hashes, and the appends of one write transaction.

Every write of a record (a session started or ended, a block of messages or of telemetry, a hazard
space, each save of an investigation, an event, an LLM exchange, an agent's reputation, an entry of
ErrorProbe's memory) also appends, in the same transaction, an entry (seq, kind, ref, payload,
prev_hash, hash) to the append-only `audit` table. `ref` is the record's key within its kind;
`payload` is the record in canonical JSON (`encode_record`), byte for byte the text its table
stores, so a check needs no re-encoding that a future model change could alter; hash =
`entry_hash(prev_hash, kind, ref, payload)`, starting from `GENESIS_HASH`.
`poirotd.store.records.AUDITED_TABLES` says, per kind, how a row gives its ref and which columns
its record determines; `poirotd.store.audit` verifies and exports with it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from _json import make_encoder
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeAlias

from pydantic import BaseModel

Row: TypeAlias = tuple[Any, ...]

APPEND_AUDIT = (
    "INSERT INTO audit (seq, kind, ref, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?)"
)

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


class Links:
    """The entries one write transaction appends, each hashed as it comes from the head before
    it. Nothing outlives the transaction, so a rollback needs no undo, and entries commit exactly
    when the records they cover do. An adapter stores `take()`'s rows (`APPEND_AUDIT`'s columns)
    before it commits."""

    def __init__(self, head: tuple[int, str] | None = None) -> None:
        """`head`: the chain's latest (seq, hash) as the transaction found it, (0, GENESIS_HASH)
        for an empty chain; None when a subclass reads it at the first append."""
        # (seq, hash as bytes, the same in hex): each hash is hexed once, for its own row.
        self._head = None if head is None else (head[0], bytes.fromhex(head[1]), head[1])
        self._pending: list[Row] = []

    def _current(self) -> tuple[int, bytes, str]:
        assert self._head is not None, "no head to append to"
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

    def take(self) -> list[Row]:
        """The entries appended since the last take, in order."""
        rows, self._pending = self._pending, []
        return rows


class Chain(Links):
    """The links of one SQLite write transaction: reads the head at the first append, inserts
    entries in batches."""

    _FLUSH_AT = 1_000  # bounds memory in a long transaction (the migration of a large store)

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__()
        self._conn = conn

    def _current(self) -> tuple[int, bytes, str]:
        if self._head is None:
            row = self._conn.execute(
                "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            seq, head = (row[0], row[1]) if row else (0, GENESIS_HASH)
            self._head = (seq, bytes.fromhex(head), head)
        return self._head

    def append(self, kind: str, ref: str, payload: str) -> None:
        super().append(kind, ref, payload)
        if len(self._pending) >= self._FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        self._conn.executemany(APPEND_AUDIT, self.take())


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[Chain]:
    # IMMEDIATE takes the write lock up front, so COMMIT cannot fail on a lock upgrade.
    conn.execute("BEGIN IMMEDIATE")
    try:
        chain = Chain(conn)
        yield chain
        chain.flush()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
