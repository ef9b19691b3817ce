"""An LLM server that is slow or answers garbage, against the whole daemon (one that is down is
waited out: tests/llm/test_model_restart.py).

The real OpenAIBackend (built from the spec, as in production) talks to a small HTTP server on
loopback run by the test. Each investigation retries within its budget (2 HTTP attempts per
call, 1 answer per agent and step), then fails with the reason, or succeeds degraded when only
some agents abstain; the record, the exchanges and the metrics say why, and the daemon stays
SERVING and investigates again once the server is back.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import fill
from poirotd.devtools.clinic import CLINIC, CLINIC_AGENTS, CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import session
from poirotd.devtools.process import free_port
from poirotd.observability.metrics import Metrics
from tests.support.answers import chat_body

TIMEOUT_SECONDS = 0.3
PHYSIO_PROMPT = CLINIC.agent("physio").system_prompt
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


class ModelServer:
    """A stand-in for vLLM on the test's event loop. `mode`: ok (answers whatever schema it is
    asked for), slow (never answers), html (200 with a proxy's HTML page), physio_garbage (ok,
    but physio's structured answers are prose)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.mode = "ok"
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        # Holds slow answers until the test is over.
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()
        self._server.close()
        for connection in self._connections:
            connection.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:  # keep-alive, as httpx expects
                head = await reader.readuntil(b"\r\n\r\n")
                length = _CONTENT_LENGTH.search(head)
                body = json.loads(await reader.readexactly(int(length[1]) if length else 0))
                payload = await self._reply(body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection (it timed out, or the test is over)
        finally:
            writer.close()
            self._connections.discard(writer)

    async def _reply(self, body: dict[str, Any]) -> bytes:
        if self.mode == "slow":
            await self._stopping.wait()
        if self.mode == "html":
            return b"<html><body>502 upstream connect error</body></html>"
        schema = body.get("response_format", {}).get("json_schema", {}).get("schema")
        text = json.dumps(fill(schema)) if schema else "I saw nothing unusual."
        asker = body["messages"][0]["content"]
        if self.mode == "physio_garbage" and schema and asker.startswith(PHYSIO_PROMPT):
            text = "Sure! The knee angle looks wrong to me."
        return json.dumps(chat_body(text)).encode()


def outage_spec(url: str) -> SystemSpec:
    return clinic(
        llm={
            "backend": "openai",
            "base_urls": [url],
            "model": "test-model",
            "timeout_seconds": TIMEOUT_SECONDS,
            "connect_timeout_seconds": TIMEOUT_SECONDS,
            "max_retries": 1,
            "backoff_seconds": 0.0,
        },
        protocol={"max_invocations": 2, "invalid_json_retries": 0},
        hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]},
    )


@pytest.fixture
async def model() -> AsyncIterator[ModelServer]:
    server = ModelServer()
    yield server
    await server.stop()


@pytest.fixture
def daemon_spec(model: ModelServer) -> SystemSpec:
    return outage_spec(model.url)


@pytest.fixture
def daemon_backend() -> None:
    """The spec's own backend: the real OpenAIBackend."""


async def investigate(client: PoirotClient) -> pb.Investigation:
    queued = await client.trigger("s1", "operator saw a fall")
    assert queued.state == pb.INVESTIGATION_STATE_QUEUED
    async for _ in client.watch(queued.investigation_id):
        pass
    record: pb.Investigation = await client.investigations.Get(
        pb.GetInvestigationRequest(investigation_id=queued.investigation_id, include_exchanges=True)
    )
    return record


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def serving(daemon: Daemon) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{daemon.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.mark.parametrize(
    ("mode", "reason", "detail"),
    [
        ("slow", "timeout", f"no answer within {TIMEOUT_SECONDS}s"),
        ("html", "bad_response", "malformed completion"),
    ],
)
async def test_an_llm_outage_fails_the_investigation_with_its_reason_and_the_daemon_recovers(
    daemon: Daemon,
    client: PoirotClient,
    model: ModelServer,
    mode: str,
    reason: str,
    detail: str,
) -> None:
    model.mode = mode
    await model.start()
    await client.send(session(4))

    failed = await investigate(client)

    assert failed.state == pb.INVESTIGATION_STATE_FAILED
    assert failed.error.startswith("no agent cast a valid vote: doctor: turn 1: ")
    for agent in CLINIC_AGENTS:
        assert f"{agent}: turn 1: no valid answer in 1 attempt(s); last: " in failed.error
    assert f"LLM call failed ({reason}): LLM request failed after 2 attempt(s)" in failed.error
    assert detail in failed.error
    # One report and one turn per agent, each a call of two HTTP attempts, all failed.
    assert len(failed.exchanges) == 2 * len(CLINIC_AGENTS)
    assert all(x.error.startswith(f"{reason}: ") for x in failed.exchanges)
    assert all(v.abstention_reason for v in failed.votes)
    metrics = daemon.metrics
    calls = "poirot_llm_calls_total"
    assert sample(metrics, calls, backend="openai", outcome=reason) == 2 * len(CLINIC_AGENTS)
    assert sample(metrics, "poirot_llm_up", backend="openai") == 0
    for agent in CLINIC_AGENTS:
        votes = sample(
            metrics, "poirot_votes_total", system="clinic", agent=agent, outcome="abstained"
        )
        assert votes == 1
    finished = "poirot_investigations_total"
    assert sample(metrics, finished, system="clinic", outcome="failed", method="poirot") == 1

    # The daemon stays healthy, takes the next trigger, and succeeds once the server is back.
    assert await serving(daemon)
    model.mode = "ok"
    recovered = await investigate(client)
    assert recovered.state == pb.INVESTIGATION_STATE_SUCCEEDED
    assert recovered.degraded_reason == ""
    assert sample(metrics, "poirot_llm_up", backend="openai") == 1
    assert sample(metrics, finished, system="clinic", outcome="succeeded", method="poirot") == 1


async def test_an_agent_answering_garbage_abstains_and_the_success_is_marked_degraded(
    daemon: Daemon, client: PoirotClient, model: ModelServer
) -> None:
    model.mode = "physio_garbage"
    await model.start()
    await client.send(session(4))

    record = await investigate(client)

    assert record.state == pb.INVESTIGATION_STATE_SUCCEEDED
    physio = next(v for v in record.votes if v.agent_id == "physio")
    assert physio.abstention_reason.startswith("turn 1: no valid answer in 1 attempt(s); last: ")
    assert record.degraded_reason.startswith("physio abstained (turn 1: no valid answer")
    assert record.degraded_reason.endswith("; physio filed no valid report")
    assert json.loads(next(r.report_json for r in record.reports if r.agent_id == "doctor"))
    metrics = daemon.metrics
    abstained = sample(
        metrics, "poirot_votes_total", system="clinic", agent="physio", outcome="abstained"
    )
    assert abstained == 1
    assert sample(metrics, "poirot_investigations_degraded_total", system="clinic") == 1
    assert sample(metrics, "poirot_llm_calls_total", backend="openai", outcome="ok") == 6
    assert await serving(daemon)
