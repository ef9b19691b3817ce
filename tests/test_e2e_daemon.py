"""The whole path on real parts: `poirotd run` as a process, real gRPC, the embedded llama.cpp
model, /metrics parsed by prometheus-client's parser, the investigation read back from SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.demo.main import demo_file, session_requests
from poirotd.devtools.process import DaemonProcess

pytestmark = pytest.mark.slow


def _spec_file(folder: Path, **protocol: object) -> Path:
    """The demo's CORTEX spec, with protocol settings trimmed to keep the test short, and
    without its MQTT input (this test streams the session and triggers over gRPC only)."""
    spec = yaml.safe_load(demo_file("cortex.yaml").read_text())
    del spec["inputs"]
    spec["protocol"] = {**spec.get("protocol", {}), **protocol}
    path = folder / "cortex.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def daemon_process(tmp_path: Path) -> Iterator[DaemonProcess]:
    """`poirotd run` as a child process on the embedded model (not the shared in-process daemon)."""
    process = DaemonProcess(_spec_file(tmp_path, max_invocations=2), tmp_path)
    process.start()
    yield process
    process.kill()


async def _stream_and_trigger(daemon: DaemonProcess, client: PoirotClient) -> str:
    requests = list(session_requests(demo_file("cortex_session.jsonl"), "e2e-1", "cortex"))
    assert await client.send(requests) == len(requests)
    return (await client.trigger("e2e-1", "end-to-end test")).investigation_id


# A full investigation on the embedded model: 85 s to 5 min on a quiet 2-core box, over 10 min
# when the box is shared with other model runs.
@pytest.mark.timeout(1800)
def test_stream_trigger_watch_scrape_and_store(daemon_process: DaemonProcess) -> None:
    async def scenario() -> tuple[str, list[pb.InvestigationEvent]]:
        async with PoirotClient(daemon_process.grpc_target) as client:
            investigation_id = await _stream_and_trigger(daemon_process, client)
            events = [e async for e in client.watch(investigation_id)]
            return investigation_id, events

    investigation_id, events = asyncio.run(scenario())
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "attribution_ready", daemon_process.log_tail()
    assert kinds.count("vote_cast") == 3
    ready = events[-1].attribution_ready
    n = len(ready.region_names)
    assert n >= 3 and len(ready.attribution.scores) == n

    with urllib.request.urlopen(daemon_process.metrics_url, timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    scores = [s for s in families["poirot_attribution_score"].samples]
    assert len(scores) == n
    assert sum(s.value for s in scores) == pytest.approx(sum(ready.attribution.scores))
    assert any(
        s.labels["outcome"] == "succeeded" and s.value == 1
        for s in families["poirot_investigations"].samples
    )
    assert families["poirot_llm_calls"].samples

    assert daemon_process.terminate() == 0
    with sqlite3.connect(daemon_process.db_path) as db:
        rows = db.execute(
            "SELECT state FROM investigations WHERE investigation_id = ?", (investigation_id,)
        ).fetchall()
        exchanges = db.execute("SELECT count(*) FROM exchanges").fetchone()[0]
    assert rows == [("succeeded",)]
    assert exchanges > 0


# 7.6 s on a quiet 2-core box; its own bounds (start 120 s, exit 60 s) come first.
@pytest.mark.timeout(600)
def test_sigterm_drains_refuses_new_work_and_exits_zero(tmp_path: Path) -> None:
    process = DaemonProcess(_spec_file(tmp_path), tmp_path, env={"POIROTD_DRAIN_SECONDS": "2"})
    process.start()
    try:

        async def scenario() -> tuple[str, int, grpc.StatusCode]:
            async with PoirotClient(process.grpc_target) as client:
                investigation_id = await _stream_and_trigger(process, client)
                async for event in client.watch(investigation_id):
                    if event.HasField("phase_begun"):
                        break
                process.signal_stop()
                health = health_pb2_grpc.HealthStub(client._channel)
                status = health_pb2.HealthCheckResponse.SERVING
                deadline = time.monotonic() + 10
                while status == health_pb2.HealthCheckResponse.SERVING:
                    assert time.monotonic() < deadline, "health never left SERVING"
                    status = (await health.Check(health_pb2.HealthCheckRequest())).status
                    await asyncio.sleep(0.02)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await client.trigger("e2e-1", "too late")
                return investigation_id, status, refused.value.code()

        investigation_id, status, code = asyncio.run(scenario())
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert code == grpc.StatusCode.UNAVAILABLE
        assert process.wait(timeout=60) == 0, process.log_tail()
    finally:
        process.kill()
    with sqlite3.connect(process.db_path) as db:
        state, error = db.execute(
            "SELECT state, json_extract(record, '$.error') FROM investigations"
            " WHERE investigation_id = ?",
            (investigation_id,),
        ).fetchone()
    assert state in ("succeeded", "interrupted")
    if state == "interrupted":
        assert "daemon stopped" in error
