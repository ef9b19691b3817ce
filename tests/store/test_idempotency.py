"""Exactly-once storage of keyed ingest items on each adapter (a SQLite file, a real PostgreSQL):
a resent copy is dropped (and reported), whatever index the daemon gave it, in the same batch or
a later one, across a reopen and from another store on the same database; keys older than the
window are pruned. A key or a message's index held by other content is a conflict: set aside in
the chained `ingest_conflicts`, never dropped as a copy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest

from poirotd.model import CommitItem, IngestConflict, ItemKey, SampleRow, TelemetryBatch
from poirotd.store import Store
from poirotd.store.audit import review_conflicts, verify
from poirotd.store.idempotency import (
    UNKNOWN,
    KeyWindow,
    drop_seen,
    item_digest,
    message_digest,
    row_digests,
    runs,
    wanted,
)
from tests.support.store import T0, message, sample, session
from tests.support.stores import StoreDb


@pytest.fixture
async def store(store_db: StoreDb) -> AsyncIterator[Store]:
    s = await store_db.open()
    yield s
    await s.close()


def _rows(n: int, first: int = 0) -> list[SampleRow]:
    return [("knee_motor", "torque", float(i), T0 + timedelta(seconds=i)) for i in range(first, n)]


def _count(db: StoreDb, sql: str) -> int:
    return int(db.query(sql)[0][0])


def key(seq: int, producer: str = "bridge-a") -> ItemKey:
    return ItemKey(producer, seq)


async def duplicates(
    store: Store, items: Sequence[CommitItem], keys: Sequence[ItemKey | None] = ()
) -> dict[int, int]:
    """Commits the batch, which must set nothing aside; what it dropped as copies."""
    left_out = await store.commit_ingest(items, keys)
    assert left_out.conflicts == ()
    return left_out.duplicates


def conflicts(db: StoreDb) -> list[IngestConflict]:
    rows = db.query("SELECT record FROM ingest_conflicts ORDER BY id")
    return [IngestConflict.model_validate_json(record) for (record,) in rows]


async def test_a_resent_message_is_dropped_whatever_index_it_was_given(
    store: Store, store_db: StoreDb
) -> None:
    """The daemon numbers a redelivered MQTT or OTLP message anew: only its key tells."""
    await store.commit_ingest([session()])
    assert await duplicates(store, [message(0), message(1)], [key(1), key(2)]) == {}
    copy = message(7, content="message 1")
    resent = await duplicates(store, [copy, message(8), message(2)], [key(2), None, key(3)])
    assert resent == {0: 1}, "the copy of key 2 is dropped; an unkeyed message is not"
    stored = await store.session_messages("s1")
    assert [m.index for m in stored] == [0, 1, 2, 8]
    assert verify(store_db.target).ok, "a dropped copy leaves the chain intact"


async def test_a_message_resent_with_its_index_is_reported_as_a_duplicate(store: Store) -> None:
    await store.commit_ingest([session(), message(0)])
    assert await duplicates(store, [message(0), message(1)]) == {0: 1}


async def test_telemetry_rows_keep_their_keys_and_partial_resends_keep_the_new(
    store: Store, store_db: StoreDb
) -> None:
    await store.commit_ingest([session()])
    rows = _rows(6)
    first = TelemetryBatch("s1", rows[:4], [key(10), key(11), key(12), key(13)])
    assert await duplicates(store, [first]) == {}
    again = TelemetryBatch("s1", rows[2:], [key(12), key(13), key(14), key(15)])
    assert await duplicates(store, [again]) == {0: 2}
    assert _count(store_db, "SELECT count(*) FROM telemetry_samples") == 6
    readings = await store.newest_readings("s1")
    assert [r.value for r in readings] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


async def test_a_key_met_twice_in_one_batch_keeps_its_first_holder(
    store: Store, store_db: StoreDb
) -> None:
    await store.commit_ingest([session()])
    copies: list[CommitItem] = [
        sample(0, 1.0),
        sample(1, 1.0),
        message(0),
        message(1, content="message 0"),
    ]
    assert await duplicates(store, copies, [key(1), key(1), key(2), key(2)]) == {1: 1, 3: 1}
    assert _count(store_db, "SELECT count(*) FROM telemetry_samples") == 1
    assert _count(store_db, "SELECT count(*) FROM agent_messages") == 1
    # Other content under a key the batch's first holder took is set aside, not dropped.
    left_out = await store.commit_ingest([sample(2, 2.0), sample(3, 3.0)], [key(3), key(3)])
    assert left_out.duplicates == {} and [c.position for c in left_out.conflicts] == [1]
    assert [c.sample and c.sample.value for c in conflicts(store_db)] == [3.0]
    (reviewed,) = review_conflicts(store_db.target)
    assert (reviewed["set_aside"]["value"], reviewed["stored"]["value"]) == (3.0, 2.0)


async def test_consecutive_keys_are_kept_as_one_run_per_producer(
    store: Store, store_db: StoreDb
) -> None:
    await store.commit_ingest([session()])
    samples = [sample(i, float(i)) for i in range(1000)]
    keys = [key(i + 1) for i in range(500)] + [key(i + 1, "bridge-b") for i in range(500)]
    await store.commit_ingest(samples, keys)
    assert _count(store_db, "SELECT count(*) FROM ingest_keys") == 2
    # A resend from the middle of the first run, running past its end: each copy is told by
    # the digest its run keeps for its seq.
    later = [sample(1000 + i, float(490 + i)) for i in range(20)]
    dropped = await duplicates(store, later, [key(491 + i) for i in range(20)])
    assert sorted(dropped) == list(range(10))
    assert _count(store_db, "SELECT count(*) FROM telemetry_samples") == 1010


async def test_keys_outlive_a_reopen_and_hold_for_another_store_on_the_database(
    store_db: StoreDb,
) -> None:
    """Over PostgreSQL the second store stands for another replica."""
    first = await store_db.open()
    await first.commit_ingest([session(), sample(0, 1.0)], [None, key(5)])
    second = await store_db.open()
    try:
        await second.commit_ingest([session()])
        assert await duplicates(second, [sample(0, 1.0)], [key(5)]) == {0: 1}
    finally:
        await first.close()
        await second.close()


async def test_keys_older_than_the_window_are_pruned_and_a_late_copy_is_stored_again(
    store_db: StoreDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KeyWindow, "PRUNE_EVERY_US", 0)
    store = await store_db.open(idempotency_window=1e-6)
    try:
        await store.commit_ingest([session(), sample(0, 1.0)], [None, key(1)])
        await store.commit_ingest([sample(1, 2.0)], [key(2)])  # prunes key 1
        assert _count(store_db, "SELECT count(*) FROM ingest_keys") == 1
        assert await duplicates(store, [sample(0, 1.0)], [key(1)]) == {}
        assert _count(store_db, "SELECT count(*) FROM telemetry_samples") == 3
    finally:
        await store.close()


async def test_an_unknown_session_refuses_the_batch_and_records_no_key(
    store: Store, store_db: StoreDb
) -> None:
    with pytest.raises(ValueError, match="not known"):
        await store.commit_ingest([message(0, sid="nope")], [key(1)])
    assert _count(store_db, "SELECT count(*) FROM ingest_keys") == 0


async def test_a_delivery_and_its_redelivery_in_one_batch_keep_the_first(
    store: Store, store_db: StoreDb
) -> None:
    """An MQTT input's batch may hold a delivery and its redelivery (the old connection's last
    deliveries, then the new one's), even next to each other."""
    await store.commit_ingest([session()])
    a0, a1 = key(1), ItemKey("bridge-a#1", 1)  # a delivery of two readings
    rows = _rows(2) + _rows(2) + _rows(5, 4)
    batch = TelemetryBatch("s1", rows, [a0, a1, a0, a1, key(2)])
    assert await duplicates(store, [batch]) == {0: 2}
    assert _count(store_db, "SELECT count(*) FROM telemetry_samples") == 3


