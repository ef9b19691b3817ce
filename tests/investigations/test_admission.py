"""A hazard is never lost, over real gRPC on an in-process daemon: a rule that fires on a full
queue opens its investigation once a place frees, also across a restart on the same store file;
a trigger of a session whose investigation is open joins it; one client cannot take the queue
from the others or from the rules. The store's side on both adapters: tests/store/test_admission.py.

The LLM answers only once the test opens its gate, so that the first run holds the worker and
the queue stays as the test filled it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, motor_temp, session
from tests.support.answers import gated
from tests.support.daemon import client_of, in_process_daemon, limit_rejections
from tests.support.waiting import eventually

SPEC = clinic(rules=[OVERHEAT], hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]})
# Two places, the last kept for hazard rules; no rate limit on Trigger (the shares are tested).
SETTINGS: dict[str, Any] = {
    "queue_capacity": 2,
    "queue_reserved_for_rules": 1,
    "concurrent_investigations": 1,
    "trigger_rate_per_client": 0,
    "drain_seconds": 0.5,
}
V4, V6 = "127.0.0.1", "[::1]"


@asynccontextmanager
async def daemon_with(
    tmp_path: Path, gate: asyncio.Event, **settings: Any
) -> AsyncIterator[tuple[Daemon, PoirotClient]]:
    async with (
        in_process_daemon(tmp_path, SPEC, gated(gate), **(SETTINGS | settings)) as daemon,
        client_of(daemon) as client,
    ):
        yield daemon, client


async def of_session(client: PoirotClient, session_id: str) -> list[pb.Investigation]:
    found = await client.investigations.List(pb.ListInvestigationsRequest(session_id=session_id))
    return list(found.investigations)


async def state_becomes(client: PoirotClient, investigation_id: str, state: int) -> None:
    async def reached() -> bool:
        return (await client.get(investigation_id)).state == state

    async with asyncio.timeout(30):
        await eventually(reached)


async def hazard(client: PoirotClient, session_id: str) -> None:
    """An overheating reading: the rule fires, its investigation is admitted before the ack."""
    assert await client.send([motor_temp(1.0, 95.0, session_id)]) == 1


async def fill_the_queue(client: PoirotClient) -> pb.Investigation:
    """s1 runs (held at the gate), s2 takes the place Trigger calls may take, s3's hazard the
    place kept for rules, and s4's hazard finds the queue full; returns s4's investigation."""
    assert await client.send([r for n in range(1, 5) for r in session(3, f"s{n}")]) == 16
    running = await client.trigger("s1", "holds the worker")
    await state_becomes(client, running.investigation_id, pb.INVESTIGATION_STATE_RUNNING)
    await client.trigger("s2", "takes the place left to Trigger")
    await hazard(client, "s3")
    (queued,) = await of_session(client, "s3")
    assert queued.state == pb.INVESTIGATION_STATE_QUEUED
    await hazard(client, "s4")
    (deferred,) = await of_session(client, "s4")
    assert deferred.state == pb.INVESTIGATION_STATE_DEFERRED
    assert deferred.reason.startswith("rule exo_overheat: ") and deferred.trigger.rule
    return deferred


async def ends_attributed(client: PoirotClient, investigation_id: str) -> None:
    async with asyncio.timeout(60):
        events = [e async for e in client.watch(investigation_id)]
    assert events[-1].HasField("attribution_ready")


async def test_a_hazard_on_a_full_queue_runs_once_a_place_frees(tmp_path: Path) -> None:
    gate = asyncio.Event()
    async with daemon_with(tmp_path, gate) as (daemon, client):
        deferred = await fill_the_queue(client)
        registry = daemon.metrics.registry
        system = {"system": "clinic"}
        assert registry.get_sample_value("poirot_investigations_deferred_total", system) == 1
        wait = registry.get_sample_value("poirot_investigation_oldest_hazard_wait_seconds", system)
        assert wait is not None and wait > 0
        gate.set()
        await ends_attributed(client, deferred.investigation_id)
        for session_id in ("s1", "s2", "s3"):
            (done,) = await of_session(client, session_id)
            assert done.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert registry.get_sample_value("poirot_investigation_oldest_hazard_wait_seconds", system) == 0


async def test_a_hazard_waiting_when_the_daemon_stops_runs_after_its_restart(
    tmp_path: Path,
) -> None:
    """Stopped with the LLM held: the Trigger calls' investigations are interrupted, the rules'
    (one queued, one deferred) are kept and run once the daemon is back on its file."""
    async with daemon_with(tmp_path, asyncio.Event()) as (_, client):
        deferred = await fill_the_queue(client)
        (queued,) = await of_session(client, "s3")
    open_gate = asyncio.Event()
    open_gate.set()
    async with daemon_with(tmp_path, open_gate) as (_, client):
        for hazard_investigation in (queued, deferred):
            await ends_attributed(client, hazard_investigation.investigation_id)
        for session_id in ("s1", "s2"):
            (interrupted,) = await of_session(client, session_id)
            assert interrupted.state == pb.INVESTIGATION_STATE_INTERRUPTED


async def test_a_trigger_of_a_session_with_an_open_investigation_joins_it(
    tmp_path: Path,
) -> None:
    gate = asyncio.Event()
    async with daemon_with(tmp_path, gate) as (daemon, client):
        assert await client.send([*session(3, "s1"), *session(3, "s2")]) == 8
        running = await client.trigger("s1", "first look")
        await state_becomes(client, running.investigation_id, pb.INVESTIGATION_STATE_RUNNING)
        queued = await client.trigger("s2", "queued behind it")
        again = await client.trigger("s2", "the operator asks again")
        assert again.investigation_id == queued.investigation_id
        assert again.state == pb.INVESTIGATION_STATE_QUEUED
        await hazard(client, "s1")  # the rule finds s1's investigation running
        gate.set()
        await ends_attributed(client, queued.investigation_id)
        await ends_attributed(client, running.investigation_id)
        assert [len(await of_session(client, s)) for s in ("s1", "s2")] == [1, 1]
        joined_queued = (await client.get(queued.investigation_id)).coalesced
        assert [(c.reason, c.state, c.requested_by) for c in joined_queued] == [
            ("the operator asks again", pb.INVESTIGATION_STATE_QUEUED, "127.0.0.1")
        ]
        (joined_running,) = (await client.get(running.investigation_id)).coalesced
        assert joined_running.rule == "exo_overheat"
        assert joined_running.reason.startswith("rule exo_overheat: ")
        assert joined_running.state == pb.INVESTIGATION_STATE_RUNNING
        counted = {
            trigger: daemon.metrics.registry.get_sample_value(
                "poirot_investigations_coalesced_total", {"system": "clinic", "trigger": trigger}
            )
            for trigger in ("manual", "rule")
        }
        assert counted == {"manual": 1, "rule": 1}


async def test_one_client_cannot_take_the_whole_queue(tmp_path: Path) -> None:
    """Four places, one kept for rules, two a client: its third waiting Trigger is refused
    (joining its own queued one still works), another client takes the last place Trigger
    calls may have, and a hazard still gets the place kept for rules."""
    gate = asyncio.Event()
    settings = {"queue_capacity": 4, "max_queued_triggers_per_client": 2, "grpc_host": "localhost"}
    async with (
        daemon_with(tmp_path, gate, **settings) as (daemon, one),
        PoirotClient(f"{V6}:{daemon.grpc_port}") as other,
    ):
        assert await one.send([r for n in range(1, 8) for r in session(3, f"s{n}")]) == 28
        running = await one.trigger("s1", "holds the worker")
        await state_becomes(one, running.investigation_id, pb.INVESTIGATION_STATE_RUNNING)
        second = await one.trigger("s2", "one of its two")
        await one.trigger("s3", "two of its two")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await one.trigger("s4", "a third")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (refused.value.details() or "").startswith(
            "client 127.0.0.1 has 2 investigations queued; the limit is "
            "POIROTD_MAX_QUEUED_TRIGGERS_PER_CLIENT=2"
        )
        assert (await one.trigger("s2", "again")).investigation_id == second.investigation_id
        assert (await other.trigger("s5", "another client")).state == (
            pb.INVESTIGATION_STATE_QUEUED
        )
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await other.trigger("s6", "past the places left to Trigger")
        assert "queue is full for Trigger" in (full.value.details() or "")
        await hazard(one, "s7")
        (rules,) = await of_session(one, "s7")
        assert rules.state == pb.INVESTIGATION_STATE_QUEUED
        assert rules.requested_by == "" and second.requested_by == "127.0.0.1"
        assert limit_rejections(daemon, "too_many_queued") == 1
        assert limit_rejections(daemon, "queue_full") == 1
        gate.set()
        await ends_attributed(one, rules.investigation_id)
