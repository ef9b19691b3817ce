"""Keyed telemetry over MQTT for the shared-subscription and exactly-once tests: a spec whose
input reads `plant/<device>/reading` JSON payloads numbered by `seq`, replicas of it in one share
group, and a publisher of numbered readings."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.devtools.clinic import clinic
from tests.support.mosquitto import FAST, Mosquitto

SESSION = "plant-1"
TOPIC = "plant/{device}/reading"
MESSAGES = "mas/{agent}/out"


def keyed_spec(
    mosquitto: Mosquitto, client_id: str, share_group: str | None = None, **broker: Any
) -> SystemSpec:
    """The clinic reading numbered readings into `exo` and agent messages from `mas/+/out`."""
    mqtt: dict[str, Any] = {
        "broker": {
            "port": mosquitto.port,
            "client_id": client_id,
            "timeout_s": 1.0,
            "backoff": FAST.model_dump(),
            **broker,
        },
        "mappings": [
            {
                "topic": TOPIC.format(device="+"),
                "component": "exo",
                "codec": {"kind": "json", "key_field": "seq", "timestamp_field": None},
            }
        ],
        "messages": [{"topic": MESSAGES.format(agent="+"), "sender": "{w1}"}],
    }
    if share_group is not None:
        mqtt["share_group"] = share_group
    # An OpenAI-compatible backend that is never called: `poirotd run` starts without a model.
    llm = {"backend": "openai", "base_urls": ["http://127.0.0.1:9"], "model": "none"}
    return clinic(inputs={"session_id": SESSION, "mqtt": mqtt}, llm=llm)


def reading(seq: int, base: int = 0) -> bytes:
    """Reading number `seq` of its producer: its value is base + seq, so that a copy shows as a
    repeated value (producers numbering alike take bases far apart)."""
    return json.dumps({"seq": seq, "value": float(base + seq)}).encode()


async def publish_readings(
    broker: BrokerConfig, seqs: range, device: str = "d1", qos: int = 1
) -> None:
    async with MqttPublisher(broker) as publisher:
        for seq in seqs:
            await publisher.publish(TOPIC.format(device=device), reading(seq), qos=qos)


def stored_values(db: Path) -> Counter[float]:
    """How many times each reading value is stored."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT value FROM telemetry_samples").fetchall()
    return Counter(value for (value,) in rows)