def test_runs_group_consecutive_seqs() -> None:
    assert runs([5, 1, 2, 3, 7, 8, 3]) == [(1, 3), (5, 5), (7, 8)]
    assert runs([]) == []
    assert runs({4}) == [(4, 4)]


def test_drop_seen_keeps_unkeyed_items_and_reports_positions() -> None:
    batch = TelemetryBatch("s1", _rows(4), [key(1), None, key(2), key(3)])
    first = sample(0, 0.0)
    stored = {key(1): item_digest(first)}
    kept = drop_seen([sample(0, 9.0), batch], [key(2), None], stored)
    assert kept.duplicates == {1: 1}, "key 1 was stored for the row's content"
    assert [c.position for c in kept.conflicts] == [1], "key 2 belongs to the earlier sample"
    assert kept.positions == [0, 1]
    assert {p: sorted(s) for p, s in kept.new_keys.items()} == {"bridge-a": [2, 3]}
    assert isinstance(kept.items[1], TelemetryBatch) and len(kept.items[1].rows) == 2


def test_drop_seen_given_the_wanted_keys_keeps_all_only_when_no_key_repeats() -> None:
    """The shortcut that skips the claim of each key is taken only when it cannot matter."""
    items, keys = [sample(0, 1.0), sample(1, 2.0)], [key(1), key(2, "bridge-b")]
    kept = drop_seen(items, keys, {}, wanted(items, keys))
    assert kept.positions == [0, 1] and kept.duplicates == {} and kept.conflicts == []
    assert kept.new_keys == {"bridge-a": {1}, "bridge-b": {2}}
    assert kept.new_digests == {
        key(1): item_digest(items[0]),
        key(2, "bridge-b"): item_digest(items[1]),
    }
    batch = TelemetryBatch("s1", _rows(2), [key(3), key(1)])  # repeats the first item's key
    mixed: list[CommitItem] = [sample(0, 0.0), batch]
    mixed_keys: list[ItemKey | None] = [key(1), None]
    kept = drop_seen(mixed, mixed_keys, {}, wanted(mixed, mixed_keys))
    assert kept.duplicates == {} and [c.position for c in kept.conflicts] == [1]
    assert {p: sorted(s) for p, s in kept.new_keys.items()} == {"bridge-a": [1, 3]}


