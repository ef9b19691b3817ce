"""The gait session the MQTT input tests publish: its spec, the publisher, and what to count."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hwbridge import exo
from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.transports.mqtt import mqtt_input_spec
from tests.support.mosquitto import Mosquitto
from tests.support.spec import clinic

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
