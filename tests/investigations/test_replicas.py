"""Replicas over one PostgreSQL store, in process (two daemons, real gRPC): a Watch on one sees
the other's investigation; a rule over a session whose data reaches both opens one investigation;
a replica that loses its lease stops writing; a draining replica hands its work to the others.
The fault test with processes and SIGKILL is tests/test_replicas_fault.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, motor_temp, session, start
from poirotd.llm.base import ChatMessage
from poirotd.llm.scripted import ScriptedBackend
from poirotd.store.audit import verify
from poirotd.store.pg_schema import CHAIN_LOCK
from tests.support.answers import gated
from tests.support.daemon import client_of, in_process_daemon
from tests.support.stores import PostgresDb
from tests.support.waiting import eventually

PINNED = {"regions": [r.model_dump() for r in CLINIC_REGIONS]}
_RARE = 30.0  # a poll interval longer than these tests wait


def _slow(seconds: float) -> ScriptedBackend:
    async def answer(messages: Sequence[ChatMessage], schema: dict[str, Any] | None) -> str:
        await asyncio.sleep(seconds)
        return schema_answer(messages, schema)

    return ScriptedBackend(answer)


@dataclass
class _Replica:
    daemon: Daemon
    client: PoirotClient


@asynccontextmanager
async def _replicas(
    tmp_path: Path, url: str, backends: Sequence[ScriptedBackend], **settings: Any
) -> AsyncIterator[tuple[_Replica, _Replica]]:
    """Replicas a and b on one database, each with a client; the scripted backends in turn."""
    spec = clinic(rules=[OVERHEAT], hazard_space=PINNED)
    common = {"db_url": url, "shared_poll_seconds": 0.1} | settings
    async with (
        in_process_daemon(
            _folder(tmp_path, "a"), spec, backends[0], replica_id="a", **common
        ) as first,
        in_process_daemon(
            _folder(tmp_path, "b"), spec, backends[1], replica_id="b", **common
        ) as second,
        client_of(first) as to_first,
        client_of(second) as to_second,
    ):
        yield _Replica(first, to_first), _Replica(second, to_second)


async def _running(db: PostgresDb, investigation_id: str) -> None:
    query = "SELECT state FROM investigations WHERE investigation_id = ?"

    async def running() -> bool:
        return await db.aquery(query, investigation_id) == [("running",)]

    async with asyncio.timeout(30):
        await eventually(running)


def _folder(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir(exist_ok=True)
    return tmp_path / name


async def test_a_watch_on_one_replica_sees_the_others_investigation(
    tmp_path: Path, postgres_url: str
) -> None:
    backends = [_slow(0.2), _slow(0.2)]  # a run of a few seconds, its events spread over them
    # Polls too rare to matter: the database's notifications wake the other replica.
    async with _replicas(tmp_path, postgres_url, backends, shared_poll_seconds=_RARE) as (a, b):
        to_a, to_b = a.client, b.client
        assert await to_a.send(session(3)) == 4
        watch_all = to_b.investigations.Watch(pb.WatchRequest())
        queued = await to_a.trigger("s1", "asked of a")
        events, lags = [], []
        async with asyncio.timeout(_RARE / 3):
            async for e in to_b.watch(queued.investigation_id):
                events.append(e)
                lags.append(datetime.now(UTC) - e.at.ToDatetime(tzinfo=UTC))
        # Each event reached the other replica's Watch at once, not at its idle re-read (5 s).
        assert max(lags) < timedelta(seconds=2.5), lags
        assert events[0].HasField("started") and events[-1].HasField("attribution_ready")
        seen = []
        async for event in watch_all:  # the unfiltered stream gets the same ids, in order
            seen.append(event.event_id)
            if event.event_id == events[-1].event_id:
                break
        watch_all.cancel()
        assert seen == [e.event_id for e in events]
    assert sum(len(backend.calls) > 0 for backend in backends) == 1  # one replica ran it


async def test_an_idle_replica_claims_what_a_busy_one_queued_at_once(
    tmp_path: Path, postgres_url: str
) -> None:
    backends = [_slow(0.5), _slow(0.5)]  # a run is several calls: seconds
    async with _replicas(tmp_path, postgres_url, backends, shared_poll_seconds=_RARE) as (a, b):
        assert await a.client.send([*session(3), *session(3, "s2")]) == 8
        first = await a.client.trigger("s1", "one")
        second = await a.client.trigger("s2", "two")  # s1's would join the first
        async with asyncio.timeout(_RARE / 3):
            for queued in (first, second):
                events = [e async for e in b.client.watch(queued.investigation_id)]
                assert events[-1].HasField("attribution_ready")
    # Each replica ran one, side by side: the one not woken by its own trigger was woken by the
    # database's notification (its poll would have come after the test's bound).
    assert all(backend.calls for backend in backends)


async def test_a_rule_over_data_reaching_both_replicas_opens_one_investigation(
    tmp_path: Path, postgres_url: str
) -> None:
    backends = [ScriptedBackend(schema_answer), ScriptedBackend(schema_answer)]
    async with _replicas(tmp_path, postgres_url, backends) as (a, b):
        to_a, to_b = a.client, b.client
        assert await to_a.send([start()]) == 1
        # Each replica sees half the samples, both over the threshold within the cooldown.
        hot_a = [motor_temp(i * 0.2, 75.0) for i in range(5)]
        hot_b = [motor_temp(i * 0.2 + 0.1, 80.0) for i in range(5)]
        sent = await asyncio.gather(to_a.send(hot_a), to_b.send(hot_b))
        assert list(sent) == [5, 5]
        hazards = [
            d.metrics.registry.get_sample_value(
                "poirot_hazard_events_total",
                {"system": "clinic", "rule": "exo_overheat", "severity": "critical"},
            )
            for d in (a.daemon, b.daemon)
        ]
        assert hazards == [1.0, 1.0]  # each replica's rules fired on its own data
        listed = await to_b.investigations.List(pb.ListInvestigationsRequest(session_id="s1"))
        assert len(listed.investigations) == 1


async def test_replicas_run_each_deferred_hazard_once(tmp_path: Path, postgres_url: str) -> None:
    """Both replicas' workers held, the shared queue full (two places, one kept for rules): two
    hazards are deferred. Once the LLM answers, each replica's started runs free places, and
    each deferred hazard is queued by one of them and run once."""
    gate = asyncio.Event()
    backends = [gated(gate), gated(gate)]
    shares = {"queue_capacity": 2, "queue_reserved_for_rules": 1, "trigger_rate_per_client": 0}
    db = PostgresDb(postgres_url)
    async with _replicas(tmp_path, postgres_url, backends, **shares) as (a, b):
        sessions = [f"s{n}" for n in range(1, 7)]
        assert await a.client.send([r for s in sessions for r in session(3, s)]) == 24
        for s in ("s1", "s2"):  # one run on each replica
            await _running(db, (await a.client.trigger(s, "holds a worker")).investigation_id)
        await a.client.trigger("s3", "queued")
        for s, client in (("s4", a.client), ("s5", b.client), ("s6", a.client)):
            assert await client.send([motor_temp(1.0, 90.0, s)]) == 1
        states = dict(await db.aquery("SELECT session_id, state FROM investigations"))
        assert [states[s] for s in sessions] == [
            *["running"] * 2,
            *["queued"] * 2,
            *["deferred"] * 2,
        ]
        gate.set()
        for s in sessions:
            (inv,) = (
                await b.client.investigations.List(pb.ListInvestigationsRequest(session_id=s))
            ).investigations
            async with asyncio.timeout(60):
                kinds = [e.WhichOneof("event") async for e in b.client.watch(inv.investigation_id)]
            assert kinds.count("started") == 1 and kinds[-1] == "attribution_ready", (s, kinds)
    assert verify(postgres_url).ok


async def test_a_replica_that_lost_its_lease_stops_and_writes_nothing_more(
    tmp_path: Path, postgres_url: str
) -> None:
    # Every model call waits for the gate, so the run cannot end before it is stolen (under
    # load it used to: the holder renewed its lease before the other replica's poll saw it
    # expire, and finished).
    gate = asyncio.Event()
    backends = [gated(gate), gated(gate)]
    db = PostgresDb(postgres_url)
    owner = "SELECT lease_owner FROM investigations WHERE investigation_id = ?"
    async with _replicas(tmp_path, postgres_url, backends, lease_seconds=0.6) as (a, b):
        to_a = a.client
        assert await to_a.send(session(3)) == 4
        queued = await to_a.trigger("s1", "stolen")
        iid = queued.investigation_id
        await _running(db, iid)
        (holder,) = await db.aquery(owner, iid)

        async def stolen() -> bool:
            """As if the holder had stalled past its lease: expired (again, should the holder
            have renewed it meanwhile) until another replica claims the investigation."""
            await db.aquery(
                "UPDATE investigations SET lease_until_us = 0 "
                "WHERE investigation_id = ? AND lease_owner = ? RETURNING 1",
                iid,
                holder[0],
            )
            return await db.aquery(owner, iid) != [holder]

        async with asyncio.timeout(30):
            await eventually(stolen)
        gate.set()
        events = [e async for e in to_a.watch(iid)]
        assert events[-1].HasField("attribution_ready")
        stalled, other = (a, b) if holder == ("a",) else (b, a)
        lost = stalled.daemon.metrics.registry.get_sample_value(
            "poirot_investigation_leases_lost_total", {"system": "clinic"}
        )
        taken = other.daemon.metrics.registry.get_sample_value(
            "poirot_investigations_taken_over_total", {"system": "clinic"}
        )
        assert (lost, taken) == (1.0, 1.0)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds.count("attribution_ready") == 1 and "failed" not in kinds
    assert verify(postgres_url).ok


async def test_a_draining_replica_hands_its_work_to_the_others(
    tmp_path: Path, postgres_url: str
) -> None:
    spec = clinic(hazard_space=PINNED)
    db = PostgresDb(postgres_url)
    common = {"db_url": postgres_url, "shared_poll_seconds": 0.1, "drain_seconds": 0.2}
    async with (
        in_process_daemon(_folder(tmp_path, "a"), spec, _slow(5), replica_id="a", **common) as a,
        client_of(a) as to_a,
    ):
        assert await to_a.send([*session(3), *session(3, "s2")]) == 8
        running = await to_a.trigger("s1", "runs on a")
        await _running(db, running.investigation_id)
        waiting = await to_a.trigger("s2", "still queued")
    # Neither was interrupted: the run's lease ended at once, the queued one was left queued.
    states = dict(db.query("SELECT investigation_id, state FROM investigations"))
    assert states == {running.investigation_id: "running", waiting.investigation_id: "queued"}
    async with (
        in_process_daemon(
            _folder(tmp_path, "b"), spec, ScriptedBackend(schema_answer), replica_id="b", **common
        ) as b,
        client_of(b) as to_b,
    ):
        kinds = {}
        for queued in (running, waiting):
            events = [e async for e in to_b.watch(queued.investigation_id)]
            kinds[queued.investigation_id] = [e.WhichOneof("event") for e in events]
        taken = b.metrics.registry.get_sample_value(
            "poirot_investigations_taken_over_total", {"system": "clinic"}
        )
        assert taken == 1.0  # the handed-back run, at once: the lease had ended
    rerun = kinds[running.investigation_id]
    assert rerun.count("started") == 2 and rerun[-1] == "attribution_ready"
    assert "interrupted" not in rerun
    assert kinds[waiting.investigation_id].count("started") == 1


async def test_a_worker_whose_run_cannot_reach_the_store_lives_on(
    tmp_path: Path, postgres_url: str
) -> None:
    """A run's write meets a lost connection (the server ended it): the store is unreachable,
    so the run stores no failure either; it is left to its lease (to be run again once the
    lease lapses), and the worker goes on to the next investigation."""
    db = PostgresDb(postgres_url)
    waiting = (
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND wait_event = 'advisory' AND datname = current_database()"
    )
    spec = clinic(hazard_space=PINNED)
    settings = {"db_url": postgres_url, "concurrent_investigations": 1, "lease_seconds": 60}
    async with (
        in_process_daemon(tmp_path, spec, _slow(0.5), **settings) as daemon,
        client_of(daemon) as client,
    ):
        assert await client.send(session(3)) == 4
        first = await client.trigger("s1", "meets a lost connection")
        await _running(db, first.investigation_id)

        async def blocked() -> bool:
            return bool(await db.aquery(waiting))

        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as holder:
            await holder.execute("SELECT pg_advisory_lock(%s)", (CHAIN_LOCK,))
            async with asyncio.timeout(30):  # the run's next write
                await eventually(blocked)
            await db.aquery(f"SELECT pg_terminate_backend(pid) FROM ({waiting}) AS w")
        assert await client.send(session(3, "s2")) == 4
        second = await client.trigger("s2", "runs on the same worker")
        async with asyncio.timeout(30):
            events = [e async for e in client.watch(second.investigation_id)]
        assert events[-1].HasField("attribution_ready")
        left = await client.get(first.investigation_id)
        assert left.state == pb.INVESTIGATION_STATE_RUNNING  # its lease lapses in a minute
