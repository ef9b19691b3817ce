"""Admission into the investigation queue on both adapters: the places kept for hazard rules, a
client's share, a hazard deferred on a full queue and queued once a place frees (by one replica),
and coalesced triggers that a run's own writes of the record keep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from poirotd.errors import ResourceExhausted
from poirotd.investigations.admission import QueueShares
from poirotd.model import MAX_COALESCED, EventKind, Investigation, InvestigationState
from poirotd.store import Admission, Admitted, Store
from tests.support.store import T0, event, investigation, queue, session, triggered
from tests.support.stores import StoreDb

_LEASE = 30.0
_SHARES = QueueShares(capacity=3, reserved_for_rules=1, per_client=1)


@pytest.fixture
async def store(store_db: StoreDb) -> AsyncIterator[Store]:
    opened = await store_db.open()
    yield opened
    await opened.close()


def manual(iid: str, sid: str, client: str) -> Investigation:
    return investigation(iid, sid=sid).model_copy(update={"requested_by": client})


def hazard(iid: str, sid: str, seconds: float) -> Investigation:
    """A rule's investigation, opened `seconds` after T0 (also its event's time)."""
    at = T0 + timedelta(seconds=seconds)
    return triggered(iid, seconds, sid=sid).model_copy(update={"created_at": at})


async def admit(store: Store, candidate: Investigation) -> Admitted:
    return await store.admit_investigation(candidate, _SHARES.admit(candidate))


async def started(store: Store, owner: str = "me") -> Investigation:
    """Claims the oldest queued investigation and starts its run, as a worker does."""
    claim = await store.claim_investigation(owner, _LEASE)
    assert claim is not None
    running = claim[0].model_copy(update={"state": InvestigationState.RUNNING})
    await store.save_investigation(running, lease=claim[1])
    return running


async def test_triggers_keep_to_their_shares_and_a_hazard_past_the_full_queue_waits(
    store: Store,
) -> None:
    assert (await admit(store, manual("m1", "s1", "alice"))).admission is Admission.QUEUED
    with pytest.raises(ResourceExhausted, match="client alice has 1 investigations queued") as one:
        await admit(store, manual("m2", "s2", "alice"))
    assert one.value.reason == "too_many_queued"
    assert "POIROTD_MAX_QUEUED_TRIGGERS_PER_CLIENT=1" in str(one.value)
    assert (await admit(store, manual("m3", "s3", "bob"))).admission is Admission.QUEUED
    with pytest.raises(ResourceExhausted, match="queue is full for Trigger") as full:
        await admit(store, manual("m4", "s4", "carol"))
    assert full.value.reason == "queue_full"
    assert "POIROTD_QUEUE_RESERVED_FOR_RULES=1" in str(full.value)
    # The place kept for rules, then the full queue: hazards wait in the store, oldest first.
    assert (await admit(store, hazard("h1", "s5", 1))).admission is Admission.QUEUED
    assert (await admit(store, hazard("h2", "s6", 2))).admission is Admission.DEFERRED
    assert (await admit(store, hazard("h3", "s7", 3))).admission is Admission.DEFERRED
    for refused in ("m2", "m4"):
        assert await store.get_investigation(refused) is None
    waiting = await store.get_investigation("h2")
    assert waiting is not None and waiting.state is InvestigationState.DEFERRED
    assert await store.count_investigations(InvestigationState.QUEUED) == 3
    assert await store.oldest_waiting_hazard() == T0 + timedelta(seconds=1)
    assert await store.queue_deferred(_SHARES.capacity) == [], "no place yet"

    assert (await started(store)).investigation_id == "m1"
    assert [i.investigation_id for i in await store.queue_deferred(_SHARES.capacity)] == ["h2"]
    queued = await store.get_investigation("h2")
    assert queued is not None and queued.state is InvestigationState.QUEUED
    assert await store.queue_deferred(_SHARES.capacity) == []
    # A hazard arriving now waits behind the one still deferred, even with a place free.
    assert (await started(store)).investigation_id == "m3"
    assert (await admit(store, hazard("h4", "s8", 4))).admission is Admission.DEFERRED
    assert [i.investigation_id for i in await store.queue_deferred(_SHARES.capacity)] == ["h3"]
    # A manual trigger never takes what the rules' hazards need: the queue is full for it.
    with pytest.raises(ResourceExhausted, match="queue is full"):
        await admit(store, manual("m5", "s9", "dave"))


async def test_a_trigger_of_a_session_with_an_open_investigation_joins_it(store: Store) -> None:
    """A deferred, queued or running investigation by the same method is joined; the reasons
    are kept in order, at most MAX_COALESCED, the others counted."""
    await store.commit_ingest([session()])
    first = await admit(store, hazard("h1", "s1", 0))
    assert first.admission is Admission.QUEUED
    joined = await admit(store, manual("m1", "s1", "alice"))
    assert joined.admission is Admission.COALESCED
    assert joined.investigation.investigation_id == "h1"
    (coalesced,) = joined.investigation.coalesced
    assert (coalesced.reason, coalesced.rule, coalesced.requested_by) == (
        "torque spike",
        "",
        "alice",
    )
    assert coalesced.state is InvestigationState.QUEUED
    another_rule = hazard("h2", "s1", 5).model_copy(update={"reason": "rule other: hot"})
    joined = await admit(store, another_rule)
    assert [c.reason for c in joined.investigation.coalesced] == ["torque spike", "rule other: hot"]
    assert joined.investigation.coalesced[1].at == T0 + timedelta(seconds=5)
    for n in range(MAX_COALESCED):
        await admit(store, manual(f"x{n}", "s1", "bob"))
    stored = await store.get_investigation("h1")
    assert stored is not None
    assert len(stored.coalesced) == MAX_COALESCED and stored.coalesced_omitted == 2
    assert await store.count_investigations(InvestigationState.QUEUED) == 1
    # Another method is another investigation.
    baseline = manual("b1", "s1", "bob").model_copy(update={"method": "baseline"})
    assert (await admit(store, baseline)).admission is Admission.QUEUED


async def test_a_runs_own_writes_keep_the_triggers_that_joined_it(store: Store) -> None:
    """The run's copy of the record dates from its claim: its saves, and the final one, keep
    what joined the stored record since."""
    await queue(store, hazard("h1", "s1", 0))
    claim = await store.claim_investigation("me", _LEASE)
    assert claim is not None
    copy, lease = claim
    running = copy.model_copy(update={"state": InvestigationState.RUNNING})
    await store.save_investigation(running, lease=lease)
    joined = await admit(store, manual("m1", "s1", "alice"))
    assert joined.investigation.coalesced[0].state is InvestigationState.RUNNING
    await store.save_investigation(running.model_copy(update={"incident": "hot"}), lease=lease)
    stored = await store.get_investigation("h1")
    assert stored is not None and stored.incident == "hot"
    assert stored.coalesced == joined.investigation.coalesced
    done = running.model_copy(update={"state": InvestigationState.SUCCEEDED})
    await store.finish_investigation(done, event("h1", EventKind.ATTRIBUTION_READY), lease=lease)
    final = await store.get_investigation("h1")
    assert final is not None and final.state is InvestigationState.SUCCEEDED
    assert final.coalesced == joined.investigation.coalesced


async def test_replicas_freeing_places_at_once_queue_each_deferred_hazard_once(
    store_db: StoreDb,
) -> None:
    first = await store_db.open()
    second = await store_db.open() if store_db.name == "postgres" else first
    try:
        shares = QueueShares(capacity=4, reserved_for_rules=1, per_client=4)
        for n in range(10):
            candidate = hazard(f"h{n}", f"s{n}", n)
            await first.admit_investigation(candidate, shares.admit(candidate))
        assert await first.count_investigations(InvestigationState.DEFERRED) == 6
        for owner in ("a", "b", "c"):  # three runs start: their places are free
            await started(first, owner)
        results = await asyncio.gather(
            *(store.queue_deferred(shares.capacity) for store in (first, second, first, second))
        )
        queued = [inv.investigation_id for result in results for inv in result]
        assert sorted(queued) == ["h4", "h5", "h6"], "the oldest, once each"
        assert await second.count_investigations(InvestigationState.QUEUED) == 4
        assert await second.oldest_waiting_hazard() == T0 + timedelta(seconds=3)
    finally:
        await first.close()
        if second is not first:
            await second.close()
