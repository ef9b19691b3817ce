"""What replicas over one store ask of it, on both adapters: claims with leases and fencing tokens,
takeover of a dead replica's investigation, admission that opens a session's investigation once,
deferred investigations queued once, reserved message indexes. On PostgreSQL the two "replicas"
are two stores (two daemons' worth of connections) on one database; SQLite has one process, so
both are the same store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import pytest

from poirotd.investigations.admission import QueueShares
from poirotd.model import (
    AgentReputation,
    ConfirmedOutcome,
    EventKind,
    Investigation,
    InvestigationState,
    LLMExchange,
    Phase,
)
from poirotd.store import Admission, Lease, LeaseLostError, SqliteStore, Store
from poirotd.store import schema as store_schema
from poirotd.store.audit import verify
from tests.support.store import T0, event, investigation, message, queue, session, triggered
from tests.support.stores import StoreDb

_LEASE = 30.0
_SHORT = 0.05  # a lease that expires while the test waits
_SUCCEEDED = InvestigationState.SUCCEEDED
_EXCHANGE = LLMExchange(
    phase=Phase.HAZARD_SPACE, agent_id="a1", purpose="report", messages=(), at=T0, seconds=0.1
)


@pytest.fixture
async def pair(store_db: StoreDb) -> AsyncIterator[tuple[Store, Store]]:
    first = await store_db.open()
    second = await store_db.open() if store_db.name == "postgres" else first
    yield first, second
    await first.close()
    await second.close()


async def test_claims_take_the_oldest_queued_once(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert await a.claim_investigation("a", _LEASE) is None
    for i in range(3):
        await a.save_investigation(investigation(f"q{i}", created_at=T0 + timedelta(seconds=i)))
    assert await a.count_investigations(InvestigationState.QUEUED) == 3
    first = await a.claim_investigation("a", _LEASE)
    second = await b.claim_investigation("b", _LEASE)
    assert first is not None and second is not None
    assert (first[0].investigation_id, second[0].investigation_id) == ("q0", "q1")
    assert first[1] == Lease("q0", "a", 1)
    third = await a.claim_investigation("a", _LEASE)
    assert third is not None and third[0].investigation_id == "q2"
    assert await b.claim_investigation("b", _LEASE) is None  # every lease is live


async def test_concurrent_claims_never_share_an_investigation(pair: tuple[Store, Store]) -> None:
    a, b = pair
    for i in range(12):
        await a.save_investigation(investigation(f"q{i:02}", created_at=T0 + timedelta(seconds=i)))

    async def claim_all(store: Store, owner: str) -> list[str]:
        got = []
        while (claim := await store.claim_investigation(owner, _LEASE)) is not None:
            got.append(claim[0].investigation_id)
        return got

    got_a, got_b = await asyncio.gather(claim_all(a, "a"), claim_all(b, "b"))
    assert sorted(got_a + got_b) == [f"q{i:02}" for i in range(12)]


async def test_an_expired_lease_on_a_run_is_taken_over_and_the_run_reset(
    store_db: StoreDb, pair: tuple[Store, Store]
) -> None:
    a, b = pair
    await a.save_investigation(investigation("i1"))
    claim = await a.claim_investigation("dead", _SHORT)
    assert claim is not None
    inv, lease = claim
    running = inv.model_copy(update={"state": InvestigationState.RUNNING, "reports": {"a1": None}})
    await a.save_investigation(running, lease=lease)
    await a.append_event(event("i1"), lease=lease)
    await asyncio.sleep(_SHORT * 3)
    taken = await b.claim_investigation("alive", _LEASE)
    assert taken is not None
    again, new_lease = taken
    assert new_lease == Lease("i1", "alive", lease.token + 1, taken_over_from="dead")
    assert again.state is InvestigationState.QUEUED and again.reports == {}
    assert await b.get_investigation("i1") == again
    # The dead replica's writes are refused from now on, whatever they are.
    with pytest.raises(LeaseLostError):
        await a.save_investigation(running, lease=lease)
    with pytest.raises(LeaseLostError):
        await a.append_event(event("i1", EventKind.ATTRIBUTION_READY), lease=lease)
    with pytest.raises(LeaseLostError):
        await a.record_exchange("i1", _EXCHANGE, lease=lease)
    assert not await a.renew_lease(lease, _LEASE)
    assert await b.renew_lease(new_lease, _LEASE)
    events = await b.events_after(0, investigation_id="i1")
    assert [e.kind for e in events] == [EventKind.STARTED]
    assert await b.exchanges("i1") == []
    done = again.model_copy(update={"state": InvestigationState.SUCCEEDED, "finished_at": T0})
    await b.save_investigation(done, lease=new_lease)
    assert await a.claim_investigation("a", _LEASE) is None  # finished: never claimed again
    assert verify(store_db.target).ok


async def test_the_final_record_and_its_event_are_stored_together_under_the_lease(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    await a.save_investigation(investigation("i1"))
    claim = await a.claim_investigation("a", _LEASE)
    assert claim is not None
    inv, lease = claim
    done = inv.model_copy(update={"state": InvestigationState.SUCCEEDED, "finished_at": T0})
    stale = Lease("i1", "a", lease.token - 1)
    with pytest.raises(LeaseLostError):
        await b.finish_investigation(done, event("i1", EventKind.ATTRIBUTION_READY), lease=stale)
    assert await b.events_after(0) == []
    stored = await b.finish_investigation(
        done, event("i1", EventKind.ATTRIBUTION_READY), lease=lease
    )
    assert await a.events_after(0) == [stored]
    assert await a.get_investigation("i1") == done


async def test_a_renewed_lease_is_not_taken_over(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await a.save_investigation(investigation("i1", state=InvestigationState.RUNNING))
    claim = await a.claim_investigation("a", 0.3)
    assert claim is not None
    for _ in range(4):
        await asyncio.sleep(0.1)
        assert await a.renew_lease(claim[1], 0.3)
        assert await b.claim_investigation("b", _LEASE) is None


async def test_a_lease_handed_back_is_claimable_at_once_and_only_that_is_announced(
    store_db: StoreDb, pair: tuple[Store, Store]
) -> None:
    a, b = pair
    await a.save_investigation(investigation("i1", state=InvestigationState.RUNNING))
    claim = await a.claim_investigation("a", _LEASE)
    assert claim is not None
    lease = claim[1]
    shared = store_db.name == "postgres"  # one SQLite process has no one to tell
    if shared:
        async with asyncio.timeout(10):
            await b.wait_for_change(b.change_mark())  # b listens from now on
    mark = b.change_mark()
    assert await a.renew_lease(lease, _LEASE)
    if shared:  # a renewal changes nothing the others could act on: no notification
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await b.wait_for_change(mark)
    assert await b.claim_investigation("b", _LEASE) is None
    await a.hand_back_lease(lease)
    if shared:
        async with asyncio.timeout(10):
            await b.wait_for_change(mark)
    taken = await b.claim_investigation("b", _LEASE)
    assert taken is not None and taken[1].token == lease.token + 1


async def test_a_sessions_triggers_at_two_replicas_open_one_investigation(
    pair: tuple[Store, Store],
) -> None:
    """Admission reads and writes in one transaction: of two replicas' hazards for one session
    at once, one opens the investigation and the other joins it; a hazard within the cooldown
    of a finished one joins that one; past the cooldown, a hazard opens a new one, and a Trigger
    call by the same method joins it."""
    a, b = pair
    await a.commit_ingest([session()])
    cooldown = timedelta(seconds=30)
    shares = QueueShares(capacity=16, reserved_for_rules=4, per_client=4)
    first, near = triggered("h1", 0), triggered("h2", 29, "other")
    results = await asyncio.gather(
        a.admit_investigation(first, shares.admit(first), cooldown=cooldown),
        b.admit_investigation(near, shares.admit(near), cooldown=cooldown),
    )
    assert sorted(r.admission for r in results) == [Admission.COALESCED, Admission.QUEUED]
    opened, joined = sorted(results, key=lambda r: r.admission != Admission.QUEUED)
    assert joined.investigation.investigation_id == opened.investigation.investigation_id
    (coalesced,) = joined.investigation.coalesced
    assert coalesced.state is InvestigationState.QUEUED
    assert await a.get_investigation(opened.investigation.investigation_id) == joined.investigation

    done = joined.investigation.model_copy(update={"state": _SUCCEEDED})
    await a.save_investigation(done)
    late = triggered("h3", 20, "late")
    within = await b.admit_investigation(late, shares.admit(late), cooldown=cooldown)
    assert within.admission is Admission.COALESCED
    assert [c.rule for c in within.investigation.coalesced][-1] == "late"
    assert within.investigation.coalesced[-1].state is _SUCCEEDED

    far = triggered("h4", 61)
    assert (await b.admit_investigation(far, shares.admit(far), cooldown=cooldown)).admission is (
        Admission.QUEUED
    )
    manual = investigation("m1").model_copy(update={"requested_by": "ops"})
    again = await a.admit_investigation(manual, shares.admit(manual), cooldown=cooldown)
    assert again.admission is Admission.COALESCED
    assert again.investigation.investigation_id == "h4"
    assert again.investigation.coalesced[-1].requested_by == "ops"
    other_method = investigation("m2").model_copy(update={"method": "baseline"})
    other = await a.admit_investigation(other_method, shares.admit(other_method))
    assert other.admission is Admission.QUEUED
    assert await a.count_investigations(InvestigationState.QUEUED) == 2


async def test_confirmations_through_two_replicas_each_see_the_other(
    pair: tuple[Store, Store],
) -> None:
    """Reputations are derived from the whole confirmed history in one transaction: of two
    confirmations at once, through two replicas, the later one's history holds the earlier."""
    a, b = pair
    for iid in ("i1", "i2"):
        await a.save_investigation(investigation(iid).model_copy(update={"state": _SUCCEEDED}))
    seen: list[int] = []

    def reassess(
        history: Sequence[Investigation], stored: dict[str, AgentReputation]
    ) -> list[AgentReputation]:
        seen.append(len(history))
        before = stored["doctor"].confirmations if "doctor" in stored else 0
        latest = history[-1].investigation_id
        return [
            AgentReputation(
                system="cortex",
                agent_id="doctor",
                beta=0.25,
                confirmations=before + 1,
                investigation_id=latest,
                updated_at=T0,
            )
        ]

    outcome = ConfirmedOutcome(region_ids=("exo",), decision=(1,), at=T0)
    await asyncio.gather(
        a.confirm_outcome("i1", outcome, reassess), b.confirm_outcome("i2", outcome, reassess)
    )
    assert sorted(seen) == [1, 2]
    assert (await a.reputations("cortex"))["doctor"].confirmations == 2


