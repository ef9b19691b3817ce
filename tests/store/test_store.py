"""The store port on both adapters (`store_db`: a SQLite file, then a PostgreSQL database of a real
server): round trips, idempotence, durability, paging. What only one adapter has (SQLite's WAL
mode and its migrations from older schemas) is tested on it alone."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, get_args

import pytest

from poirotd.devtools.hazard_inputs import readings
from poirotd.model import (
    AgentMessage,
    Attribution,
    EventKind,
    IngestItem,
    InvestigationState,
    LLMExchange,
    LLMUsage,
    MessageKind,
    Phase,
    PhaseTiming,
    SessionEnd,
    TelemetryBatch,
    TelemetrySample,
    Vote,
    row_of,
)
from poirotd.store import (
    SqliteStore,
    Store,
    UnknownInvestigationError,
    UnknownSessionError,
    canonical_json,
)
from poirotd.store import chain as store_chain
from poirotd.store import records as store_records
from poirotd.store import schema as store_schema
from poirotd.store import sqlite as store_sql
from poirotd.store.audit import verify
from tests.support.store import (
    T0,
    event,
    investigation,
    message,
    queue,
    sample,
    session,
    space,
    triggered,
)
from tests.support.stores import StoreDb

CEST = timezone(timedelta(hours=2))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "poirotd.db"


@pytest.fixture
async def store(store_db: StoreDb) -> AsyncIterator[Store]:
    s = await store_db.open()
    yield s
    await s.close()


# ------------------------------------------------------------ setup


async def test_opens_in_wal_mode_with_a_schema_version(db: Path) -> None:
    await (await SqliteStore.open(db)).close()
    with closing(sqlite3.connect(db)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == store_schema.SCHEMA_VERSION


async def test_refuses_a_database_from_a_newer_schema(db: Path) -> None:
    await (await SqliteStore.open(db)).close()
    with closing(sqlite3.connect(db)) as other:
        other.execute("PRAGMA user_version = 99")
    with pytest.raises(RuntimeError, match="schema version 99"):
        await SqliteStore.open(db)


async def test_close_is_idempotent_and_a_closed_store_refuses_work(store_db: StoreDb) -> None:
    s = await store_db.open()
    await asyncio.gather(s.close(), s.close())
    await s.close()
    with pytest.raises(RuntimeError, match="store is closed"):
        await s.get_session("s1")
    with pytest.raises(RuntimeError, match="store is closed"):
        await s.commit_ingest([session()])
    with pytest.raises(RuntimeError, match="store is closed"):
        s.has_session("s1")


# ------------------------------------------------------------ ingest


async def test_session_round_trips_and_ends(store: Store) -> None:
    start = session(labels={"patient": "p7"}, started_at=datetime(2025, 3, 1, 14, tzinfo=CEST))
    await store.commit_ingest([start])
    got = await store.get_session("s1")
    assert got == start
    assert got is not None and got.started_at.utcoffset() == timedelta(hours=2)

    end = T0 + timedelta(minutes=5)
    await store.commit_ingest([SessionEnd(session_id="s1", ended_at=end), session()])
    assert await store.get_session("s1") == start.model_copy(update={"ended_at": end})
    assert await store.get_session("nope") is None


async def test_messages_round_trip_in_index_order(store: Store) -> None:
    tool_call = message(1).model_copy(
        update={"kind": MessageKind.TOOL, "tool_calls": ('{"f": 1}',), "tool_name": "brake"}
    )
    await store.commit_ingest([session(), message(2), tool_call, message(0)])
    assert await store.session_messages("s1") == [message(0), tool_call, message(2)]
    assert await store.session_messages("other") == []


async def test_a_resent_message_is_stored_once(store: Store) -> None:
    await store.commit_ingest([session(), message(0), message(1)])
    await store.commit_ingest([message(1, content="resent"), message(1), message(2)])
    assert await store.session_messages("s1") == [message(0), message(1), message(2)]


async def test_a_batch_may_start_a_session_and_use_it(store: Store) -> None:
    assert not store.has_session("s1")
    await store.commit_ingest(
        [session(), message(0), sample(0, 1.0), SessionEnd(session_id="s1", ended_at=T0)]
    )
    assert store.has_session("s1")
    assert len(await store.session_messages("s1")) == 1
    assert len(await store.newest_readings("s1")) == 1


async def test_calls_commit_in_submission_order(store: Store) -> None:
    await asyncio.gather(store.commit_ingest([session()]), store.commit_ingest([message(0)]))
    assert await store.session_messages("s1") == [message(0)]


async def test_an_unknown_session_refuses_the_whole_batch(store: Store) -> None:
    with pytest.raises(UnknownSessionError, match="'ghost'"):
        await store.commit_ingest([session(), message(0), message(0, sid="ghost")])
    assert not store.has_session("s1")
    assert await store.get_session("s1") is None
    with pytest.raises(UnknownSessionError):
        await store.commit_ingest([SessionEnd(session_id="ghost", ended_at=T0)])


async def test_telemetry_returns_the_newest_samples_in_time_order(store: Store) -> None:
    later_first = [sample(3, 3.0), sample(1, 1.0), sample(2, 2.0), sample(0, 0.0)]
    await store.commit_ingest([session(), *later_first, sample(1, 1.5)])
    assert await store.newest_readings("s1") == readings(
        sample(0, 0.0),
        sample(1, 1.0),
        sample(1, 1.5),
        sample(2, 2.0),
        sample(3, 3.0),
    )
    assert await store.newest_readings("s1", limit=2) == readings(sample(2, 2.0), sample(3, 3.0))
    with pytest.raises(ValueError, match="limit"):
        await store.newest_readings("s1", limit=0)


async def test_telemetry_across_blocks_is_the_newest_in_time_then_arrival_order(
    store: Store,
) -> None:
    """Blocks overlap in time (late samples) and tie; the newest `limit` must still be exact."""
    rng = random.Random(7)
    arrived = [sample(rng.randrange(40) / 4, float(i)) for i in range(300)]
    await store.commit_ingest([session()])
    start = 0
    while start < len(arrived):
        size = rng.randrange(1, 40)
        await store.commit_ingest(arrived[start : start + size])
        start += size
    in_order = [s for _, s in sorted(enumerate(arrived), key=lambda p: (p[1].measured_at, p[0]))]
    for limit in (1, 2, 17, 100, 299, 300, 1_000):
        assert await store.newest_readings("s1", limit=limit) == readings(*in_order[-limit:])


def blocks_and_view(store_db: StoreDb, table: str, view_query: str) -> tuple[list[Any], list[Any]]:
    """(id, session_id) of each row of a block table, and what a query of its view shows."""
    blocks = store_db.query(f"SELECT id, session_id FROM {table} ORDER BY id")
    return blocks, store_db.query(view_query)


async def test_a_commit_stores_a_block_per_session_shown_per_sample_in_the_view(
    store: Store, store_db: StoreDb
) -> None:
    naive = sample(2, 2.0).model_copy(update={"measured_at": datetime(2025, 3, 1, 12)})
    cest = sample(3, 3.0, sid="s2").model_copy(update={"measured_at": T0.astimezone(CEST)})
    batch: list[IngestItem] = [session(), session("s2"), sample(0, 0.5), cest, naive]
    await store.commit_ingest(batch)
    blocks, shown = blocks_and_view(
        store_db,
        "telemetry_blocks",
        "SELECT session_id, component, signal, value, measured_at, block_id, position"
        " FROM telemetry_samples ORDER BY block_id, position",
    )
    assert blocks == [(1, "s1"), (2, "s2")]
    assert shown == [
        ("s1", "knee_motor", "torque", 0.5, "2025-03-01T12:00:00.123456Z", 1, 0),
        ("s1", "knee_motor", "torque", 2.0, "2025-03-01T12:00:00", 1, 1),
        ("s2", "knee_motor", "torque", 3.0, "2025-03-01T14:00:00.123456+02:00", 2, 0),
    ]
    # Each datetime comes back as given (naive stays naive, an offset stays), ordered as UTC.
    assert await store.newest_readings("s1") == readings(naive, sample(0, 0.5))
    assert await store.newest_readings("s2") == readings(cest)


async def test_a_telemetry_batch_is_stored_as_its_samples_would_be(tmp_path: Path) -> None:
    """An input's batch becomes the block the same samples make: the same record, byte for byte
    (the audit chain hashes it), so how telemetry arrived leaves no trace in the store."""
    samples = [sample(i, float(i) + 0.25) for i in range(5)]
    records = []
    for name, items in (
        ("samples", samples),
        ("batch", [TelemetryBatch("s1", list(map(row_of, samples)))]),
    ):
        path = tmp_path / f"{name}.db"
        stored = await SqliteStore.open(path)
        try:
            await stored.commit_ingest([session(), *items])
        finally:
            await stored.close()
        with closing(sqlite3.connect(path)) as conn:
            records.append(conn.execute("SELECT * FROM telemetry_blocks").fetchall())
    assert len(records[0]) == 1 and records[1] == records[0]


def test_a_telemetry_block_is_encoded_canonically_whatever_its_values() -> None:
    """A block's record takes pydantic's JSON when that is the canonical text: checked here on
    floats of every magnitude and sign, names with control and non-ASCII characters, and times
    aware, offset and naive (mixed in one block), against `encode_record` itself."""
    rng = random.Random(7)
    names = ["knee", "tab\there", 'quote"back\\slash', "ünïcödé ✓ 🦾", "\x00\x1f\x7f"]
    zones = [UTC, CEST, None]
    fast = 0
    for exponent in range(-330, 308):
        rows = []
        for _ in range(8):
            value = rng.uniform(1.0, 10.0) * 10.0**exponent * rng.choice((1, -1))
            zone = rng.choice(zones)
            at = datetime(2025, 3, 1, 12, tzinfo=zone) + timedelta(
                microseconds=rng.randint(0, 10**9)
            )
            rows.append((rng.choice(names), rng.choice(names), value, at))
        edges = (0.0, -0.0, 1.0, 1e16, 1e-4, 9.999999999999999e-05, 1e-5, 1e-9, 1e-10, 9e-11)
        rows.append(("knee", "torque", rng.choice(edges), T0))
        block = store_records.TelemetryBlock.model_construct(session_id="s1 ✓", samples=rows)
        _, _, first_us, last_us, record = store_records.telemetry_block_row(block)
        assert record == store_chain.encode_record(block)
        times = [store_records.micros(at) for *_, at in rows]
        assert (first_us, last_us) == (min(times), max(times))
        fast += record == block.model_dump_json()
    assert fast > 300  # most magnitudes are written alike, so the shortcut is taken


async def test_a_commit_stores_a_message_block_per_session_shown_per_message_in_the_view(
    store: Store, store_db: StoreDb
) -> None:
    tool = message(1).model_copy(
        update={"kind": MessageKind.TOOL, "tool_calls": ("read", "ask"), "tool_name": "gait"}
    )
    cest = message(0, sid="s2").model_copy(update={"sent_at": T0.astimezone(CEST)})
    await store.commit_ingest([session(), session("s2"), message(0), cest, tool])
    blocks, shown = blocks_and_view(
        store_db,
        "message_blocks",
        "SELECT session_id, idx, kind, sender, recipient, content, sent_at, block_id, position"
        " FROM agent_messages ORDER BY block_id, position",
    )
    assert blocks == [(1, "s1"), (2, "s2")]
    at = "2025-03-01T12:00:0{}.123456Z"
    assert shown == [
        ("s1", 0, "agent", "planner", "controller", "message 0", at.format(0), 1, 0),
        ("s1", 1, "tool", "planner", "controller", "message 1", at.format(1), 1, 1),
        (
            "s2",
            0,
            "agent",
            "planner",
            "controller",
            "message 0",
            T0.astimezone(CEST).isoformat(),
            2,
            0,
        ),
    ]
    # Each message comes back exactly as given, its time zone and tool calls included.
    assert await store.session_messages("s1") == [message(0), tool]
    assert await store.session_messages("s2") == [cest]


async def test_a_schema_4_store_keeps_its_message_rows_and_still_ignores_their_resends(
    db: Path,
) -> None:
    old = [message(0), message(2)]
    await _schema_4_store(db, old)
    store = await SqliteStore.open(db)
    try:
        await store.commit_ingest([message(1), message(2, content="resent"), message(3)])
        assert await store.session_messages("s1") == [message(i) for i in range(4)]
    finally:
        await store.close()
    assert verify(db).ok
    with closing(sqlite3.connect(db)) as other:
        shown = other.execute("SELECT idx, block_id FROM agent_messages ORDER BY idx").fetchall()
    assert shown == [(0, None), (1, 1), (2, None), (3, 1)]


def test_a_message_blocks_layout_is_agent_messages_fields_but_the_session() -> None:
    fields = AgentMessage.model_fields
    assert set(store_records.MESSAGE_BLOCK_FIELDS) == set(fields) - {"session_id"}
    assert list(get_args(store_records.MessageRow)) == [
        fields[name].annotation for name in store_records.MESSAGE_BLOCK_FIELDS
    ]


async def _schema_4_store(db: Path, messages: list[AgentMessage]) -> None:
    """A store as schema 4 left it: no message blocks, one row and one entry per message
    (written with the store's own row function, as schema 4 wrote them)."""
    store = await SqliteStore.open(db)
    await store.commit_ingest([session()])
    await store.close()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("DROP VIEW agent_messages")
        conn.execute("DROP TABLE message_blocks")
        conn.execute("DROP TABLE message_indices")
        with store_chain.transaction(conn) as chain:
            for row in map(store_records.message_row, messages):
                conn.execute("INSERT INTO messages (session_id, idx, record) VALUES (?, ?, ?)", row)
                chain.append("message", f"{row[0]}/{row[1]}", row[-1])
        conn.execute("PRAGMA user_version = 4")


async def test_a_schema_3_store_keeps_its_sample_rows_and_adds_blocks(db: Path) -> None:
    old = [sample(1, 1.0), sample(3, 3.0)]
    await _schema_3_store(db, old)
    store = await SqliteStore.open(db)
    try:
        await store.commit_ingest([sample(2, 2.0), sample(3, 3.5)])
        assert await store.newest_readings("s1") == readings(
            old[0], sample(2, 2.0), old[1], sample(3, 3.5)
        )
        assert await store.newest_readings("s1", limit=2) == readings(old[1], sample(3, 3.5))
    finally:
        await store.close()
    assert verify(db).ok
    with closing(sqlite3.connect(db)) as other:
        values = other.execute("SELECT value FROM telemetry_samples").fetchall()
    assert sorted(values) == [(1.0,), (2.0,), (3.0,), (3.5,)]


async def _schema_3_store(db: Path, samples: list[TelemetrySample]) -> None:
    """A store as schema 3 left it: no blocks, one row and one entry per sample (written with
    the store's own row and chain functions, as schema 3 wrote them)."""
    store = await SqliteStore.open(db)
    await store.commit_ingest([session()])
    await store.close()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("DROP VIEW telemetry_samples")
        conn.execute("DROP TABLE telemetry_blocks")
        with store_chain.transaction(conn) as chain:
            for row in map(store_records.telemetry_row, samples):
                stored = store_sql._store_row(
                    conn, "INSERT INTO telemetry VALUES (?, ?, ?, ?)", row
                )
                assert stored is not None
                chain.append("telemetry", str(stored[0]), stored[-1])
        conn.execute("PRAGMA user_version = 3")


async def test_throughput_batches_all_land(store: Store) -> None:
    # A sanity check of the batched path, not a timing assertion.
    await store.commit_ingest([session()])
    for b in range(20):
        await store.commit_ingest([message(b * 500 + i) for i in range(500)])
    assert len(await store.session_messages("s1")) == 10_000


# ------------------------------------------------------------ durability


async def test_everything_survives_a_reopen(store_db: StoreDb) -> None:
    first = await store_db.open()
    await first.commit_ingest([session(), message(0), sample(0, 1.0)])
    await first.put_hazard_space(space())
    await first.save_investigation(investigation("i1"))
    stored = await first.append_event(event("i1"))
    await first.close()

    second = await store_db.open()
    try:
        assert second.has_session("s1")
        assert not second.has_session("s2")
        assert await second.session_messages("s1") == [message(0)]
        assert await second.newest_readings("s1") == readings(sample(0, 1.0))
        assert await second.get_hazard_space("cortex", "v1") == space()
        assert await second.get_investigation("i1") == investigation("i1")
        assert await second.events_after(0) == [stored]
        assert (await second.append_event(event("i1"))).event_id == stored.event_id + 1
    finally:
        await second.close()


async def test_an_acknowledged_commit_is_visible_to_another_connection(
    store: Store, store_db: StoreDb
) -> None:
    await store.commit_ingest([session(), message(0), message(1)])
    assert store_db.query("SELECT count(*) FROM agent_messages") == [(2,)]
    assert store_db.query("SELECT session_id FROM sessions") == [("s1",)]


# ------------------------------------------------------------ hazard spaces


async def test_hazard_spaces_upsert_and_latest(store: Store) -> None:
    assert await store.latest_hazard_space("cortex") is None
    await store.put_hazard_space(space("v1"))
    await store.put_hazard_space(space("v2"))
    assert await store.latest_hazard_space("cortex") == space("v2")
    assert await store.get_hazard_space("cortex", "v3") is None

    pinned = space("v1").model_copy(update={"source": "pinned"})
    await store.put_hazard_space(pinned)
    assert await store.get_hazard_space("cortex", "v1") == pinned
    assert await store.latest_hazard_space("cortex") == pinned
    assert await store.latest_hazard_space("trading") is None


# ------------------------------------------------------------ investigations


async def test_a_full_investigation_round_trips_and_upserts(store: Store) -> None:
    queued = investigation("i1")
    await store.save_investigation(queued)
    done = queued.model_copy(
        update={
            "state": InvestigationState.SUCCEEDED,
            "finished_at": T0 + timedelta(seconds=40),
            "hazard_space": space(),
            "reports": {"planner": {"role_fulfilled": True}, "controller": None},
            "votes": (Vote(agent_id="planner", location=(0, 1), weight=0.6, forced=True),),
            "attribution": Attribution(
                scores=(0.0, 0.6), top=(1,), tie=False, decision=(0, 1), rule="argmax", beta=0.25
            ),
            "phases": (PhaseTiming(phase=Phase.VOTING, seconds=1.5),),
            "usage": LLMUsage(calls=3, prompt_tokens=900, completion_tokens=120),
        }
    )
    await store.save_investigation(done)
    assert await store.get_investigation("i1") == done
    assert await store.get_investigation("nope") is None
    assert await store.list_investigations(state=InvestigationState.QUEUED) == ([], None)


async def test_list_pages_newest_first_without_gap_or_duplicate(store: Store) -> None:
    # i0..i6; i3 and i4 share a timestamp so the id breaks the tie.
    created = [T0 + timedelta(seconds=s) for s in (0, 1, 2, 3, 3, 5, 6)]
    states = [InvestigationState.SUCCEEDED, InvestigationState.QUEUED] * 4
    for n, at in enumerate(created):
        sid = "s1" if n % 2 == 0 else "s2"
        await store.save_investigation(
            investigation(f"i{n}", sid=sid, state=states[n], created_at=at)
        )

    pages: list[list[str]] = []
    token: str | None = None
    while True:
        page, token = await store.list_investigations(limit=3, page_token=token)
        pages.append([inv.investigation_id for inv in page])
        if token is None:
            break
    assert pages == [["i6", "i5", "i4"], ["i3", "i2", "i1"], ["i0"]]

    first, token = await store.list_investigations(session_id="s1", limit=2)
    assert token is not None
    rest, last = await store.list_investigations(session_id="s1", limit=2, page_token=token)
    assert [i.investigation_id for i in first + rest] == ["i6", "i4", "i2", "i0"]
    assert last is None

    queued, _ = await store.list_investigations(state=InvestigationState.QUEUED)
    assert [i.investigation_id for i in queued] == ["i5", "i3", "i1"]
    both, _ = await store.list_investigations(session_id="s2", state=InvestigationState.SUCCEEDED)
    assert both == []


@pytest.mark.parametrize(
    "token", ["not base64!", "bm90IGpzb24", "WzEsMiwzXQ", "WyJ4IiwiaSJd", "W3RydWUsImkiXQ"]
)
async def test_a_malformed_page_token_is_refused(store: Store, token: str) -> None:
    with pytest.raises(ValueError, match="invalid page token"):
        await store.list_investigations(page_token=token)


async def test_settling_interrupts_trigger_calls_and_keeps_hazards_queued(store: Store) -> None:
    """What a daemon alone on its store leaves when it stops: a Trigger call's queued or running
    investigation is INTERRUPTED; a hazard rule's is queued again (a run reset to its queued
    form, claimable at once), and a deferred one stays deferred: a hazard is never lost."""
    await store.save_investigation(investigation("q", created_at=T0))
    await store.save_investigation(
        investigation("r", state=InvestigationState.RUNNING, created_at=T0 + timedelta(seconds=1))
    )
    done = investigation("d", state=InvestigationState.SUCCEEDED)
    await store.save_investigation(done)
    hazard = triggered("h", sid="s2").model_copy(update={"created_at": T0 + timedelta(seconds=2)})
    await queue(store, hazard)
    claim = await store.claim_investigation("me", 30.0)
    assert claim is not None and claim[0].investigation_id == "q"
    claim = await store.claim_investigation("me", 30.0)
    assert claim is not None and claim[0].investigation_id == "h"
    running = hazard.model_copy(
        update={"state": InvestigationState.RUNNING, "reports": {"a": None}}
    )
    await store.save_investigation(running, lease=claim[1])
    deferred = triggered("w", sid="s3").model_copy(update={"state": InvestigationState.DEFERRED})
    await store.save_investigation(deferred)

    stop = T0 + timedelta(minutes=1)
    settled = await store.settle_unfinished("daemon stopped", stop)
    assert (settled.interrupted, settled.requeued) == (["q", "r"], ["h"])
    for iid in ("q", "r"):
        inv = await store.get_investigation(iid)
        assert inv is not None
        assert (inv.state, inv.error, inv.finished_at) == (
            InvestigationState.INTERRUPTED,
            "daemon stopped",
            stop,
        )
    assert await store.get_investigation("h") == hazard
    assert await store.get_investigation("d") == done
    assert await store.get_investigation("w") == deferred
    interrupted, _ = await store.list_investigations(state=InvestigationState.INTERRUPTED)
    assert {i.investigation_id for i in interrupted} == {"q", "r"}
    again = await store.claim_investigation("next boot", 30.0)  # no lease left behind
    assert again is not None and again[0] == hazard
    settled = await store.settle_unfinished("again", stop)
    assert (settled.interrupted, settled.requeued) == ([], ["h"])


# ------------------------------------------------------------ events and exchanges


async def test_events_get_increasing_ids_and_resume_after_any_id(store: Store) -> None:
    assert await store.latest_event_id() == 0
    await store.save_investigation(investigation("a"))
    await store.save_investigation(investigation("b"))
    vote = Vote(agent_id="planner", location=(1, 0))
    stored = [
        await store.append_event(event("a")),
        await store.append_event(event("b")),
        await store.append_event(
            event("a").model_copy(update={"kind": EventKind.VOTE_CAST, "vote": vote})
        ),
    ]
    assert [e.event_id for e in stored] == [1, 2, 3]
    assert stored[2].vote == vote

    assert await store.events_after(0) == stored
    assert await store.events_after(1) == stored[1:]
    assert await store.events_after(0, limit=2) == stored[:2]
    assert await store.events_after(0, investigation_id="a") == [stored[0], stored[2]]
    assert await store.events_after(1, investigation_id="a") == [stored[2]]
    assert await store.events_after(3) == []
    assert await store.latest_event_id() == 3

    with pytest.raises(UnknownInvestigationError, match="'ghost'"):
        await store.append_event(event("ghost"))


async def test_exchanges_are_kept_in_recording_order(store: Store) -> None:
    await store.save_investigation(investigation("a"))
    await store.save_investigation(investigation("b"))

    def exchange(purpose: str) -> LLMExchange:
        return LLMExchange(
            phase=Phase.SELF_ASSESSMENT,
            agent_id="planner",
            purpose=purpose,
            messages=({"role": "user", "content": "what happened?"},),
            response='{"ok": true}',
            cached_tokens=12,
            at=T0,
        )

    for purpose in ("report", "turn", "vote"):
        await store.record_exchange("a", exchange(purpose))
    await store.record_exchange("b", exchange("answer"))
    assert await store.exchanges("a") == [exchange("report"), exchange("turn"), exchange("vote")]
    assert await store.exchanges("b") == [exchange("answer")]
    assert await store.exchanges("c") == []
    with pytest.raises(UnknownInvestigationError):
        await store.record_exchange("c", exchange("vote"))


# ------------------------------------------------------------ audit chain (verify: test_audit.py)


async def test_each_write_appends_its_entries_in_commit_order(
    store: Store, store_db: StoreDb
) -> None:
    end = SessionEnd(session_id="s1", ended_at=T0 + timedelta(minutes=1))
    await store.commit_ingest([session(), message(0), sample(0, 1.0), message(0), end, session()])
    await store.put_hazard_space(space())
    await store.save_investigation(investigation("q"))
    await store.settle_unfinished("daemon stopped", T0)
    await store.append_event(event("q"))
    exchange = LLMExchange(
        phase=Phase.VOTING, agent_id="planner", purpose="vote", messages=(), at=T0
    )
    await store.record_exchange("q", exchange)

    entries = store_db.query("SELECT seq, kind, ref, payload FROM audit ORDER BY seq")
    ((put_seq,),) = store_db.query("SELECT put_seq FROM hazard_spaces")
    records = {
        table: [r for (r,) in store_db.query(f"SELECT record FROM {table}")]
        for table in (
            "sessions",
            "message_blocks",
            "telemetry_blocks",
            "investigations",
            "exchanges",
        )
    }
    # The resent message and session start stored nothing, so they chained nothing. A commit
    # chains its session starts and ends, then its messages, then its samples.
    assert [(kind, ref) for _, kind, ref, _ in entries] == [
        ("session", "s1"),
        ("session", "s1"),  # ended: the whole record again
        ("message_block", "1"),
        ("telemetry_block", "1"),
        ("hazard_space", '["cortex","v1"]'),
        ("investigation", "q"),
        ("investigation", "q"),  # interrupted
        ("event", "1"),
        ("exchange", "q/1"),
    ]
    assert [seq for seq, *_ in entries] == list(range(1, 10))
    assert put_seq == 5  # the seq of the space's entry: "latest" is chained too
    payloads = [payload for *_, payload in entries]
    for table, stored in records.items():
        assert set(stored) <= set(payloads), table  # each row's record is its entry's payload
    assert '"ended_at":"2025-03-01T12:01:00.123456Z"' in payloads[1]


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1e16, "a": [1e-07, -0.0, 1.0, 0.1, 5e-324], "c": None, "d": True},
        {"é": 'naïve \u2028 \x1f " \\ /', "nested": {"z": [], "y": {}}},
        "a string",
        1.7976931348623157e308,
    ],
)
def test_canonical_json_is_what_the_export_tells_readers(value: Any) -> None:
    documented = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == documented


def test_canonical_json_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(TypeError):
        canonical_json({"x": object()})
