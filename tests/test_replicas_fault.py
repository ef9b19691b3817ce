"""Two `poirotd run` replicas on one PostgreSQL store, one killed with SIGKILL while it runs an
investigation: the other takes the investigation over once its lease expired, re-runs it and
completes it once; everything either replica acknowledged, sent through both all along, is stored.

The LLM is a scripted OpenAI-compatible server answering each schema after a delay (this test is
about orchestration, not attribution): slow enough that the kill lands mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client.parser import text_string_to_metric_families

from poirotd.api.poirot.v1 import poirot_pb2 as pb
from poirotd.client.wire import PoirotClient
from poirotd.devtools.clinic import CLINIC_REGIONS, clinic
from poirotd.devtools.ingest_requests import message, start
from poirotd.devtools.process import DaemonProcess
from poirotd.store.audit import verify
from tests.support.openai_server import ScriptedServer, schema_replies
from tests.support.stores import PostgresDb
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow

LEASE_SECONDS = 2.0
LLM_DELAY_SECONDS = 0.5
SESSION = "shared"
# Daemon-numbered messages go to a session of their own: a producer choosing indexes in the same
# session could choose one the daemon assigned (the producer's contract, poirotd.ingest.numbering).
NUMBERED = "numbered"


def _spec_file(folder: Path, llm_url: str) -> Path:
    spec = clinic(
        llm={"backend": "openai", "base_urls": [llm_url], "model": "m", "max_retries": 0},
        hazard_space={"regions": [r.model_dump() for r in CLINIC_REGIONS]},
    )
    path = folder / "clinic.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    return path


def _replica(folder: Path, spec: Path, url: str, name: str) -> DaemonProcess:
    workdir = folder / name
    workdir.mkdir()
    env = {
        "POIROTD_DB_URL": url,
        "POIROTD_REPLICA_ID": name,
        "POIROTD_LEASE_SECONDS": str(LEASE_SECONDS),
        "POIROTD_SHARED_POLL_SECONDS": "0.2",
    }
    return DaemonProcess(spec, workdir, env=env)


@dataclass
class Acked:
    """What the replicas acknowledged: message indexes, daemon-numbered contents, sample values."""

    indexes: set[int] = field(default_factory=set)
    numbered: set[str] = field(default_factory=set)
    values: set[float] = field(default_factory=set)
    batches: dict[str, int] = field(default_factory=dict)


def _sample(value: float) -> pb.IngestRequest:
    at = Timestamp()
    at.FromDatetime(datetime.now(UTC))
    return pb.IngestRequest(
        telemetry=pb.TelemetrySample(
            session_id=SESSION, component="exo", signal="motor_temp_c", value=value, measured_at=at
        )
    )


def _numbered(content: str) -> pb.IngestRequest:
    request = message(0, session_id=NUMBERED, content=content)
    request.agent_message.assign_index = True
    return request


async def _ingest(name: str, target: str, counter: itertools.count[int], acked: Acked) -> None:
    """Small batches (5 messages, 1 daemon-numbered, 10 samples) until the replica is gone;
    a batch counts as acknowledged once the whole of it was."""
    async with PoirotClient(target) as client:
        while True:
            n = next(counter)
            indexes = [1000 + 5 * n + i for i in range(5)]
            values = [float(100 * n + i) for i in range(10)]
            content = f"{name}-{n}"
            batch = [message(i, session_id=SESSION) for i in indexes]
            batch += [_numbered(content), *map(_sample, values)]
            try:
                acked_seq = await client.send(batch)
            except grpc.aio.AioRpcError:
                return  # killed (or stopped): what it had not acked is not counted
            assert acked_seq == len(batch)
            acked.indexes.update(indexes)
            acked.numbered.add(content)
            acked.values.update(values)
            acked.batches[name] = acked.batches.get(name, 0) + 1
            await asyncio.sleep(0.05)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        return sum(s.value for f in families for s in f.samples if s.name == name)


# About 40 s on a quiet 2-core box (two daemons start, a run of ~8 s, a lease of 2 s, the re-run).
@pytest.mark.timeout(600)
def test_a_killed_replicas_investigation_is_completed_once_by_the_other(
    tmp_path: Path, postgres_url: str
) -> None:
    llm = ScriptedServer(otherwise=schema_replies(LLM_DELAY_SECONDS))
    db = PostgresDb(postgres_url)
    spec = _spec_file(tmp_path, f"{llm.url}/v1")
    replicas = {name: _replica(tmp_path, spec, postgres_url, name) for name in ("a", "b")}
    try:
        for replica in replicas.values():
            replica.start()
        outcome = asyncio.run(_scenario(replicas, db))
    finally:
        for replica in replicas.values():
            replica.kill()
        llm.close()
    investigation_id, holder, survivor, acked = outcome
    logs = replicas[survivor].log_tail()

    # Completed exactly once: one succeeded write in the chain, one terminal event.
    assert db.query(
        "SELECT state, lease_owner FROM investigations WHERE investigation_id = ?",
        investigation_id,
    ) == [("succeeded", survivor)], logs
    saves = db.query(
        "SELECT payload FROM audit WHERE kind = 'investigation' AND ref = ? ORDER BY seq",
        investigation_id,
    )
    assert sum('"state":"succeeded"' in payload for (payload,) in saves) == 1
    kinds = [
        kind
        for (kind,) in db.query(
            "SELECT record::jsonb ->> 'kind' FROM events WHERE investigation_id = ?"
            " ORDER BY event_id",
            investigation_id,
        )
    ]
    assert kinds.count("attribution_ready") == 1 and kinds[-1] == "attribution_ready"
    assert kinds.count("started") == 2  # the killed run's, then the re-run's
    assert "failed" not in kinds and "interrupted" not in kinds

    # Nothing acknowledged is lost, through either replica; no daemon index was given twice.
    assert acked.batches.get(holder, 0) > 0 and acked.batches.get(survivor, 0) > 0
    stored_indexes = {i for (i,) in db.query("SELECT idx FROM agent_messages")}
    assert acked.indexes <= stored_indexes
    contents = [
        c for (c,) in db.query("SELECT content FROM agent_messages WHERE content <> 'hello'")
    ]
    assert acked.numbered <= set(contents)
    assert len(contents) == len(set(contents))
    stored_values = {v for (v,) in db.query("SELECT value FROM telemetry_samples")}
    assert acked.values <= {float(v) for v in stored_values}
    assert verify(postgres_url).ok


async def _scenario(
    replicas: dict[str, DaemonProcess], db: PostgresDb
) -> tuple[str, str, str, Acked]:
    a = replicas["a"]
    async with PoirotClient(a.grpc_target) as client:
        assert await client.send([start(SESSION), start(NUMBERED)]) == 2
        acked, counter = Acked(), itertools.count()
        senders = {
            name: asyncio.create_task(_ingest(name, r.grpc_target, counter, acked))
            for name, r in replicas.items()
        }
        queued = await client.trigger(SESSION, "fault test", method="poirot")
        investigation_id = queued.investigation_id
        holder = await _running_holder(db, investigation_id)
        await asyncio.sleep(2 * LLM_DELAY_SECONDS)  # a few LLM calls into the run
        assert db.query(
            "SELECT state FROM investigations WHERE investigation_id = ?", investigation_id
        ) == [("running",)]
        killed = replicas[holder]
        killed_at = time.monotonic()
        killed.kill()  # SIGKILL: no drain, the lease is left to expire
        assert killed.wait(timeout=30) == -signal.SIGKILL
        await senders[holder]
        survivor = "b" if holder == "a" else "a"
        await asyncio.sleep(LEASE_SECONDS)  # the survivor keeps ingesting meanwhile
    async with PoirotClient(replicas[survivor].grpc_target) as watcher:
        events = [e async for e in watcher.watch(investigation_id)]
        taken_over_after = time.monotonic() - killed_at
    senders[survivor].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await senders[survivor]
    assert events[-1].HasField("attribution_ready"), replicas[survivor].log_tail()
    assert taken_over_after >= LEASE_SECONDS
    assert _metric(replicas[survivor].metrics_url, "poirot_investigations_taken_over_total") == 1
    return investigation_id, holder, survivor, acked


async def _running_holder(db: PostgresDb, investigation_id: str) -> str:
    """The replica whose lease the investigation runs under, once it runs."""
    query = "SELECT state, lease_owner FROM investigations WHERE investigation_id = ?"
    async with asyncio.timeout(60):
        await eventually(lambda: db.query(query, investigation_id)[0][0] == "running")
    return str(db.query(query, investigation_id)[0][1])