async def test_reserved_indexes_follow_the_stored_ones_and_never_overlap(
    pair: tuple[Store, Store],
) -> None:
    a, b = pair
    await a.commit_ingest([session(), message(0), message(7)])
    assert await a.reserve_message_indexes("s1", 2) == 8
    assert await b.reserve_message_indexes("s1", 3) == 10
    assert await a.reserve_message_indexes("s1", 1, floor=20) == 20
    await b.commit_ingest([message(40)])  # a producer's own index, stored by another replica
    assert await a.reserve_message_indexes("s1", 1) == 41
    assert await b.reserve_message_indexes("new", 1) == 0
    firsts = await asyncio.gather(
        *(store.reserve_message_indexes("s1", 5) for store in (a, b) for _ in range(10))
    )
    taken = [i for first in firsts for i in range(first, first + 5)]
    assert len(set(taken)) == len(taken) == 100
    assert min(taken) == 42
    with pytest.raises(ValueError, match="count"):
        await a.reserve_message_indexes("s1", 0)


async def test_a_schema_8_sqlite_store_gains_the_lease_columns(tmp_path: Path) -> None:
    """A store from before replicas: its investigations table without lease columns, no
    hazard_openings; opened, its unfinished investigation is claimable and fenced as a new one."""
    db = tmp_path / "poirotd.db"
    store = await SqliteStore.open(db)
    await store.save_investigation(investigation("old"))
    await store.close()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        for column in ("lease_owner", "lease_until_us", "lease_token"):
            conn.execute(f"ALTER TABLE investigations DROP COLUMN {column}")
        conn.execute("DROP TABLE hazard_openings")
        conn.execute("PRAGMA user_version = 8")
    store = await SqliteStore.open(db)
    try:
        claim = await store.claim_investigation("a", _LEASE)
        assert claim is not None and claim[1] == Lease("old", "a", 1)
        assert await store.renew_lease(claim[1], _LEASE)
        admitted = await queue(store, triggered("h1", 0))
        assert admitted.admission is Admission.QUEUED
    finally:
        await store.close()
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (store_schema.SCHEMA_VERSION,)
    assert verify(db).ok


async def test_a_wall_clock_step_does_not_end_a_sqlite_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One daemon on its file: a run's lease ends only if its heartbeat stops, not because the
    wall clock stepped (NTP setting the clock of a device that booted without one)."""
    store = await SqliteStore.open(tmp_path / "poirotd.db")
    try:
        await store.save_investigation(investigation("i1"))
        claim = await store.claim_investigation("me", _LEASE)
        assert claim is not None
        running = claim[0].model_copy(update={"state": InvestigationState.RUNNING})
        await store.save_investigation(running, lease=claim[1])
        stepped = time.time_ns() + 3600 * 10**9
        monkeypatch.setattr(time, "time_ns", lambda: stepped)
        assert await store.claim_investigation("me", _LEASE) is None
    finally:
        await store.close()
