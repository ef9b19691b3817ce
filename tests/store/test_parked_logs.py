"""Log events parked while they wait for their span (poirotd.store.parked_logs), on each adapter:
they outlive the store that parked them, each owner reads its own, a retried park is one row, and
rows are released in the transaction that stores what they became (a failed commit changes
nothing). A store of the schema before them gains the table when opened."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path

import pytest

from poirotd.store import SqliteStore, Store, UnknownSessionError
from poirotd.store import schema as store_schema
from poirotd.store.parked_logs import ParkedLogEvent, Parking
from tests.support.store import message, session
from tests.support.stores import PostgresDb, StoreDb


def parked(
    event_id: str, owner: str = "a", arrived_us: int = 1_000, position: int = 0
) -> ParkedLogEvent:
    record = '{"name":"gen_ai.user.message","body":{"content":"hi"},"at_ns":1}'
    trace, span = "ab" * 16, "cd" * 8
    return ParkedLogEvent(owner, event_id, trace, span, arrived_us, position, record, arrived_us)


@pytest.fixture
async def store(store_db: StoreDb) -> AsyncIterator[Store]:
    s = await store_db.open()
    yield s
    await s.close()


async def test_parked_events_outlive_the_store_and_are_read_by_their_owner(
    store_db: StoreDb,
) -> None:
    store = await store_db.open()
    try:
        await store.commit_ingest([], (), Parking((parked("e2", arrived_us=2_000), parked("e1"))))
        await store.commit_ingest([], (), Parking((parked("e1"), parked("e9", owner="b"))))
    finally:
        await store.close()
    store = await store_db.open()
    try:
        # oldest first; the retried park of e1 is the same row
        assert await store.parked_log_events("a") == [parked("e1"), parked("e2", arrived_us=2_000)]
        assert await store.parked_log_events("b") == [parked("e9", owner="b")]
        assert await store.parked_log_events("c") == []
    finally:
        await store.close()


async def test_events_that_arrived_together_are_read_in_their_order(store: Store) -> None:
    together = (parked("z", position=0), parked("a", position=2), parked("m", position=1))
    await store.commit_ingest([], (), Parking(together))
    assert [p.event_id for p in await store.parked_log_events("a")] == ["z", "m", "a"]


async def test_rows_are_released_with_the_messages_they_became(store: Store) -> None:
    await store.commit_ingest([session()], (), Parking((parked("e1"), parked("e2"))))
    await store.commit_ingest([message(0)], (), Parking(release=(("a", "e1"),)))
    assert [p.event_id for p in await store.parked_log_events("a")] == ["e2"]
    assert len(await store.session_messages("s1")) == 1
    # parked and released in one commit (placed before the commit of its park): no row left
    await store.commit_ingest([], (), Parking((parked("e3"),), (("a", "e3"), ("a", "e2"))))
    assert await store.parked_log_events("a") == []


async def test_a_failed_commit_parks_and_releases_nothing(store: Store) -> None:
    await store.commit_ingest([session()], (), Parking((parked("e1"),)))
    with pytest.raises(UnknownSessionError):
        await store.commit_ingest(
            [message(0, sid="ghost")], (), Parking((parked("e2"),), (("a", "e1"),))
        )
    assert [p.event_id for p in await store.parked_log_events("a")] == ["e1"]


async def test_a_schema_12_sqlite_store_gains_the_table(tmp_path: Path) -> None:
    db = tmp_path / "poirotd.db"
    await (await SqliteStore.open(db)).close()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("DROP TABLE parked_log_events")
        conn.execute("PRAGMA user_version = 12")
    store = await SqliteStore.open(db)
    try:
        await store.commit_ingest([], (), Parking((parked("e1"),)))
        assert await store.parked_log_events("a") == [parked("e1")]
    finally:
        await store.close()
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (store_schema.SCHEMA_VERSION,)


async def test_a_version_5_postgres_database_gains_the_table(postgres_url: str) -> None:
    db = PostgresDb(postgres_url)
    await (await db.open()).close()
    db.query("DROP TABLE parked_log_events")
    db.query("DELETE FROM schema_migrations WHERE version = 6")
    store = await db.open()
    try:
        await store.commit_ingest([], (), Parking((parked("e1"),)))
        assert await store.parked_log_events("a") == [parked("e1")]
    finally:
        await store.close()
    assert db.query("SELECT max(version) FROM schema_migrations") == [(6,)]


async def test_a_gone_owners_old_rows_are_taken_over_once(store_db: StoreDb) -> None:
    """Rows another owner parked before the cutoff become the taker's (returned as they were
    parked); newer ones, and the taker's own, stay. Two stores taking over at once (replicas)
    share the rows out, each to one."""
    first, second = await store_db.open(), await store_db.open()
    try:
        rows = (
            parked("old1", owner="gone", arrived_us=100),
            parked("old2", owner="gone", arrived_us=200),
            parked("new", owner="gone", arrived_us=5_000),
            parked("mine", owner="c", arrived_us=5_000),
        )
        await first.commit_ingest([], (), Parking(rows))
        taken = await asyncio.gather(
            first.take_over_parked_log_events("c", 1_000, 9_000),
            second.take_over_parked_log_events("d", 1_000, 9_000),
        )
        assert sorted(p.event_id for found in taken for p in found) == ["old1", "old2"]
        assert {p.owner for found in taken for p in found} == {"gone"}  # as they were parked
        mine = await first.parked_log_events("c")
        theirs = await first.parked_log_events("d")
        assert sorted(p.event_id for p in [*mine, *theirs]) == ["mine", "old1", "old2"]
        assert {p.owned_us for p in [*mine, *theirs] if p.event_id != "mine"} == {9_000}
        assert [p.event_id for p in await first.parked_log_events("gone")] == ["new"]
        # owned since 9_000 by their takers: not theirs to take again before that
        assert await first.take_over_parked_log_events("e", 1_000, 9_500) == []
    finally:
        await second.close()
        await first.close()
