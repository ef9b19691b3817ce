"""The gait session the MQTT input tests publish: its spec, the publisher, and what to count."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hwbridge import exo
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.answers import schema_answer
from poirotd.devtools.clinic import clinic
from poirotd.llm.scripted import ScriptedBackend
from poirotd.model import CommitItem, ItemKey
from poirotd.store import SqliteStore
from poirotd.store.idempotency import LeftOut
from poirotd.store.parked_logs import NO_PARKING, Parking
from poirotd.transports.mqtt import mqtt_input_spec
from tests.support.daemon import in_process_daemon
from tests.support.mosquitto import Mosquitto
from tests.support.waiting import eventually

# 1 s of gait at 1500 samples/s over the frame channels, one heart rate, two clinical scores.
SAMPLES = 1503


def spec(mosquitto: Mosquitto) -> SystemSpec:
    """The gRPC tests' clinic, reading the example bridge's topics into its `exo` component,
    plus a mapping whose component comes from the topic (for refusals)."""
    mqtt = yaml.safe_load(EXAMPLE.read_text())["mqtt"]
    mqtt["broker"].update(
        port=mosquitto.port,
        client_id="poirotd-under-test",
        timeout_s=1.0,
        backoff={"initial_s": 0.05, "max_s": 0.2},
    )
    for mapping in mqtt["mappings"]:
        mapping["component"] = "exo"
    mqtt["mappings"].append({"topic": "lab/+/raw", "component": "{w1}"})
    rule = {
        "name": "proprioception_implausible",
        "kind": "threshold",
        "severity": "critical",
        "component": "exo",
        "signal": "proprioception_score",
        "below": 3,
    }
    return clinic(rules=[rule], inputs={"session_id": SESSION, "mqtt": mqtt})


def counter(daemon: Daemon, name: str) -> float:
    value = daemon.metrics.registry.get_sample_value(f"poirot_mqtt_{name}_total")
    assert value is not None, name
    return value


def stored_samples(daemon: Daemon) -> int:
    return int(query(daemon, "SELECT count(*) FROM telemetry_samples")[0][0])


async def publish_gait(
    mosquitto: Mosquitto,
    extra: Sequence[tuple[str, bytes]] = (),
    broker: BrokerConfig | None = None,
) -> None:
    """One second of gait with Sensor-X, as a simulator connected by `broker` (default: the
    spec's broker, as client `simulator`)."""
    simulator = exo.ExoSimulator(exo.ExoSimConfig(rate_hz=1500, faults=(SENSOR_X,), seed=4))
    if broker is None:
        inputs = mqtt_input_spec(spec(mosquitto))
        assert inputs is not None
        broker = inputs.mqtt.broker.model_copy(update={"client_id": "simulator"})
    async with MqttPublisher(broker) as publisher:
        for topic, payload in [*exo.messages(simulator.advance(1.0), "p7"), *extra]:
            await publisher.publish(topic, payload)


EXAMPLE = Path(__file__).parents[2] / "hwbridge" / "bridge.example.yaml"

SESSION = "d2w-p7"

SENSOR_X = exo.FaultSpec(signal="proprioception_score", kind="offset", magnitude=-4)


def query(daemon: Daemon, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(daemon.settings.db_path) as db:
        return db.execute(sql).fetchall()


def fail_first_commit_of(kind: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's first commit that holds an item of `kind` raises (a disk error)."""
    commit = SqliteStore.commit_ingest
    failures = [OSError("disk I/O error")]

    async def failing_once(
        self: SqliteStore,
        items: Sequence[CommitItem],
        keys: Sequence[ItemKey | None] = (),
        parking: Parking = NO_PARKING,
    ) -> LeftOut:
        if failures and any(isinstance(item, kind) for item in items):
            raise failures.pop()
        return await commit(self, items, keys, parking)

    monkeypatch.setattr(SqliteStore, "commit_ingest", failing_once)


@contextlib.asynccontextmanager
async def connected_daemon(tmp_path: Path, system: SystemSpec) -> AsyncIterator[Daemon]:
    """An in-process daemon once its MQTT input has subscribed."""
    async with in_process_daemon(tmp_path, system, ScriptedBackend(schema_answer)) as d:
        async with asyncio.timeout(10):
            await eventually(lambda: counter(d, "connects") >= 1)
        yield d