def test_keys_without_a_digest_only_drop_copies() -> None:
    """Keys stored before digests were (schema 11), and session starts, match any content."""
    kept = drop_seen([sample(0, 5.0), session()], [key(1), key(2)], {key(1): UNKNOWN})
    assert kept.duplicates == {0: 1} and kept.conflicts == []
    kept = drop_seen([session(), session()], [key(3), key(3)], {})
    assert kept.duplicates == {1: 1}


def test_a_readings_digest_is_its_names_and_value_whichever_way_it_came() -> None:
    batch = TelemetryBatch("s1", _rows(3), None)
    assert row_digests(batch) == [item_digest(s) for s in batch.samples()]
    assert item_digest(sample(9, 1.0)) == item_digest(sample(1, 1.0)), "not its time"
    assert len({item_digest(sample(0, 1.0, sid)) for sid in ("s1", "s2")}) == 2


def test_a_message_digest_is_what_was_said_not_when_nor_where_in_the_session() -> None:
    assert message_digest(message(7, content="message 1")) == message_digest(message(1))
    assert message_digest(message(1, sid="s2")) != message_digest(message(1))
    told_another = message(1).model_copy(update={"recipient": "chief"})
    assert message_digest(told_another) != message_digest(message(1))


async def test_copies_are_found_among_producers_that_sort_above_and_below_them(
    store: Store,
) -> None:
    """A batch's producers that sort above every stored one are new (SQLite does not look them
    up); a stored producer between the batch's, or above them all, does not hide a copy."""
    await store.commit_ingest([session()])
    stored = [key(1, "m"), key(1, "z"), key(5, "b")]
    await store.commit_ingest([sample(i, 1.0) for i in range(3)], stored)
    batch = [key(1, "a"), key(1, "m"), key(1, "n"), key(5, "b"), key(2, "zz")]
    assert await duplicates(store, [sample(i, 1.0) for i in range(3, 8)], batch) == {1: 1, 3: 1}
    assert await duplicates(store, [sample(8, 1.0)], [key(1, "z")]) == {0: 1}


