"""The store goes away under a running `poirotd run` (JSON logs): PostgreSQL stopped for a while
and started again, a SQLite file whose filesystem fills up. While it is gone, calls that need it
answer UNAVAILABLE (retry), never INTERNAL; health and the gauges say so; the log holds one line
when the outage begins and one when it ends, every line of it JSON; nothing acked is lost, and
what was refused is taken once the store is back.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.devtools.clinic import BRIDGE_CLINIC, CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import OVERHEAT, message, motor_temp, session, start
from poirotd.devtools.postgres import PostgresServer, server_binaries
from poirotd.devtools.process import DaemonProcess
from tests.support.answers import gated
from tests.support.daemon import client_of, in_process_daemon
from tests.support.disk import fill
from tests.support.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def spec_file(folder: Path) -> Path:
    path = folder / "clinic.yaml"
    path.write_text(yaml.safe_dump(BRIDGE_CLINIC.model_dump(mode="json", exclude_defaults=True)))
    return path


def batch(session_id: str, first: int, n: int) -> list[pb.IngestRequest]:
    return [message(i, session_id=session_id, content=f"turn {i}") for i in range(first, first + n)]


async def health(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
    return int(answer.status)


def metric(daemon: DaemonProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(daemon.metrics_url, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        for sample in (sample for family in families for sample in family.samples):
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


async def refused_with(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value.code()


def log_lines(daemon: DaemonProcess) -> list[dict[str, Any]]:
    """Every line of the daemon's log, each of which must be JSON."""
    lines = daemon.log_path.read_text().splitlines()
    assert lines
    return [json.loads(line) for line in lines]


def outage_lines(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == event and line.get("part") == "store"]


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    async with asyncio.timeout(seconds):
        await eventually(check)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, to stop and start without disturbing the session's."""
    bin_dir = server_binaries()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian package `postgresql`)")
    server = PostgresServer(bin_dir, fsync=False)
    server.start()
    yield server
    server.stop()


