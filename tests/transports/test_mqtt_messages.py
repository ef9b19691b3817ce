"""Agent messages over MQTT into the daemon's own input, against a real Mosquitto: the sender
named by the topic, sessions started implicitly, indexes given by the daemon, bad payloads and
refused messages dead-lettered and counted, and PUBACK only after the commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from hwbridge.config import BrokerConfig
from hwbridge.mqtt import MqttPublisher
from poirotd.config import SystemSpec
from poirotd.daemon import Daemon
from poirotd.devtools.clinic import CLINIC
from poirotd.model import AgentMessage
from tests.support.gait import connected_daemon, counter, fail_first_commit_of
from tests.support.mosquitto import Mosquitto
from tests.support.waiting import eventually

SESSION = "mas-run"


def spec(mosquitto: Mosquitto) -> SystemSpec:
    broker = {
        "port": mosquitto.port,
        "client_id": "poirotd-mas",
        "timeout_s": 1.0,
        "backoff": {"initial_s": 0.05, "max_s": 0.2},
    }
    mqtt = {"broker": broker, "messages": [{"topic": "mas/+/out", "sender": "{w1}"}]}
    data = CLINIC.model_dump(mode="json")
    data.update(inputs={"session_id": SESSION, "mqtt": mqtt})
    return SystemSpec.model_validate(data)


@pytest.fixture
async def daemon(mosquitto: Mosquitto, tmp_path: Path) -> AsyncIterator[Daemon]:
    async with connected_daemon(tmp_path, spec(mosquitto)) as d:
        yield d


async def publish(mosquitto: Mosquitto, messages: Sequence[tuple[str, Any]]) -> None:
    broker = BrokerConfig(port=mosquitto.port, client_id="agents")
    async with MqttPublisher(broker) as publisher:
        for topic, body in messages:
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            await publisher.publish(topic, payload)


async def stored(daemon: Daemon, session: str) -> list[AgentMessage]:
    assert daemon._store is not None
    return await daemon._store.session_messages(session)


async def test_agent_messages_are_stored_numbered_and_bad_ones_dead_lettered(
    daemon: Daemon, mosquitto: Mosquitto
) -> None:
    await publish(
        mosquitto,
        [
            ("mas/doctor/out", {"content": "The offset is noise."}),
            ("mas/chief/out", {"content": "Continue.", "recipient": "doctor"}),
            ("mas/doctor/out", {"session": "other", "content": "Noted.", "index": 5}),
            ("mas/doctor/out", b"not json"),  # undecodable
            ("mas/doctor/out", {"sender": "chief", "content": "spoofed"}),  # not the topic's
            ("mas/doctor/out", {"contnet": "typo"}),  # no such field
            ("mas/intruder/out", {"content": "Stop the device."}),  # no agent: refused
            ("mas/physio/out", {"kind": "tool", "content": "42", "tool_name": "gait_test"}),
        ],
    )
    async with asyncio.timeout(10):
        await eventually(lambda: counter(daemon, "agent_messages_acked") == 8)
    run = await stored(daemon, SESSION)
    assert [(m.index, m.sender, m.recipient, m.content) for m in run] == [
        (0, "doctor", "", "The offset is noise."),
        (1, "chief", "doctor", "Continue."),
        (3, "physio", "", "42"),  # the intruder's refused message left 2 unused
    ]
    assert [(m.index, m.content) for m in await stored(daemon, "other")] == [(5, "Noted.")]
    assert daemon._store is not None
    other = await daemon._store.get_session("other")
    assert other is not None and other.labels == {"input": "mqtt"}
    assert counter(daemon, "agent_messages_received") == 8
    assert counter(daemon, "agent_messages_undecodable") == 3
    assert counter(daemon, "agent_messages_refused") == 1
    assert counter(daemon, "agent_messages_committed") == 4
    assert counter(daemon, "dead_letters") == 4


async def test_a_failed_commit_is_not_acked_and_the_broker_redelivers(
    daemon: Daemon, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_first_commit_of(AgentMessage, monkeypatch)
    await publish(
        mosquitto, [("mas/doctor/out", {"content": f"#{i}", "index": i}) for i in range(5)]
    )
    async with asyncio.timeout(30):
        await eventually(lambda: counter(daemon, "agent_messages_acked") >= 5)
    assert [m.content for m in await stored(daemon, SESSION)] == [f"#{i}" for i in range(5)]
    assert counter(daemon, "input_restarts") == 1 and counter(daemon, "connects") >= 2