async def test_a_key_held_by_other_content_is_set_aside_with_both_versions_findable(
    store: Store, store_db: StoreDb
) -> None:
    """A producer that reused its seq 2 for another message: the second is neither stored in
    the session nor dropped as a copy; the conflict keeps it, chained, with what finds the
    stored one (its digest)."""
    await store.commit_ingest([session()])
    await store.commit_ingest([message(0, content="proceed"), message(1)], [key(1), key(2)])
    other = message(5, content="abort the trial")
    left_out = await store.commit_ingest([message(4), other], [None, key(2)])
    assert left_out.duplicates == {}
    ((position, conflict_id, record),) = left_out.conflicts
    assert position == 1 and conflict_id >= 1
    assert (record.reason, record.producer, record.seq) == ("key", "bridge-a", 2)
    assert record.message == other and record.session_id == "s1"
    assert record.stored_digest == message_digest(message(1)).hex()
    assert record.digest == message_digest(other).hex()
    assert conflicts(store_db) == [record]
    (reviewed,) = review_conflicts(store_db.target, session_id="s1")
    assert reviewed["id"] == conflict_id and reviewed["producer"] == "bridge-a"
    assert reviewed["set_aside"]["content"] == "abort the trial"
    assert reviewed["stored"]["content"] == "message 1", "both versions, side by side"
    assert review_conflicts(store_db.target, session_id="s2") == []
    stored = await store.session_messages("s1")
    assert [m.content for m in stored] == ["proceed", "message 1", "message 4"]
    assert verify(store_db.target).ok, "the conflict is chained"
    # Its copy (a redelivery of the conflicting message) is a conflict again, not stored.
    again = await store.commit_ingest([message(6, content="abort the trial")], [key(2)])
    assert len(again.conflicts) == 1 and len(conflicts(store_db)) == 2


async def test_an_index_held_by_another_message_is_set_aside_not_dropped(
    store: Store, store_db: StoreDb
) -> None:
    """Another producer took index 20 first: the later message of index 20 is kept as a
    conflict (an index conflict keeps the key it came with); the same message again is a
    plain copy."""
    await store.commit_ingest([session()])
    await store.commit_ingest([message(20, content="spoofed order")])
    victim = message(20, content="the chief's order")
    left_out = await store.commit_ingest([victim, message(21)], [key(7), None])
    ((position, _, record),) = left_out.conflicts
    assert position == 0 and record.reason == "index" and record.message == victim
    assert (record.producer, record.seq) == ("bridge-a", 7)
    assert record.stored_digest == message_digest(message(20, content="spoofed order")).hex()
    (reviewed,) = review_conflicts(store_db.target)
    assert reviewed["set_aside"]["content"] == "the chief's order"
    assert reviewed["stored"]["content"] == "spoofed order"
    assert await duplicates(store, [message(20, content="spoofed order")]) == {0: 1}
    # In one batch, the first holder of an index decides for the others.
    batch = [message(30), message(30), message(30, content="other")]
    left_out = await store.commit_ingest(batch)
    assert left_out.duplicates == {1: 1}
    assert [c.position for c in left_out.conflicts] == [2]
    assert [r.reason for r in conflicts(store_db)] == ["index", "index"]
    assert verify(store_db.target).ok
