"""Exactly-once storage of keyed ingest items, and the conflicts that are not copies: the part
every store adapter shares.

An item (or the rows of one telemetry delivery) may carry a producer's key (`ItemKey`). In the
commit's transaction the adapter looks up which of the batch's keys it already holds, each with
the digest of the content it was stored with (`wanted`, then its own query, then `seen_in`).
`drop_seen` leaves out an item whose key is held by the same content (a copy: a resend, a
redelivery; a key met twice in the batch is the first holder's) and sets aside one whose key is
held by other content (a conflict: a producer that reused a number, or a client naming another's
key), and the adapter records the new keys as runs of consecutive seqs with their digests
(`key_rows`): a forwarder numbers its items one after the other, so a commit of thousands of them
adds one row per producer, while keys that arrive scattered (a shared MQTT subscription splits a
producer's messages among replicas) cost a row each. Rows older than the window are pruned: a
copy that arrives later than that after its first was committed is stored again.

A message is also stored once per (session, index): an index held by the same message is a
resend, one held by another message is a conflict too (`index_outcome`; the adapters keep each
stored message's digest beside its index). A conflict is never dropped: the adapter stores it as
an `IngestConflict` (`conflict_record`) in the audit chain, and the pipeline counts and logs it.

Digests: a message's is a BLAKE2b of who said what to whom in which session (not its index, which
the daemon gives a redelivery anew, nor its time, which a payload without one takes on receipt);
a reading's is its value exactly and CRC-32s of its names and session (cheap at sensor rates; a
reading's key only meets what its own scoped producer sent, so nobody else can craft a match).
Session starts and ends are idempotent by their session id and carry no digest (`UNKNOWN`), as do
keys and indexes stored before digests were (schema 11): those only ever drop copies.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, repeat
from operator import attrgetter
from typing import NamedTuple, cast

import orjson

from poirotd.model import (
    AgentMessage,
    CommitItem,
    ConflictReason,
    IngestConflict,
    ItemKey,
    SampleRow,
    TelemetryBatch,
    TelemetrySample,
    sample_of,
)

# The position of each item of a commit that copies of stored items were dropped from, and how
# many units were dropped there (1 for an item, its rows for a telemetry batch).
Duplicates = dict[int, int]

DIGEST_BYTES = 16
# The digest of what has none (a session start or end, a key stored before digests were): it
# matches every content, so such a key or index only ever drops copies.
UNKNOWN = bytes(DIGEST_BYTES)
_READING = struct.Struct("<dII")
_MESSAGE_HASH = hashlib.blake2b(digest_size=DIGEST_BYTES)
# Who said what to whom in which session: what a message's digest covers.
_message_content = attrgetter(
    "session_id", "kind", "sender", "recipient", "content", "tool_calls", "tool_name"
)


def message_digest(message: AgentMessage) -> bytes:
    digest = _MESSAGE_HASH.copy()  # a copy costs a quarter less than a new hash object
    digest.update(orjson.dumps(_message_content(message)))
    return digest.digest()


def reading_digest(session_crc: int, component: str, signal: str, value: float) -> bytes:
    """`session_crc`: `zlib.crc32` of the session id (the same for a whole batch)."""
    names = zlib.crc32(f"{component}\0{signal}".encode())
    return _READING.pack(value, names, session_crc)


def row_digests(batch: TelemetryBatch) -> list[bytes]:
    """`reading_digest` of each row, its formula inlined: at sensor rates a call a row costs
    two thirds more (0.2 µs; a test holds the two equal)."""
    session_crc, pack, crc32 = zlib.crc32(batch.session_id.encode()), _READING.pack, zlib.crc32
    return [pack(v, crc32(f"{c}\0{s}".encode()), session_crc) for c, s, v, _ in batch.rows]


def item_digest(item: CommitItem) -> bytes:
    """A keyed item's digest (a telemetry batch's rows have their own)."""
    if isinstance(item, AgentMessage):
        return message_digest(item)
    if isinstance(item, TelemetrySample):
        session_crc = zlib.crc32(item.session_id.encode())
        return reading_digest(session_crc, item.component, item.signal, item.value)
    return UNKNOWN


def same_content(stored: bytes, digest: bytes) -> bool:
    return stored in (digest, UNKNOWN) or digest == UNKNOWN


def wanted(items: Sequence[CommitItem], keys: Sequence[ItemKey | None]) -> dict[str, set[int]]:
    """The seqs of every key in the batch, by producer (empty: nothing is keyed)."""
    by_producer: dict[str, set[int]] = {}
    for key in _all_keys(items, keys):
        by_producer.setdefault(key.producer, set()).add(key.seq)
    return by_producer


def _all_keys(items: Sequence[CommitItem], keys: Sequence[ItemKey | None]) -> Iterable[ItemKey]:
    for key in keys:
        if key is not None:
            yield key
    for item in items:
        if isinstance(item, TelemetryBatch) and item.keys is not None:
            yield from (key for key in item.keys if key is not None)


def seen_in(
    stored: Iterable[tuple[str, int, int, bytes | None]], wanted: Mapping[str, set[int]]
) -> dict[ItemKey, bytes]:
    """The batch's `wanted` keys that stored runs (producer, first, last, digests) hold, each
    with the digest it was stored with (`UNKNOWN` for a run stored without digests)."""
    found: dict[ItemKey, bytes] = {}
    for producer, first, last, digests in stored:
        for seq in wanted[producer]:
            if first <= seq <= last:
                start = (seq - first) * DIGEST_BYTES
                digest = (
                    UNKNOWN if digests is None else bytes(digests[start : start + DIGEST_BYTES])
                )
                found[ItemKey(producer, seq)] = digest
    return found


def key_rows(kept: Kept, stored_us: int) -> list[tuple[str, int, int, int, bytes]]:
    """The rows (producer, last, first, stored_us, digests) that record a commit's new keys, a
    run each, its digests in seq order."""
    digests = kept.new_digests
    rows = []
    for producer, seqs in kept.new_keys.items():
        for first, last in runs(seqs):
            if first == last:  # scattered keys: a row each
                blob = digests[producer, first]
            else:
                blob = b"".join([digests[producer, seq] for seq in range(first, last + 1)])
            rows.append((producer, last, first, stored_us, blob))
    return rows


@dataclass(frozen=True)
class Conflict:
    """An item (or a telemetry batch's row, as a sample) set aside, at its batch position."""

    position: int
    reason: ConflictReason
    item: AgentMessage | TelemetrySample
    key: ItemKey | None
    digest: bytes
    stored_digest: bytes


class StoredConflict(NamedTuple):
    """A conflict as the commit stored it: its batch position and its row's id."""

    position: int
    conflict_id: int
    record: IngestConflict


@dataclass(frozen=True)
class LeftOut:
    """What a commit did not store: copies of stored items (`duplicates`, by position) and
    conflicts, each kept in the store's `ingest_conflicts`."""

    duplicates: Duplicates = field(default_factory=dict)
    conflicts: tuple[StoredConflict, ...] = ()

    def conflicted(self) -> Duplicates:
        """How many units each position lost to conflicts."""
        counts: Duplicates = {}
        for conflict in self.conflicts:
            counts[conflict.position] = counts.get(conflict.position, 0) + 1
        return counts


def conflict_record(conflict: Conflict, at: datetime) -> IngestConflict:
    item = conflict.item
    key = conflict.key or ItemKey("", 0)
    return IngestConflict(
        at=at,
        reason=conflict.reason,
        session_id=item.session_id,
        producer=key.producer,
        seq=key.seq,
        message=item if isinstance(item, AgentMessage) else None,
        sample=item if isinstance(item, TelemetrySample) else None,
        digest=conflict.digest.hex(),
        stored_digest=conflict.stored_digest.hex(),
    )


@dataclass
class Kept:
    """What `drop_seen` leaves: the items to store (with their positions in the batch), the
    duplicates it dropped, the conflicts it set aside, the new keys to record (their seqs by
    producer, and each one's digest), and the digests it computed of the messages it kept (by
    `id`)."""

    items: list[CommitItem] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    duplicates: Duplicates = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    new_keys: Mapping[str, Collection[int]] = field(default_factory=dict)
    # Keyed by (producer, seq): an ItemKey is that tuple, and looking one up needs no ItemKey.
    new_digests: dict[tuple[str, int], bytes] = field(default_factory=dict)
    digests: dict[int, bytes] = field(default_factory=dict)

    def is_copy(self, position: int, held: bytes, digest: bytes) -> bool:
        """Whether an item (or row) at `position` whose key or index is held by content
        `held` is a copy (counted here); else the caller sets it aside as a conflict."""
        if not same_content(held, digest):
            return False
        self.duplicates[position] = self.duplicates.get(position, 0) + 1
        return True


def kept_all(items: Sequence[CommitItem]) -> Kept:
    """A batch without keys: every item is kept (its messages may still be resends)."""
    return Kept(list(items), list(range(len(items))))


class _Claims:
    """The keys held so far: the stored ones (`seen`: key -> digest) and the batch's own, which
    are the new keys to record (`kept`'s)."""

    def __init__(self, seen: Mapping[ItemKey, bytes], kept: Kept):
        self._seen = seen
        self._claimed = kept.new_digests
        self._new_keys: dict[str, list[int]] = {}
        kept.new_keys = self._new_keys

    def claim(self, key: ItemKey, digest: bytes) -> bytes | None:
        """None when `key` was free (it is claimed now), else the digest that holds it."""
        held = self._seen.get(key)
        if held is None:
            held = self._claimed.get(key)
        if held is None:
            self._claimed[key] = digest
            self._new_keys.setdefault(key.producer, []).append(key.seq)
        return held


def drop_seen(
    items: Sequence[CommitItem],
    keys: Sequence[ItemKey | None],
    seen: Mapping[ItemKey, bytes],
    wanted: Mapping[str, Collection[int]] | None = None,
) -> Kept:
    """Leaves out every item (or row) whose key is held, in `seen` (key -> stored digest) or by
    an earlier item or row of the batch, by the same content, and sets aside as a conflict one
    whose key is held by other content; a telemetry batch loses those rows (and is left out when
    none remains). `wanted`, the batch's `wanted` keys, when given: if none is seen and no key
    repeats (the batch has as many keys as `wanted` holds), every item is kept and its keys are
    the new keys, without a claim of each (the usual commit: about 0.5 µs a key less)."""
    if wanted is not None and not seen:
        distinct = sum(map(len, wanted.values()))
        if distinct == sum(1 for _ in _all_keys(items, keys)):
            return _all_new(items, keys, wanted)
    kept = Kept()
    claims = _Claims(seen, kept)
    for position, item in enumerate(items):
        key = keys[position] if position < len(keys) else None
        if isinstance(item, TelemetryBatch) and item.keys is not None:
            batch = _fresh_rows(position, item, claims, kept)
            if batch is None:
                continue
            item = batch
        elif key is not None:
            digest = item_digest(item)
            held = claims.claim(key, digest)
            if held is not None:
                if not kept.is_copy(position, held, digest):
                    assert isinstance(item, AgentMessage | TelemetrySample), "only they digest"
                    kept.conflicts.append(Conflict(position, "key", item, key, digest, held))
                continue
            if isinstance(item, AgentMessage):
                kept.digests[id(item)] = digest
        kept.items.append(item)
        kept.positions.append(position)
    return kept


def _all_new(
    items: Sequence[CommitItem],
    keys: Sequence[ItemKey | None],
    wanted: Mapping[str, Collection[int]],
) -> Kept:
    """`drop_seen` of a batch whose keys are all new and distinct: every item kept, `wanted`
    its new keys."""
    kept = kept_all(items)
    kept.new_keys = wanted
    digests: dict[ItemKey | None, bytes] = {}
    for item, key in zip(items, chain(keys, repeat(None)), strict=False):  # keys may be ()
        if isinstance(item, TelemetryBatch):
            if item.keys is not None:
                digests.update(zip(item.keys, row_digests(item), strict=True))
        elif key is None:
            continue
        elif isinstance(item, AgentMessage):
            digests[key] = kept.digests[id(item)] = message_digest(item)
        else:
            digests[key] = item_digest(item)
    digests.pop(None, None)  # a batch's unkeyed rows: what is left is keyed by ItemKeys
    kept.new_digests = cast(dict[tuple[str, int], bytes], digests)
    return kept


def _fresh_rows(
    position: int, batch: TelemetryBatch, claims: _Claims, kept: Kept
) -> TelemetryBatch | None:
    """The batch without its rows whose keys are held (None: no row is left)."""
    assert batch.keys is not None, "only for a keyed batch"
    rows: list[SampleRow] = []
    row_keys: list[ItemKey | None] = []
    for row, key, digest in zip(batch.rows, batch.keys, row_digests(batch), strict=True):
        if key is not None:
            held = claims.claim(key, digest)
            if held is not None:
                if not kept.is_copy(position, held, digest):
                    sample = sample_of(batch.session_id, row)
                    kept.conflicts.append(Conflict(position, "key", sample, key, digest, held))
                continue
        rows.append(row)
        row_keys.append(key)
    if len(rows) == len(batch.rows):
        return batch
    return TelemetryBatch(batch.session_id, rows, row_keys) if rows else None


def message_digests(messages: Iterable[AgentMessage], known: Mapping[int, bytes]) -> list[bytes]:
    """Each message's digest, those `drop_seen` computed (`Kept.digests`) taken as they are."""
    return [known.get(id(m)) or message_digest(m) for m in messages]


def index_outcome(
    kept: Kept,
    position: int,
    message: AgentMessage,
    digest: bytes,
    held: bytes,
    keys: Sequence[ItemKey | None],
) -> None:
    """A message whose session and index a stored (or earlier) message holds, with digest
    `held`: a copy (counted) or a conflict (set aside, with its key if it has one)."""
    if not kept.is_copy(position, held, digest):
        key = keys[position] if position < len(keys) else None
        kept.conflicts.append(Conflict(position, "index", message, key, digest, held))


class KeyWindow:
    """How long keys are kept after their commit, and when they were last pruned (per store)."""

    # Pruning is one indexed DELETE; once a minute keeps it off most commits.
    PRUNE_EVERY_US = 60_000_000

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"idempotency_window must be positive, not {seconds}")
        self.window_us = int(seconds * 1_000_000)
        self.pruned_us = 0

    def prune_before(self, now_us: int) -> int | None:
        """The commit time before which keys are to be deleted now, or None: not yet."""
        if now_us - self.pruned_us < self.PRUNE_EVERY_US:
            return None
        self.pruned_us = now_us
        return now_us - self.window_us


def runs(seqs: Collection[int]) -> list[tuple[int, int]]:
    """The seqs as (first, last) runs of consecutive numbers, ascending."""
    if len(seqs) == 1:  # a producer with one key in the commit: an OTLP span's one message
        (seq,) = seqs
        return [(seq, seq)]
    result: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if result and result[-1][1] + 1 == seq:
            result[-1] = (result[-1][0], seq)
        else:
            result.append((seq, seq))
    return result