async def test_postgres_stopped_and_started_is_an_outage_told_once(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    url = own_postgres.create_database()
    env = {
        "POIROTD_DB_URL": url,
        "POIROTD_LOG_FORMAT": "json",
        "POIROTD_SHARED_POLL_SECONDS": "0.5",
    }
    daemon = DaemonProcess(spec_file(tmp_path), tmp_path, env=env)
    with daemon:
        async with PoirotClient(daemon.grpc_target) as client:
            assert await client.send([start("s1"), *batch("s1", 0, 4)]) == 5
            own_postgres.halt()
            lists = client.investigations.List(pb.ListInvestigationsRequest())
            assert await refused_with(lists) == grpc.StatusCode.UNAVAILABLE
            gets = client.investigations.Get(pb.GetInvestigationRequest(investigation_id="x"))
            assert await refused_with(gets) == grpc.StatusCode.UNAVAILABLE
            refused = client.send(batch("s1", 4, 4))
            assert await refused_with(refused) == grpc.StatusCode.UNAVAILABLE
            assert await health(daemon.grpc_target, "") == NOT_SERVING
            assert await health(daemon.grpc_target, "poirotd.store") == NOT_SERVING
            assert await health(daemon.grpc_target, "poirotd.llm") == SERVING
            assert metric(daemon, "poirot_store_up") == 0
            assert metric(daemon, "poirot_store_last_error", kind="connection_lost") == 1
            await asyncio.sleep(10)  # idle polls meet the stopped server: no line for each

            own_postgres.resume()
            assert await client.send(batch("s1", 4, 4)) == 4

            async def ready() -> bool:
                return bool(await health(daemon.grpc_target, "") == SERVING)

            await until(ready)
            listed = await client.investigations.List(pb.ListInvestigationsRequest())
            assert list(listed.investigations) == []
            assert metric(daemon, "poirot_store_up") == 1
        assert daemon.terminate() == 0
    with psycopg.connect(url) as conn:
        stored = conn.execute("SELECT count(*) FROM agent_messages").fetchone()
    assert stored == (8,)
    lines = log_lines(daemon)
    began, ended = outage_lines(lines, "outage began"), outage_lines(lines, "outage ended")
    assert len(began) == 1 and len(ended) == 1, [line["event"] for line in lines]
    assert began[0]["kind"] == "connection_lost"
    assert ended[0]["down_seconds"] >= 10
    assert not [line for line in lines if line["level"] == "error" and line is not began[0]]
    assert not [line for line in lines if "unreadable" in line["event"]]


async def test_a_full_disk_under_sqlite_is_an_outage_told_once(
    tmp_path: Path, small_disk: Path
) -> None:
    env = {"POIROTD_LOG_FORMAT": "json"}
    daemon = DaemonProcess(spec_file(tmp_path), small_disk, env=env)
    daemon.log_path = tmp_path / "poirotd.log"  # the log must not share the full disk
    with daemon:
        async with PoirotClient(daemon.grpc_target) as client:
            assert await client.send(session(4, "s1")) == 5
            filler = fill(small_disk)
            for first in range(4, 44, 4):  # every write refused, none a traceback
                refused = client.send(batch("s1", first, 4) * 20)
                assert await refused_with(refused) == grpc.StatusCode.UNAVAILABLE
            assert await health(daemon.grpc_target, "") == NOT_SERVING
            assert await health(daemon.grpc_target, "poirotd.store") == NOT_SERVING
            assert metric(daemon, "poirot_store_up") == 0
            assert metric(daemon, "poirot_store_last_error", kind="disk_full") == 1
            # Reads still work on a full disk: what is stored is served.
            await client.investigations.List(pb.ListInvestigationsRequest())

            filler.unlink()
            assert await client.send(batch("s1", 4, 4)) == 4

            async def ready() -> bool:
                return bool(await health(daemon.grpc_target, "") == SERVING)

            await until(ready)
            assert metric(daemon, "poirot_store_up") == 1
        assert daemon.terminate() == 0
    with sqlite3.connect(daemon.db_path) as db:
        (stored,) = db.execute("SELECT count(*) FROM agent_messages").fetchone()
    assert stored == 8
    lines = log_lines(daemon)
    began, ended = outage_lines(lines, "outage began"), outage_lines(lines, "outage ended")
    assert len(began) == 1 and len(ended) == 1, [line["event"] for line in lines]
    assert began[0]["kind"] == "disk_full"
    assert not [line for line in lines if "exception" in line]
    assert not [line for line in lines if "unreadable" in line["event"]]


async def test_a_hazard_whose_data_met_a_full_disk_is_investigated_once_it_is_stored(
    small_disk: Path,
) -> None:
    """The rule fires as the data arrives; the commit fails and the producer resends, but the
    rule's cooldown keeps it from firing again: the daemon must keep the hazard itself."""
    regions = [r.model_dump() for r in CLINIC_REGIONS]
    spec = clinic(rules=[OVERHEAT], hazard_space={"regions": regions})
    gate = asyncio.Event()  # the run waits: the test only needs the investigation opened
    async with (
        in_process_daemon(small_disk, spec, gated(gate)) as daemon,
        client_of(daemon) as client,
    ):
        assert await client.send(session(4, "s1")) == 5
        filler = fill(small_disk)
        overheat = [motor_temp(float(s), 95.0, "s1") for s in range(50)]
        assert await refused_with(client.send(overheat)) == grpc.StatusCode.UNAVAILABLE
        filler.unlink()
        assert await client.send(overheat) == len(overheat)

        async def opened() -> bool:
            found = await client.investigations.List(pb.ListInvestigationsRequest())
            return len(found.investigations) == 1

        await until(opened, 10)
        [investigation] = (
            await client.investigations.List(pb.ListInvestigationsRequest())
        ).investigations
        assert investigation.trigger.rule == "exo_overheat"
        gate.set()
