"""The model server restarts mid-investigation (a vLLM rollout, an OOM kill): the investigation
waits, says so, keeps what it did and finishes once the server is back; a hazard that fires
meanwhile is attributed afterwards; an outage past the budget ends the run with its reason, and
a hazard's investigation is queued again and attributed once the model answers.

The model server is a process of its own (tests/support/model_process.py), killed with SIGKILL
and started again on the same port; the daemon runs in process with the real OpenAIBackend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, motor_temp, session
from poirotd.devtools.process import free_port
from tests.support.daemon import client_of, in_process_daemon
from tests.support.model_process import ModelProcess
from tests.support.waiting import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Two workers: one run waits in its calls while the other shows that nothing new starts.
SETTINGS: dict[str, Any] = {"concurrent_investigations": 2, "trigger_rate_per_client": 0}


def restart_spec(*base_urls: str, budget: float) -> SystemSpec:
    return clinic(
        llm={
            "backend": "openai",
            "base_urls": list(base_urls),
            "model": "test-model",
            "timeout_seconds": 10.0,
            "connect_timeout_seconds": 0.5,
            "backoff_seconds": 0.05,
            "backoff_max_seconds": 0.2,
            "breaker_failures": 2,
            "probe_seconds": 0.2,
            "outage_budget_seconds": budget,
        },
        protocol={"max_invocations": 2},
        rules=[OVERHEAT],
        hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]},
    )


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ModelProcess]:
    server = ModelProcess(free_port(), tmp_path / "answered")
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def restarting(
    tmp_path: Path, model: ModelProcess, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Daemon, PoirotClient]]:
    spec = restart_spec(model.url, budget=request.param)
    async with (
        in_process_daemon(tmp_path, spec, **SETTINGS) as daemon,
        client_of(daemon) as client,
    ):
        yield daemon, client


async def events_of(client: PoirotClient, investigation_id: str) -> list[pb.InvestigationEvent]:
    return [event async for event in client.watch(investigation_id)]


async def of_session(client: PoirotClient, session_id: str) -> pb.Investigation:
    found = await client.investigations.List(pb.ListInvestigationsRequest(session_id=session_id))
    [investigation] = found.investigations
    assert isinstance(investigation, pb.Investigation)
    return investigation


async def hazard(client: PoirotClient, session_id: str) -> pb.Investigation:
    """A session whose exoskeleton overheats: the rule opens its investigation."""
    await client.send([*session(4, session_id), motor_temp(1.0, 95.0, session_id)])
    async with asyncio.timeout(10):
        await eventually(lambda: _has_investigation(client, session_id))
    return await of_session(client, session_id)


async def _has_investigation(client: PoirotClient, session_id: str) -> bool:
    found = await client.investigations.List(pb.ListInvestigationsRequest(session_id=session_id))
    return bool(found.investigations)


async def killed_once_answering(model: ModelProcess, answers: int) -> int:
    """Kills the model server once it has answered `answers` calls; how many it had."""
    async with asyncio.timeout(30):
        await eventually(lambda: model.answered() >= answers)
    model.kill()
    return model.answered()


def kinds(events: list[pb.InvestigationEvent]) -> list[str]:
    return [str(event.WhichOneof("event")) for event in events]


async def health(daemon: Daemon, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
    return int(answer.status)


def gauge(daemon: Daemon, name: str, **labels: str) -> float | None:
    return daemon.metrics.registry.get_sample_value(name, labels)


@pytest.mark.parametrize("restarting", [60.0], indirect=True)
async def test_a_run_waits_out_a_model_restart_and_keeps_its_work(
    restarting: tuple[Daemon, PoirotClient], model: ModelProcess
) -> None:
    daemon, client = restarting
    await client.send(session(4, "s1"))
    queued = await client.trigger("s1", "operator saw a fall")
    watching = asyncio.ensure_future(events_of(client, queued.investigation_id))

    before = await killed_once_answering(model, 3)

    async def waits() -> bool:
        return (await client.get(queued.investigation_id)).HasField("waiting_for_model_since")

    async with asyncio.timeout(15):
        await eventually(waits)
    # A hazard fires while the model is down: its investigation is queued, and not started.
    fired = await hazard(client, "s2")
    await asyncio.sleep(1.0)
    assert (await client.get(fired.investigation_id)).state == pb.INVESTIGATION_STATE_QUEUED
    assert (await client.get(queued.investigation_id)).state == pb.INVESTIGATION_STATE_RUNNING
    # Seen: the server's gauge, and health (the daemon stays ready: it ingests meanwhile).
    assert gauge(daemon, "poirot_llm_backend_up", base_url=model.url.removesuffix("/v1")) == 0
    assert await health(daemon, "poirotd.llm") == NOT_SERVING
    assert await health(daemon, "") == SERVING

    model.start()
    async with asyncio.timeout(60):
        events = await watching
        hazard_events = await events_of(client, fired.investigation_id)

    record = await client.investigations.Get(
        pb.GetInvestigationRequest(investigation_id=queued.investigation_id, include_exchanges=True)
    )
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED, record.error
    assert not record.HasField("waiting_for_model_since")
    assert kinds(events).count("attribution_ready") == 1
    assert kinds(events).count("started") == 1
    waited = kinds(events).index("waiting_for_model")
    assert kinds(events).index("model_returned") > waited
    assert "no LLM server answers since" in events[waited].waiting_for_model.reason
    # The hazard that fired during the outage is attributed after it, once.
    hazard_record = await client.investigations.Get(
        pb.GetInvestigationRequest(investigation_id=fired.investigation_id, include_exchanges=True)
    )
    assert hazard_record.state == pb.INVESTIGATION_STATE_SUCCEEDED, hazard_record.error
    assert kinds(hazard_events).count("attribution_ready") == 1
    # The work done before the kill was kept: each call was answered once, none made again
    # (the server answered, over its two lives, exactly the calls the two records hold).
    assert all(not x.error for x in (*record.exchanges, *hazard_record.exchanges))
    answered = before + model.answered()
    assert len(record.exchanges) + len(hazard_record.exchanges) == answered
    assert gauge(daemon, "poirot_llm_backend_up", base_url=model.url.removesuffix("/v1")) == 1
    assert await health(daemon, "poirotd.llm") == SERVING


@pytest.mark.parametrize("restarting", [2.0], indirect=True)
async def test_past_the_budget_a_trigger_fails_and_a_hazard_is_queued_again(
    restarting: tuple[Daemon, PoirotClient], model: ModelProcess
) -> None:
    daemon, client = restarting
    fired = await hazard(client, "s1")
    await client.send(session(4, "s3"))
    asked = await client.trigger("s3", "operator saw a fall")
    hazard_watch = asyncio.ensure_future(events_of(client, fired.investigation_id))

    await killed_once_answering(model, 2)

    async with asyncio.timeout(30):
        failed_events = await events_of(client, asked.investigation_id)
    failed = await client.get(asked.investigation_id)
    assert failed.state == pb.INVESTIGATION_STATE_FAILED
    assert failed.error.startswith("the model was unavailable: no LLM server could serve for 2s")
    assert kinds(failed_events)[-1] == "failed"

    async def deferred_again() -> bool:
        record = await client.get(fired.investigation_id)
        return record.state == pb.INVESTIGATION_STATE_QUEUED and not record.votes

    async with asyncio.timeout(30):
        await eventually(deferred_again)
    await asyncio.sleep(1.0)  # the model is still down: nothing claims it
    assert (await client.get(fired.investigation_id)).state == pb.INVESTIGATION_STATE_QUEUED

    model.start()
    async with asyncio.timeout(60):
        events = await hazard_watch
    record = await client.get(fired.investigation_id)
    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED, record.error
    assert kinds(events).count("attribution_ready") == 1
    assert kinds(events).count("started") == 2
    deferred = events[kinds(events).index("deferred")].deferred
    assert deferred.reason.startswith("the model was unavailable: no LLM server could serve")
    assert deferred.reason.endswith("run again once it answers")
    deferrals = gauge(daemon, "poirot_investigations_deferred_total", system="clinic")
    assert deferrals == 1


async def test_with_one_of_two_servers_dead_every_call_is_answered_by_the_live_one(
    tmp_path: Path, model: ModelProcess
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    spec = restart_spec(dead, model.url, budget=60.0)
    async with in_process_daemon(tmp_path, spec) as daemon, client_of(daemon) as client:
        await client.send(session(4, "s1"))
        queued = await client.trigger("s1", "operator saw a fall")
        async with asyncio.timeout(60):
            await events_of(client, queued.investigation_id)
        record = await client.investigations.Get(
            pb.GetInvestigationRequest(
                investigation_id=queued.investigation_id, include_exchanges=True
            )
        )
        assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
        assert all(not x.error for x in record.exchanges)
        assert len(record.exchanges) == model.answered()
        assert gauge(daemon, "poirot_llm_backend_up", base_url=dead.removesuffix("/v1")) == 0
        live = model.url.removesuffix("/v1")
        assert gauge(daemon, "poirot_llm_backend_up", base_url=live) == 1
